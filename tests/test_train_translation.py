"""The translation family end to end: train.py on number words (the default job), metrics, attention maps,
translation tables, checkpoints, and the `translate` entry point as a user runs it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import compose_train

from attnlab.runs.load import load_task
from attnlab.decoding import DecodingOptions
from attnlab.core.paths import ROOT
from attnlab.tasks.translation import TranslationTask
from attnlab.cli.train import run
from attnlab.cli.translate import encode_sources
from preloaded_python import run as run_python

TINY_DATA = ["data.train_size=400", "data.val_size=40", "data.test_size=40", "data.max_digits=4"]
QUIET = ["logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """A tiny run of the default model with every block group swapped and scheduled sampling on."""
    out = tmp_path_factory.mktemp("mt")
    cfg = compose_train(["debug=fast", *TINY_DATA, *QUIET, "norm=rms", "ffn=swiglu", "moe=on",
                         "model.scheduled_sampling.schedule=linear", "model.scheduled_sampling.c=0.05"],
                        out, cache_dir)
    assert cfg.model.name == "transformer_mt" and cfg.data.source == "numbers"  # the default job
    return out, run(cfg)


def cli(script: str, *args: str, stdin: str | None = None, cache_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return run_python([sys.executable, script, *args], cwd=ROOT, env=env, input=stdin, capture_output=True,
                          text=True, timeout=180)


def test_run_logs_translation_metrics_maps_and_tables(trained):
    out, metrics = trained
    for key in ("val/loss", "val/bleu", "val/chrf", "val/exact_match", "test/bleu", "test/chrf",
                "test/exact_match", "test/logprob", "train/moe/loss"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    assert 0 <= metrics["test/bleu"] <= 100 and 0 <= metrics["test/exact_match"] <= 1
    assert any(k.startswith("test/exact_match_len_") for k in metrics)
    (log,) = out.glob("csv/version_*/metrics.csv")
    ratios = [float(r["train/sampling_ratio"]) for r in csv.DictReader(open(log)) if r.get("train/sampling_ratio")]
    assert ratios and ratios[-1] > ratios[0] > 0  # the linear schedule ran (two-pass scheduled sampling)
    maps = {p.name for p in out.glob("attention_maps/epoch*/*.png")}
    assert {"net.encoder.layers.0.self_attn.png", "net.decoder.layers.0.self_attn.png", "net.decoder.layers.0.cross_attn.png"} <= maps
    (table,) = out.glob("translations/epoch*.tsv")
    rows = table.read_text().splitlines()
    assert rows[0] == "source\treference\thypothesis" and len(rows) == 1 + 8
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)  # plain types only
    assert ckpt["task_class"].endswith("TranslationTask") and "tokenizer" in ckpt


def test_translate_reads_stdin_and_writes_one_line_per_sentence(trained, cache_dir, tmp_path):
    out, _ = trained
    ckpt = out / "checkpoints" / "last.ckpt"
    proc = cli("translate.py", f"ckpt={ckpt}", f"hydra.run.dir={tmp_path}", stdin="twenty-one\nthree hundred\n",
               cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 2  # translations only: logs go to stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written into its run folder
    nbest = cli("translate.py", f"ckpt={ckpt}", "beam_size=3", "n_best=3", f"hydra.run.dir={tmp_path}",
                stdin="seven\n", cache_dir=cache_dir)
    lines = [line.split("\t") for line in nbest.stdout.splitlines()]
    assert [(r[0], r[1]) for r in lines] == [("0", "0"), ("0", "1"), ("0", "2")], nbest.stderr[-2000:]
    scores = [float(r[2]) for r in lines]
    assert scores == sorted(scores, reverse=True)
    # to a file: the log counts the lines written (3 per input line), not the input lines
    to_file = cli("translate.py", f"ckpt={ckpt}", "beam_size=3", "n_best=3", f"output={tmp_path / 'nbest.tsv'}",
                  f"hydra.run.dir={tmp_path / 'run'}", stdin="seven\neight\n", cache_dir=cache_dir)
    assert len((tmp_path / "nbest.tsv").read_text().splitlines()) == 6
    assert "6 translations (3-best of 2 lines) written" in to_file.stderr, to_file.stderr[-2000:]


def _one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and len([x for x in text.splitlines() if message in x]) == 1, text[-3000:]


def test_wrong_family_and_missing_checkpoints_get_one_line(trained, cache_dir, tmp_path):
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    gen = cli("generate.py", f"ckpt={ckpt}", f"hydra.run.dir={tmp_path}", cache_dir=cache_dir)
    _one_line_error(gen, "is a translation model checkpoint, not a language-model checkpoint; use translate.py")
    # no hydra.run.dir: the default run dir (which needs the resume_dir resolver) must resolve too
    missing = cli("translate.py", f"ckpt={tmp_path / 'none.ckpt'}", stdin="one\n", cache_dir=cache_dir)
    _one_line_error(missing, "checkpoint not found")


COPY = ["model.net.copy=true", "data.copy_names=true", "data.copy_test_size=16"]


@pytest.mark.parametrize("variant", [["model=transformer_nat"], COPY], ids=["nat", "copy"])
def test_nat_and_copy_variants_train_and_test(variant, tmp_path, cache_dir):
    cfg = compose_train(["debug=fast", *TINY_DATA, *QUIET, "callbacks.attention_maps=null", *variant], tmp_path,
                        cache_dir)
    metrics = run(cfg)
    for key in ("val/loss", "val/bleu", "test/bleu", "test/exact_match", "test/sentences_per_sec"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    if variant == ["model=transformer_nat"]:
        assert "train/length_loss" in metrics and cfg.model.decoding.test.beam_size == 3
    else:  # the copy test split (held-out names) is tested after the test split
        assert {"copy_test/loss", "copy_test/exact_match", "copy_test/name_copied"} <= set(metrics)
        assert 0 <= metrics["copy_test/name_copied"] <= 1


def test_beam_five_finds_translations_at_least_as_likely_as_greedy(trained, cache_dir):
    """Over a set of sentences (not per sentence: beam search is not monotone), with the plain sum of log-probs."""
    task, _ = load_task(trained[0] / "checkpoints" / "last.ckpt", TranslationTask, "translation")
    src, mask = encode_sources(task, ["seven", "twenty-one", "three hundred and four", "nine thousand and twelve",
                              "sixty-six", "one thousand one hundred", "forty", "eight hundred and eighty-eight"])
    greedy = task.translate_batch(src, mask, DecodingOptions(length_penalty=0.0)).logprobs[:, 0]
    beam = task.translate_batch(src, mask, DecodingOptions(beam_size=5, length_penalty=0.0)).logprobs[:, 0]
    assert beam.mean() >= greedy.mean() - 1e-5
