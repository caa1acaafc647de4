"""BERT both ways: attnlab's masked language model with BERT's parts (``norm=post``, an embedding norm, token
types, the head's transform and bias) <-> ``transformers``' ``BertForMaskedLM`` (docs/weights.md).

A round trip is a property over {tied, untied} x {fp32, bf16}: no missing, unexpected or mismatched keys, logits
within 1e-5 (bf16: attnlab's model with the same rounded weights), the dtype on disk the one asked; a folder the
library wrote reads into attnlab with the library's logits and exports back bit for bit. The planted converter bugs
(the two post-norms swapped, the token type dropped) fail it. Through the entry points: a library BERT folder with
its WordPiece tokenizer starts a run (``init_from=``) whose tokenizer encodes as ``AutoTokenizer`` does (``[CLS]``
and ``[SEP]`` included) and whose export computes the same; a run trained here exports with its ``[MASK]`` row named
``<mask>`` in the folder's tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_checks import TINY
from folder_tokenizers import library_folder
from helpers import compose_train, perturbed_task, run_cli, run_entry

transformers = pytest.importorskip("transformers")

from attnlab.checkpoints import hf_layouts  # noqa: E402
from attnlab.checkpoints.exported import read_hf, write_hf  # noqa: E402
from attnlab.core.errors import OptionError  # noqa: E402

V, T = 64, 40
BERT_PARTS = ["model=masked_lm", "norm=post", "model.net.embed_norm=true", "model.net.token_types=2",
              "model.net.head_transform=gelu", "model.net.head_bias=true"]
CASES = [(tied, dtype) for tied in (True, False) for dtype in ("fp32", "bf16")]


def tiny_bert(tmp_path: Path, tied: bool = True, extra: list[str] = ()):
    """A masked LM with BERT's parts at random initialization (seeded; norms and biases moved off their start so
    that a misplaced one shows), and its checkpoint contents."""
    cfg = compose_train([*BERT_PARTS, "model.net.d_model=32", "model.net.n_heads=4", "model.net.n_layers=2",
                         f"model.net.max_len={T}", f"model.net.vocab_size={V}", "model.net.dropout=0.0",
                         f"model.net.tie_embeddings={str(tied).lower()}", *extra], tmp_path / "cfg")
    return perturbed_task(cfg)


IDS = torch.randint(0, V + 1, (3, 21), generator=torch.Generator().manual_seed(1))  # ([MASK], row V, included)


def check_bert(net, out: Path, dtype: str = "fp32") -> None:
    """The folder loads as BertForMaskedLM with every key in place and computes what ``net`` computes."""
    from safetensors import safe_open

    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    assert type(hf).__name__ == "BertForMaskedLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {{"fp32": "F32", "bf16": "BF16"}[dtype]}
    with torch.no_grad():
        diff = (net(IDS) - hf.eval()(IDS).logits).abs().max().item()
    assert diff <= 1e-5, diff


@pytest.mark.parametrize("tied, dtype", CASES)
def test_a_masked_lm_with_berts_parts_loads_as_bert_for_masked_lm(tied, dtype, tmp_path):
    task, contents = tiny_bert(tmp_path, tied)
    _, layout = write_hf(contents, tmp_path / "hf", "auto", dtype)
    assert layout == "bert"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["vocab_size"], config["tie_word_embeddings"], config["layer_norm_eps"]) == (V + 1, tied, 1e-5)
    if dtype == "bf16":
        with torch.no_grad():
            for p in task.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    check_bert(task.net, tmp_path / "hf", dtype)


PLANTED = {  # a converter bug each; the round trip must catch it
    "post_norms_swapped": lambda t: {re.sub(r"(attention\.output|(?<!attention\.)output)\.LayerNorm", lambda m: (
        "output" if m.group(1).startswith("attention") else "attention.output") + ".LayerNorm", k): v
        for k, v in t.items()},
    "token_type_dropped": lambda t: {k: torch.zeros_like(v) if "token_type" in k else v for k, v in t.items()},
}


@pytest.mark.parametrize("bug", PLANTED)
def test_each_planted_converter_bug_fails_the_round_trip(bug, tmp_path, monkeypatch):
    task, contents = tiny_bert(tmp_path)
    real = hf_layouts.hf_tensors
    monkeypatch.setattr(hf_layouts, "hf_tensors", lambda *a: PLANTED[bug](real(*a)))
    write_hf(contents, tmp_path / "hf", "bert")
    with pytest.raises(AssertionError):
        check_bert(task.net, tmp_path / "hf")


def corpus_sample() -> list[str]:
    from attnlab.data.corpus import pydoc_text

    return [pydoc_text()[:200_000]]


@pytest.mark.parametrize("tied", [True, False])
def test_a_bert_the_library_wrote_reads_into_attnlab_and_exports_back_bit_for_bit(tied, tmp_path):
    import hydra
    from safetensors.torch import load_file

    theirs = library_folder("bert", tmp_path / "library", corpus_sample(), tied=tied)
    net_cfg, state, layout = read_hf(tmp_path / "library")
    assert layout == "bert" and net_cfg["mask_id"] == 4  # (its tokenizer's [MASK])
    net = hydra.utils.instantiate(net_cfg, _convert_="all").eval()
    net.load_state_dict(state, strict=True)
    ids = torch.randint(0, theirs.config.vocab_size, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (net(ids) - theirs(ids).logits).abs().max().item() <= 1e-5
    write_hf({"hyper_parameters": {"net": net_cfg}, "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}},
             tmp_path / "again", layout)
    saved, again = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("library", "again"))
    if not tied:  # the one tensor no computation reads (the decoder has its own bias): written as the decoder's
        assert torch.equal(again["cls.predictions.bias"], saved["cls.predictions.decoder.bias"])
        saved["cls.predictions.bias"] = saved["cls.predictions.decoder.bias"]
    assert saved.keys() == again.keys() and all(torch.equal(saved[k], again[k]) for k in saved)


@pytest.mark.parametrize("extra, expected", [
    (["norm=pre"], "norm=pre (BERT normalizes after each residual: norm=post)"),
    (["model.net.embed_norm=false"], "model.net.embed_norm=false (BERT: embed_norm=true)"),
    (["model.net.token_types=0"], "model.net.token_types=0 (BERT adds token type 0: token_types=2)"),
    (["model.net.head_transform=relu"], "model.net.head_transform=relu (BERT's head uses the feed-forward's "
                                        "activation, gelu)"),
    (["model.net.head_transform=null"], "model.net.head_transform=null (BERT's head: dense, activation, norm)"),
    (["pos=rotary"], "pos=RotaryPositions (BERT: learned positions)"),
])
def test_a_masked_lm_whose_parts_do_not_fit_is_one_line_and_nothing_is_written(extra, expected, tmp_path):
    _, contents = tiny_bert(tmp_path, extra=extra)
    with pytest.raises(OptionError, match=re.escape(expected)) as e:
        write_hf(contents, tmp_path / "hf", "auto")
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


RUN = ["debug=fast", "logger=csv", "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null",
       "trainer.enable_progress_bar=false", "data.seq_len=16", "test=false"]
TEXTS = ["The for statement", "def f(x):\n    return x", "  Two  Spaces", "ünïcödé — ΟΔΟΣ", ""]


def test_a_library_bert_folder_starts_a_run_with_its_tokenizer_and_exports_the_same(tmp_path, cache_dir):
    from attnlab.runs.load import load_task

    folder = tmp_path / "bert"
    theirs = library_folder("bert", folder, corpus_sample())
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    run = tmp_path / "run"
    out = run_cli(["model=masked_lm", *RUN, f"init_from={folder}", "trainer.max_steps=1", "model.optimizer.lr=1e-12",
                   f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    task, _ = load_task(ckpt, "attnlab.tasks.base.Task", "attnlab")
    assert task.net.mask_id == auto.mask_token_id and task.net.embed.num_embeddings == theirs.config.vocab_size
    for text in TEXTS:  # [CLS] text [SEP], lowercased, as the library encodes it
        assert task.tokenizer.encode(text) == auto(text)["input_ids"], text
    ids = torch.tensor([auto("the for statement [MASK] a loop")["input_ids"]])
    with torch.no_grad():
        assert (task.net(ids) - theirs(ids).logits).abs().max().item() <= 1e-5

    back = tmp_path / "back"
    out = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={back}", "format=hf"], cache_dir)
    assert out.returncode == 0 and "the bert layout (AutoModelForMaskedLM" in out.stdout, out.stdout[-3000:]
    config, original = (json.loads((f / "config.json").read_text()) for f in (back, folder))
    assert {k: config[k] for k in ("vocab_size", "type_vocab_size", "pad_token_id")} == \
        {k: original[k] for k in ("vocab_size", "type_vocab_size", "pad_token_id")}
    again = transformers.AutoTokenizer.from_pretrained(back)
    assert (again.mask_token, again.cls_token, again.sep_token) == ("[MASK]", "[CLS]", "[SEP]") or \
        again.mask_token_id == auto.mask_token_id
    assert all(again(t)["input_ids"] == auto(t)["input_ids"] for t in TEXTS)
    check_bert(task.net, back)


def test_a_run_trained_with_berts_parts_exports_its_mask_row_as_the_tokenizers_mask_token(tmp_path, cache_dir):
    from attnlab.runs.load import load_task

    run = tmp_path / "run"
    out = run_cli([*BERT_PARTS, *TINY[1:], f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    out = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={tmp_path / 'hf'}", "format=hf"], cache_dir)
    assert out.returncode == 0 and "the bert layout" in out.stdout, out.stdout[-3000:]
    task, _ = load_task(ckpt, "attnlab.tasks.base.Task", "attnlab")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert auto.mask_token == "<mask>" and auto.mask_token_id == task.net.mask_id
    ids = auto("The for statement <mask> a loop")["input_ids"]
    assert task.net.mask_id in ids and ids == [*task.tokenizer.encode("The for statement "), task.net.mask_id,
                                               *task.tokenizer.encode(" a loop")]
    global IDS
    IDS = torch.tensor([ids])
    check_bert(task.net, tmp_path / "hf")
