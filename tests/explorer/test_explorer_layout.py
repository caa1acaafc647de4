"""What a person sees when the explorer page opens, in headless Chromium at 1400 x 900 (a laptop's window): the page
opens on the deepest layer and a content query, every layer x head fits the window at 8 and 16 heads, no axis label
is cut off unseen (each is whole, or ends in an ellipsis with the whole label in its title), and a TTS page says
which map is teacher-forced and which audio free-running.

The pages are built from an :class:`~attnlab.explorer.ExplorerRecord` of made-up maps (no model: a second or two
each); the pages of trained models are opened by test_explorer_browser.py and test_explore_cli.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.explorer import ExplorerRecord, write_page
from attnlab.plots.views import speech_view
from attnlab.tasks.protocols import AttentionSample
from browser_page import chromium, missing, open_page

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

WINDOW = dict(width=1400, height=900)
LONG = "_supercalifragilisticexpialidocious_antidisestablishmentarianism"  # wider than any label's room
SOURCE = ["_the", "_cat", LONG, *[f"_w{i}" for i in range(36)], "<eos>"]  # 40 keys: more than half the page holds
TARGET = ["<bos>", "_le", "_chat", "-", "_est", "_assis", "_sur", "_le", "_tapis", "."]


def maps(h: int, tq: int, tk: int, causal: bool = False, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, h, tq, tk, generator=g) * 2
    if causal:
        s = s.masked_fill(~torch.tril(torch.ones(tq, tk, dtype=torch.bool)), float("-inf"))
    return s.softmax(-1)


def translation_page(folder, heads: int, layers: int = 3):
    """An encoder-decoder's page: encoder, decoder and cross-attention of ``layers`` layers, ``heads`` heads."""
    m: dict[str, torch.Tensor] = {}
    for i in range(layers):
        m[f"net.encoder.layers.{i}.self_attn"] = maps(heads, len(SOURCE), len(SOURCE), seed=i)
        m[f"net.decoder.layers.{i}.self_attn"] = maps(heads, len(TARGET), len(TARGET), causal=True, seed=10 + i)
        m[f"net.decoder.layers.{i}.cross_attn"] = maps(heads, len(TARGET), len(SOURCE), seed=20 + i)
    labels = {"net.encoder": (SOURCE, SOURCE), "net.decoder": (TARGET, TARGET)}
    labels.update({n: (TARGET, SOURCE) for n in m if "cross_attn" in n})
    record = ExplorerRecord(f"translation, {heads} heads")
    record.add(0, 10, m, AttentionSample({}, TARGET, SOURCE, labels))
    return write_page(record.payload(), folder / f"translation{heads}.html")


def speech_page(folder, mode: str):
    """A TTS page as training writes it (teacher-forced maps) or as the explore entry point does (free-running)."""
    chars = [*"twenty one", "<eos>"]
    m = {f"net.decoder.layers.{i}.cross_attn": maps(4, 30, len(chars), seed=i) for i in range(3)}
    wave = torch.sin(torch.arange(1600) / 5.0) * 0.5
    record = ExplorerRecord(f"speech, {mode}")
    record.add(0, 10, m, AttentionSample({}, keys=chars),
               speech_view(0.2, wave, 16000, "'twenty one': free-running, Griffin-Lim", maps=mode))
    return write_page(record.payload(), folder / f"speech_{mode}.html")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    return {**{h: translation_page(folder, h) for h in (8, 16)},
            **{mode: speech_page(folder, mode) for mode in ("teacher-forced", "free-running")}}


# every axis label, name of the grid and token: its box, what it shows and what its title says
LABELS = """() => [...document.querySelectorAll('#heat-labels .axis, #grid .rowname, #grid .colname, .tok .t')]
    .filter((d) => d.textContent !== '')
    .map((d) => ({text: d.textContent, title: d.title || d.parentElement.title, cls: d.className,
                  ellipsis: getComputedStyle(d).textOverflow,
                  sw: d.scrollWidth, cw: d.clientWidth, sh: d.scrollHeight, ch: d.clientHeight}))"""


