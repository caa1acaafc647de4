"""`translate` reads a sentence the way training did: the checkpoint's tokenizer carries the normalization, so
"Three Hundred and Four." gets exactly the translation (and score) of the training form "three hundred and four".
A checkpoint from before normalization keeps its old behaviour (text as typed) and says so once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import compose_train
from num2words import num2words

from attnlab.runs.load import load_task
from attnlab.data.numbers import english_words
from attnlab.core.paths import ROOT
from attnlab.tasks.translation import TranslationTask
from attnlab.cli.train import run
from attnlab.cli.translate import encode_sources
from preloaded_python import run as run_python

TINY = ["debug=fast", "data.train_size=400", "data.val_size=40", "data.test_size=40", "data.max_digits=4",
        "model.net.n_layers=1", "logger=csv", "callbacks.rich_progress_bar=null", "callbacks.attention_maps=null",
        "trainer.enable_progress_bar=false", "test=false"]  # fmt: skip
NUMBERS = (4, 21, 304, 1012, 7777)
LEGACY_WARNING = "saved without a text normalizer"


def variants(n: int) -> list[str]:
    plain = english_words(n)
    return [num2words(n, lang="en"), plain[0].upper() + plain[1:], plain.upper(), plain.replace(" ", "  "),
            f"  {plain} ", plain + ".", plain.title() + "!",
            plain.replace("-", " "), plain.replace("-", " ").title() + "."]  # "twenty one", "Seventy Seven."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("mt")
    run(compose_train(TINY, out, cache_dir))
    return out / "checkpoints" / "last.ckpt"


def translate(ckpt, lines: list[str], tmp_path, cache_dir) -> subprocess.CompletedProcess:
    """translate.py as a user runs it; n_best=2 with scores, one line per batch (bit-identical computations)."""
    src = tmp_path / "input.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return run_python([sys.executable, "translate.py", f"ckpt={ckpt}", f"input={src}", "n_best=2",
                           "batch_size=1", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def hypotheses(proc: subprocess.CompletedProcess, n_inputs: int) -> list[list[tuple[str, ...]]]:
    """Per input, its (rank, score, translation) lines."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: list[list[tuple[str, ...]]] = [[] for _ in range(n_inputs)]
    for line in proc.stdout.splitlines():
        i, *rest = line.split("\t")
        out[int(i)].append(tuple(rest))
    return out


LINES = [line for n in NUMBERS for line in [english_words(n), *variants(n)]]


@pytest.fixture(scope="module")
def translated(ckpt, tmp_path_factory, cache_dir):
    """translate.py on the training forms and their variants (`LINES`), with the checkpoint as trained."""
    return translate(ckpt, LINES, tmp_path_factory.mktemp("translate"), cache_dir)


def test_variants_are_encoded_and_translated_exactly_like_the_training_form(ckpt, translated):
    task, _ = load_task(ckpt, TranslationTask, "translation")
    for n in NUMBERS:
        plain, _ = encode_sources(task, [english_words(n)])
        for v in variants(n):
            assert encode_sources(task, [v])[0].equal(plain), v

    hyps = hypotheses(translated, len(LINES))
    k = 1 + len(variants(0))
    for j, n in enumerate(NUMBERS):
        block = hyps[j * k : (j + 1) * k]
        assert all(h == block[0] for h in block), (n, block)  # same translations, same scores
    # not vacuous: the scores depend on the source
    assert len({tuple(hyps[j * k]) for j in range(len(NUMBERS))}) > 1
    assert LEGACY_WARNING not in translated.stderr


def test_a_checkpoint_without_a_stored_normalizer_keeps_working_as_before_and_warns_once(ckpt, translated, tmp_path,
                                                                                         cache_dir):
    raw = torch.load(ckpt, weights_only=True)
    tok = json.loads(raw["tokenizer"])
    tok["normalizer"] = None  # what checkpoints written before normalization hold
    raw["tokenizer"] = json.dumps(tok)
    old = tmp_path / "old.ckpt"
    torch.save(raw, old)

    # short numbers only: an upper-case line exceeds the tiny model's 32 source tokens when read byte by byte
    short = (4, 21, 304)
    lines = [line for n in short for line in (english_words(n), english_words(n).upper())]
    proc = translate(old, lines, tmp_path, cache_dir)
    old_hyps = hypotheses(proc, len(lines))
    assert proc.stderr.count(LEGACY_WARNING) == 1, proc.stderr[-3000:]
    k = 1 + len(variants(0))
    new_hyps = hypotheses(translated, len(LINES))
    new_plain, new_upper = ([new_hyps[NUMBERS.index(n) * k + d] for n in short] for d in (0, 3))
    assert LINES[NUMBERS.index(304) * k + 3] == "THREE HUNDRED AND FOUR"
    assert old_hyps[0::2] == new_plain  # the training forms: unchanged
    assert all(o != u for o, u in zip(old_hyps[1::2], new_upper))  # variants read as typed, as before
