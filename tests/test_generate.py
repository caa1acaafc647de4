"""The generate entry point as a user runs it: train a tiny LM with the real task and data module, then sample
from its checkpoint in-process (load_task + sample_texts) and through `python generate.py ...`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_safe_checkpoints import compose_cli

from attnlab.checkpoints.read import read_checkpoint
from attnlab.core.errors import OptionError
from attnlab.data.lm_datamodule import LMDataModule
from attnlab.data.tokenizer import BPETokenizer
from attnlab.decoding import SamplingOptions
from attnlab.cli.generate import check_options, checkpoint_option, load_task, sample_texts
from attnlab.tasks.causal_lm import CausalLMTask
from preloaded_python import run as run_python

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The "


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained_ckpt(one_thread, tmp_path_factory, cache_dir) -> Path:
    """last.ckpt of a tiny causal LM trained for 30 steps on pydoc (vocab 512, seq_len 32, batch 8)."""
    ckpt_dir = tmp_path_factory.mktemp("gen_ckpt")
    L.seed_everything(0, workers=True)
    dm = LMDataModule(source="pydoc", vocab_size=512, seq_len=32, batch_size=8, cache_dir=cache_dir)
    net = dict(_target_="attnlab.models.causal_lm.CausalLM", vocab_size=512, d_model=32, n_layers=2,
               n_heads=2, max_len=32, dropout=0.0)
    task = CausalLMTask(net, optimizer=dict(lr=3e-3), scheduler=dict(warmup_steps=3))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=30, limit_val_batches=2, num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True)], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(task, datamodule=dm)
    ckpt = ckpt_dir / "last.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in ckpt_dir.iterdir())
    return ckpt


def run_generate(*overrides: str, cache_dir: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return run_python([sys.executable, "generate.py", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_load_task_and_sample_texts(trained_ckpt):
    task, tokenizer = load_task(trained_ckpt)
    assert isinstance(task, CausalLMTask)
    assert isinstance(tokenizer, BPETokenizer) and tokenizer.vocab_size <= 512
    assert not task.training and not task.net.training
    assert task.net.vocab_size == 512 and task.net.max_len == 32

    sampled = SamplingOptions(max_new_tokens=12, temperature=0.8, top_k=50, top_p=0.95)
    texts = sample_texts(task, tokenizer, PROMPT, sampled, num_samples=3)
    assert len(texts) == 3
    assert all(isinstance(t, str) and t.startswith(PROMPT) for t in texts)
    assert any(len(t) > len(PROMPT) for t in texts)
    # seeded: the same call gives the same texts; greedy rows are all identical
    again = sample_texts(task, tokenizer, PROMPT, sampled, num_samples=3)
    assert again == texts
    greedy = sample_texts(task, tokenizer, PROMPT, SamplingOptions(max_new_tokens=12, temperature=0.0), num_samples=2)
    assert greedy[0] == greedy[1] and greedy[0].startswith(PROMPT)
    # more tokens than the model's context (max_len 32): the window slides, cache and recompute agree
    long = SamplingOptions(max_new_tokens=50, temperature=1.0)
    long_cached = sample_texts(task, tokenizer, PROMPT, long, num_samples=2, use_cache=True)
    long_full = sample_texts(task, tokenizer, PROMPT, long, num_samples=2, use_cache=False)
    assert long_cached == long_full


def test_generate_cli_writes_samples(trained_ckpt, cache_dir, tmp_path):
    run_dir = tmp_path / "gen"
    proc = run_generate(f"ckpt={trained_ckpt}", f"prompt={PROMPT!r}", "max_new_tokens=10", "num_samples=2",
                        f"hydra.run.dir={run_dir}", cache_dir=cache_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "--- sample 0 ---" in proc.stdout and "--- sample 1 ---" in proc.stdout, out[-3000:]
    assert "--- sample 2 ---" not in proc.stdout
    # stdout is the samples only: the log line (with its colour codes) goes to stderr
    assert "\x1b[" not in proc.stdout and "samples written" not in proc.stdout.lower(), proc.stdout[-2000:]
    assert "[INFO]" not in proc.stdout and "INFO" in proc.stderr, proc.stdout[-2000:]
    samples = run_dir / "samples.txt"
    assert samples.is_file()
    text = samples.read_text()
    assert text.startswith(PROMPT)
    assert text.count("-" * 80) == 1  # two samples, one separator
    assert "ckpt_path=" not in out  # no note about the old option name


def _one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if message in line]
    assert len(lines) == 1, out[-3000:]


def test_generate_cli_missing_checkpoint(cache_dir, tmp_path):
    missing = tmp_path / "nope" / "last.ckpt"
    proc = run_generate(f"ckpt={missing}", cache_dir=cache_dir)
    _one_line_error(proc, "checkpoint not found")
    assert str(missing) in proc.stdout + proc.stderr


def test_generate_cli_not_a_language_model_checkpoint(cache_dir, tmp_path):
    """Also the old option name ckpt_path=: still accepted, with a one-line note to use ckpt=."""
    bogus = tmp_path / "bogus.ckpt"
    torch.save({"a": 1}, bogus)
    proc = run_generate(f"ckpt_path={bogus}", f"hydra.run.dir={tmp_path / 'gen'}", cache_dir=cache_dir)
    _one_line_error(proc, "not a language-model checkpoint")
    out = proc.stdout + proc.stderr
    notes = [line for line in out.splitlines() if "ckpt_path=" in line]
    assert len(notes) == 1 and "use ckpt=" in notes[0], out[-3000:]


def test_generate_cli_refuses_bad_options_in_one_line(trained_ckpt, cache_dir, tmp_path):
    """top_p=0 (which could be read as "no filter"), num_samples=0 and the other bad values: each is one line
    naming key, value and what is allowed (once through the CLI; every rule on the composed config)."""
    proc = run_generate(f"ckpt={trained_ckpt}", "top_p=0", f"hydra.run.dir={tmp_path / 'gen'}", cache_dir=cache_dir)
    _one_line_error(proc, "top_p=0 is not allowed: a number in (0, 1], or 1 / null for no nucleus filter")
    assert not (tmp_path / "gen" / "samples.txt").exists()
    for bad, words in [("top_p=1.5", "top_p=1.5"), ("num_samples=0", "num_samples=0 is not allowed: an integer >= 1"),
                       ("max_new_tokens=0", "max_new_tokens=0"), ("temperature=-1", "temperature=-1"),
                       ("top_k=-1", "top_k=-1 is not allowed: an integer >= 1, or 0 / null"),
                       ("num_samples=two", "num_samples='two'"),
                       # logits / 1e-300 overflowed into NaN probabilities; a 20-digit seed overflowed the generator
                       ("temperature=1e-300", "0 (greedy) or a number from 1e-6 to 1e6"),
                       ("seed=100000000000000000000", "seed=100000000000000000000 is not allowed")]:
        with pytest.raises(OptionError, match=re.escape(words)):
            check_options(compose_cli("generate", ["ckpt=x.ckpt", bad]))
    for fine in ("top_p=1", "top_p=null", "top_k=0", "top_k=null", "temperature=0"):
        check_options(compose_cli("generate", ["ckpt=x.ckpt", fine]))
    with pytest.raises(OptionError, match="name different checkpoints"):
        checkpoint_option(compose_cli("generate", ["ckpt=a.ckpt", "ckpt_path=b.ckpt"]))
    with pytest.raises(OptionError, match=re.escape("ckpt=null is not allowed")):
        checkpoint_option(compose_cli("generate", []))


def test_top_p_one_and_top_k_zero_mean_no_filter(trained_ckpt):
    task, tokenizer = load_task(trained_ckpt)
    kw = dict(max_new_tokens=8, temperature=1.0)
    plain = sample_texts(task, tokenizer, PROMPT, SamplingOptions(top_k=None, top_p=None, **kw), num_samples=2)
    assert sample_texts(task, tokenizer, PROMPT, SamplingOptions(top_k=0, top_p=1.0, **kw), num_samples=2) == plain


def test_trained_checkpoint_holds_plain_types_only(trained_ckpt):
    assert read_checkpoint(trained_ckpt)["task_class"].endswith("CausalLMTask")  # weights_only=True


def test_many_samples_stream_in_batches_into_samples_txt(trained_ckpt, cache_dir, tmp_path):
    """num_samples past batch_size: drawn batch by batch (never every prefix at once), every one written."""
    run_dir = tmp_path / "gen"
    proc = run_generate(f"ckpt={trained_ckpt}", "max_new_tokens=2", "num_samples=7", "batch_size=3",
                        f"hydra.run.dir={run_dir}", cache_dir=cache_dir)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.count("--- sample ") == 7 and "--- sample 6 ---" in proc.stdout
    assert (run_dir / "samples.txt").read_text().count("-" * 80) == 6


def test_progress_lines_say_how_far_and_how_long():
    import logging

    from attnlab.cli.input import Progress

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("attnlab.test_progress")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    progress = Progress(10, "samples", every_s=0.0, log=log)
    for done in (3, 6, 10):  # the last is the end: no line for it
        progress.update(done)
    lines = [r.getMessage() for r in records]
    assert [line.split(" (")[0] for line in lines] == ["samples: 3/10", "samples: 6/10"]
    assert all("/s, ~" in line and "left)" in line for line in lines)


def test_the_thread_rule_applies_to_generate_and_a_bad_value_is_one_line(trained_ckpt, cache_dir, tmp_path):
    proc = run_generate(f"ckpt={trained_ckpt}", "max_new_tokens=2", "num_samples=1", "threads=2",
                        "hydra.verbose=attnlab.cli.generate", f"hydra.run.dir={tmp_path / 'gen'}", cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch threads: 2 (threads=2)" in proc.stderr
    bad = run_generate(f"ckpt={trained_ckpt}", "threads=0", f"hydra.run.dir={tmp_path / 'gen2'}", cache_dir=cache_dir)
    _one_line_error(bad, "threads=0 is not allowed: auto (the cores other processes leave free) or a positive integer")