def test_opens_on_the_last_cross_attention_and_a_content_token(browser, pages):
    with open_page(browser, pages[8], **WINDOW) as opened:
        page = opened.page
        assert page.input_value("#module") == "net.decoder.layers.2.cross_attn"
        q = int(page.get_attribute("#readout", "data-query"))
        assert TARGET[q] not in ("<bos>", "<eos>", "-", ".") and 0 < q < len(TARGET) - 1, TARGET[q]
        assert page.eval_on_selector("#heat-labels .axis.row.current", "d => d.textContent") == TARGET[q]
        assert opened.errors == []


@pytest.mark.parametrize("heads", [8, 16])
def test_every_layer_and_head_fits_the_window(browser, pages, heads):
    with open_page(browser, pages[heads], **WINDOW) as opened:
        page = opened.page
        grid = page.eval_on_selector("#grid", "g => ({sw: g.scrollWidth, cw: g.clientWidth, "
                                              "n: g.querySelectorAll('canvas').length})")
        assert grid["n"] == 9 * (heads + 1)  # every layer's heads and their mean
        assert grid["sw"] <= grid["cw"], grid
        assert page.evaluate("() => document.documentElement.scrollWidth") <= WINDOW["width"]
        widths = page.eval_on_selector_all("#grid canvas", "cs => cs.map((c) => c.getBoundingClientRect().width)")
        assert min(widths) >= 24, widths  # still a picture, not a sliver
        assert opened.errors == []


def test_no_label_is_cut_off(browser, pages):
    with open_page(browser, pages[8], **WINDOW) as opened:
        page = opened.page
        for module, keys in (("net.decoder.layers.2.cross_attn", SOURCE), ("net.encoder.layers.0.self_attn", SOURCE)):
            page.select_option("#module", module)
            labels = page.evaluate(LABELS)
            cols = [x for x in labels if "col" in x["cls"].split()]
            assert [x["text"] for x in cols] == keys  # every key labelled: the map has the room
            for x in labels:
                whole = x["sw"] <= x["cw"] and x["sh"] <= x["ch"]
                assert whole or (x["ellipsis"] == "ellipsis" and x["title"].startswith(x["text"])), x
            (long,) = [x for x in cols if x["text"] == LONG]
            assert long["sh"] > long["ch"] and long["title"].startswith(LONG)  # cut with an ellipsis, whole on hover
            box = page.eval_on_selector("#heat-scroll", "s => ({sw: s.scrollWidth, cw: s.clientWidth})")
            assert box["sw"] <= box["cw"], box  # no column (nor its label) hidden past the box's edge
        assert opened.errors == []


def test_no_token_runs_past_its_side_in_a_narrow_window(browser, pages):
    with open_page(browser, pages[8], width=900, height=900) as opened:
        for x in opened.page.evaluate(LABELS):
            assert (x["sw"] <= x["cw"] and x["sh"] <= x["ch"]) or (
                x["ellipsis"] == "ellipsis" and x["title"].startswith(x["text"].rstrip("\u2026"))), x
        wider = opened.page.evaluate("""() => [...document.querySelectorAll('.seq')].filter((q) => !q.hidden)
            .flatMap((q) => {
                const box = q.getBoundingClientRect();
                return [...q.querySelectorAll('.tok, .tok .t')].filter((t) => {
                    const r = t.getBoundingClientRect();
                    return r.left < box.left - 0.5 || r.right > box.left + q.clientWidth + 0.5;
                }).map((t) => t.textContent);
            })""")
        assert wider == []  # every token within its side's box, none cut at its edge
        assert opened.page.evaluate("() => document.documentElement.scrollWidth") <= 900
        assert opened.errors == []


@pytest.mark.parametrize("mode", ["teacher-forced", "free-running"])
def test_a_speech_page_says_how_its_map_and_audio_were_made(browser, pages, mode):
    with open_page(browser, pages[mode], **WINDOW) as opened:
        page = opened.page
        assert page.input_value("#module") == "net.decoder.layers.2.cross_attn"  # the last (guided) layer
        assert int(page.get_attribute("#readout", "data-query")) == math.floor(29 / 2)  # a frame halfway
        assert page.is_visible("#map-mode") and mode in page.text_content("#map-mode")
        assert page.is_visible("#audio-mode") and "free-running" in page.text_content("#audio-mode")
        assert page.text_content("#heat-mode") == mode  # beside the map's title too
        if mode == "teacher-forced":  # the two come from different runs of the decoder, and the page says so
            assert "another run of the decoder" in page.text_content("#audio-mode")
        assert opened.errors == [] and opened.requests == [pages[mode].as_uri()]
