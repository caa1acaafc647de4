"""The explorer's storage: 8-bit weights scaled per row read back within row max / 510 for every kind of row
(uniform, peaked, causal with exact zeros, long and tiny weights); token text cannot break out of the page's
script; a resumed run's page keeps the epochs it already holds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from attnlab.explorer import ExplorerRecord, dequantize, quantize, write_page
from attnlab.explorer.page import read_payload
from attnlab.tasks.protocols import AttentionSample


def rows(kind: str, h: int, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(h * 100 + t)
    if kind == "uniform":
        return torch.full((h, t, t), 1.0 / t)
    if kind == "peaked":  # a sharp softmax: one weight near 1, the rest tiny
        return (torch.randn(h, t, t, generator=g) * 12).softmax(-1)
    if kind == "causal":
        s = torch.randn(h, t, t, generator=g).masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), -1e9)
        return s.softmax(-1)
    return torch.randn(h, t, t, generator=g).softmax(-1)  # "random"


@pytest.mark.parametrize("kind, h, t", itertools.product(["uniform", "peaked", "causal", "random"], [1, 4], [1, 7, 48]))
def test_weights_read_back_within_the_row_bound(kind, h, t):
    w = rows(kind, h, t)
    back = torch.from_numpy(dequantize(quantize(w)))
    bound = w.amax(-1, keepdim=True) / 510 + 1e-7
    assert ((back - w).abs() <= bound).all()
    assert (back[w == 0] == 0).all()  # masked keys stay exactly 0 (the page counts the visible keys by them)
    entry = quantize(w)
    assert len(entry["q"]) == 4 * ((h * t * t + 2) // 3)  # one byte per weight, base64


def test_token_text_cannot_close_the_script(tmp_path):
    hostile = ["<!--", "<script>", "</script><script>document.title='x'</script>", "\u2028", "é"]
    rec = ExplorerRecord("t")
    rec.add(0, 1, {"m": torch.full((1, 1, 5, 5), 0.2)}, AttentionSample({}, hostile, hostile))
    path = write_page(rec.payload(), tmp_path / "p.html")
    html = path.read_text(encoding="utf-8")
    assert html.count("</script>") == 2  # the data's and the viewer's own
    data = html[html.index('type="application/json">'):html.index("</script>")]
    assert "<" not in data[len('type="application/json">'):]
    assert read_payload(path)["modules"][0]["queries"] == hostile


def test_a_resumed_run_keeps_its_earlier_epochs(tmp_path):
    path = tmp_path / "explorer.html"
    rec = ExplorerRecord("run")
    for epoch in range(3):
        rec.add(epoch, 10 * epoch, {"m": torch.full((1, 2, 3, 3), 1 / 3)})
    write_page(rec.payload(), path)
    resumed = ExplorerRecord.from_page(path, before_epoch=2, title="run")  # resumed inside epoch 2
    assert [e["epoch"] for e in resumed.epochs] == [0, 1]
    resumed.add(2, 25, {"m": torch.full((1, 2, 3, 3), 1 / 3)})
    assert [(e["epoch"], e["step"]) for e in resumed.epochs] == [(0, 0), (1, 10), (2, 25)]
    np.testing.assert_allclose(dequantize(resumed.epochs[0]["maps"]["m"]), 1 / 3, atol=1 / 1530)
    (tmp_path / "bad.html").write_text("not a page")
    assert not ExplorerRecord.from_page(tmp_path / "bad.html", 5) and not ExplorerRecord.from_page(tmp_path / "no", 5)


@pytest.mark.parametrize("keep, epochs", [(None, 3), (0, 2), (2, 1), (2, 4)])
def test_audio_is_kept_for_the_last_epochs_only(keep, epochs):
    """An epoch's audio note (the TTS page) is the page's largest part: only the last ``max_audio_epochs`` keep it;
    the others keep their maps and say so."""
    rec = ExplorerRecord("tts", max_audio_epochs=keep)
    for epoch in range(epochs):
        rec.add(epoch, epoch, {"m": torch.full((1, 1, 2, 2), 0.5)},
                view={"family": "speech", "epoch": {"audio": f"data:audio/wav;base64,{epoch}", "audio_caption": "x"}})
    kept = [e["epoch"] for e in rec.payload()["epochs"] if "audio" in e]
    assert kept == list(range(epochs))[len(range(epochs)) - (epochs if keep is None else min(keep, epochs)):]
    assert all("not kept" in e["audio_caption"] for e in rec.epochs if "audio" not in e)
    assert all(e["maps"] for e in rec.epochs)
