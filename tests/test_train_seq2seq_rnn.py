"""train.py with model=seq2seq_attention end to end (in process, tiny sizes): the RNN plugs into TranslationTask,
the `model.attention` / `model.cell` / `model.copy` shortcuts reach the net, Bahdanau maps are drawn, and block-group
overrides (norm=, ffn=, moe=) are refused with one line."""

from __future__ import annotations

import math

import pytest
from helpers import compose_train, run_cli

from attnlab.decoding import DecodingOptions
from attnlab.models.seq2seq_rnn import Seq2SeqRNN
from attnlab.runs.build import build_model
from attnlab.cli.train import run
from attnlab.cli.translate import translate_lines
from attnlab.core.errors import ConfigError
from attnlab.runs.config_tree import check_block_groups

# a few hundred number pairs, a small net, one short epoch: the plumbing, not the quality
TINY = [
    "model=seq2seq_attention", "logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
    "data.train_size=200", "data.val_size=32", "data.test_size=32", "data.batch_size=16", "data.max_digits=4",
    "model.net.d_emb=16", "model.net.d_hidden=32", "trainer.max_epochs=1",
    "trainer.num_sanity_val_steps=0", "model.decoding.test.beam_size=2",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("attention", ["none", "bahdanau"])
def test_tiny_run_trains_translates_and_tests(attention, tmp_path, cache_dir):
    cfg = compose_train([*TINY, "+trainer.limit_train_batches=4", f"model.attention={attention}"], tmp_path, cache_dir)
    assert cfg.model.net.attention == attention and cfg.data.source == "numbers"  # the model picks its data
    metrics = run(cfg)
    for key in ("train/loss", "val/loss", "val/bleu", "val/exact_match", "test/loss", "test/bleu", "test/chrf",
                "test/exact_match"):  # fmt: skip
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0 <= metrics["test/exact_match"] <= 1
    assert any(k.startswith("test/exact_match_len_") for k in metrics)  # per source-length bucket (claim E1)
    maps = sorted(p.name for p in (tmp_path / "attention_maps").glob("*/*.png"))
    if attention == "bahdanau":
        assert maps == ["net.decoder.cross_attn.png"]  # (target tokens × source tokens)
    else:
        assert maps == []  # the fixed-context baseline has no attention to draw
    (table,) = (tmp_path / "translations").glob("*.tsv")
    assert table.read_text().startswith("source\treference\thypothesis\n")


def test_shortcuts_scheduled_sampling_checkpoint_and_translate(tmp_path, cache_dir):
    from attnlab.tasks.translation import TranslationTask

    cfg = compose_train([*TINY, "model.cell=lstm", "model.attention=luong_general", "model.copy=true",
                         "+trainer.limit_train_batches=2", "test=false", "model.scheduled_sampling.schedule=linear",
                         "model.scheduled_sampling.c=0.4"], tmp_path, cache_dir)  # fmt: skip
    task = build_model(cfg.model)  # the shortcut keys are not constructor arguments of the task
    net = task.net
    assert isinstance(net, Seq2SeqRNN) and (net.cell, net.attention, net.copy) == ("lstm", "luong_general", True)
    metrics = run(cfg)
    assert metrics["train/sampling_ratio"] == pytest.approx(0.4)  # linear: ratio 0.4·step at the second step
    loaded = TranslationTask.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True).eval()
    assert (loaded.net.cell, loaded.net.attention, loaded.net.copy) == ("lstm", "luong_general", True)
    # the translate entry point's function decodes with the RNN's stepper (beam 3, 2-best)
    out = translate_lines(loaded, ["twenty-one", "three hundred and five"], DecodingOptions(beam_size=3, n_best=2))
    assert len(out) == 2 and all(len(hyps) == 2 for hyps in out)


def test_copy_without_attention_is_a_clear_error(tmp_path):
    cfg = compose_train(["model=seq2seq_attention", "model.attention=none", "model.copy=true"], tmp_path)
    with pytest.raises(Exception, match="copy=true needs an attention"):
        build_model(cfg.model)


@pytest.mark.parametrize("override", ["norm=rms", "ffn=swiglu", "moe=on", "pos=rotary"])
def test_block_groups_do_not_apply(override, tmp_path):
    cfg = compose_train(["model=seq2seq_attention", override], tmp_path)
    group = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{group}= does not apply to model=seq2seq_attention"):
        check_block_groups(cfg, [override])


@pytest.mark.slow  # a fresh interpreter importing torch and Lightning: ~20 s on the shared cores
def test_cli_refuses_norm_in_one_line(tmp_path):
    out = run_cli(["model=seq2seq_attention", "norm=rms", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stdout.splitlines() if "does not apply" in ln]
    assert len(lines) == 1 and "norm= does not apply to model=seq2seq_attention" in lines[0]
    assert "Traceback" not in out.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()
