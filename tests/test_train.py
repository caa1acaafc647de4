"""train.py end to end: an in-process run, resume, DDP on CPU (single and inside -m), W&B offline per job."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from cli_checks import TINY, one_error_line
from helpers import compose_train, explorer_data, run_cli
from workspace_checks import check_leet_opens, check_sweep_workspace

from attnlab.checkpoints.read import check_run_config
from attnlab.runs.load import load_task
from attnlab.cli.train import run
from attnlab.runs.wandb_runs import offline_run_dirs, read_offline_runs

FAST = ["model=causal_lm", "debug=fast", "logger=csv"]


def read_csv_metrics(run_dir: Path) -> list[dict]:
    (path,) = run_dir.glob("csv/version_*/metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def column(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key)]


def test_fast_run_trains_checkpoints_maps_and_measures(tmp_path, cache_dir):
    cfg = compose_train(FAST + ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
                                "trainer.max_epochs=2"], tmp_path, cache_dir)
    metrics = run(cfg)
    for key in ("train/loss", "val/loss", "val/ppl", "test/loss", "test/ppl"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key]))
    assert metrics["val/ppl"] == pytest.approx(torch.exp(torch.tensor(metrics["val/loss"])).item(), rel=1e-4)
    rows = read_csv_metrics(tmp_path)
    val_loss = column(rows, "val/loss")
    assert len(val_loss) == 2 and val_loss[1] < val_loss[0]  # it learns
    assert min(column(rows, "perf/tokens_per_sec")) > 0
    assert all(0 < m < 1 for m in column(rows, "perf/mfu"))
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    maps = sorted((tmp_path / "attention_maps").glob("epoch*/*.png"))
    assert {p.name for p in maps} == {"net.decoder.layers.0.self_attn.png", "net.decoder.layers.1.self_attn.png"}
    assert len({p.parent for p in maps}) == 2  # one folder per validation epoch
    page = explorer_data(tmp_path)  # the attention explorer holds both epochs of the same maps
    assert [e["epoch"] for e in page["epochs"]] == [0, 1] and page["view"]["family"] == "tokens"
    assert {m["name"] for m in page["modules"]} == {"net.decoder.layers.0.self_attn", "net.decoder.layers.1.self_attn"}
    # attention health of the same maps, per validation epoch: entropy normalized to (0, 1], distance in tokens
    entropy = column(rows, "health.net.decoder.layers.1.self_attn/entropy")
    assert len(entropy) == 2 and all(0 < e <= 1 for e in entropy)
    assert len(column(rows, "health.net.decoder.layers.0.self_attn/distance_h1")) == 2
    # the other families' output callbacks are on by default too, and write nothing for a language model
    assert not [n for n in ("translations", "tts_samples", "confusion_matrix", "test_by_distance.json")
                if (tmp_path / n).exists()]


def test_resume_continues_step_count(tmp_path, cache_dir):
    common = FAST + ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "test=false"]
    run(compose_train(common, tmp_path / "a", cache_dir))
    first = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=True)
    assert first["global_step"] == 8 and first["epoch"] == 0
    resumed = common + [f"ckpt_path={tmp_path / 'a' / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=2"]
    run(compose_train(resumed, tmp_path / "b", cache_dir))
    second = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)
    assert second["global_step"] == 16 and second["epoch"] == 1
    assert "tokenizer" in second and second["task_class"].endswith("CausalLMTask")


@pytest.mark.slow  # the suite's 10-minute budget: tests/test_ddp_equivalence.py runs trainer=ddp_cpu through train.py by default
def test_ddp_cpu_single_run(tmp_path, cache_dir):
    out = run_cli(FAST + ["trainer=ddp_cpu", f"hydra.run.dir={tmp_path}/run"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    run_dir = tmp_path / "run"
    assert (run_dir / "ddp_rank1.log").exists()  # rank 1 really ran, in this run's directory
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "test/ppl" in out.stdout


@pytest.mark.slow  # the 10-minute budget: test_ddp_cpu_single_run and tests/test_ddp_equivalence.py run DDP by default
def test_ddp_cpu_inside_multirun_with_wandb_offline(tmp_path, cache_dir):
    """Two DDP jobs in one sweep: two job dirs, rank 1 in each, one offline W&B run per job with attention maps, which
    `wandb leet` opens and `python -m attnlab.workspace` turns into the sweep's W&B workspace."""
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", "model=causal_lm", "debug=fast", "trainer=ddp_cpu", "norm=pre,rms", f"hydra.sweep.dir={sweep}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("Launching 2 jobs") == 1  # no child re-ran the sweep
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    for job in ("0", "1"):
        job_dir = sweep / job
        assert (job_dir / "ddp_rank1.log").exists()
        runs = list((job_dir / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, runs
        images = list(runs[0].glob("files/media/images/attention/*.png"))
        assert len(images) >= 2  # one per layer
    # The run records (tags, group, config) are protobuf inside the .wandb file; their strings are stored as is.
    record = next((sweep / "1" / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    for tag in (b"causal_lm", b"norm=rms", b"ffn=gelu", b"moe=off", b"pos=learned"):
        assert tag in record
    assert b"model.net.d_model" in record  # the full config, flattened
    # the sweep's offline runs open in `wandb leet`, and its W&B workspace builds from them (tests/workspace_checks.py)
    check_leet_opens(sweep / "0")
    check_sweep_workspace(sweep, {"norm": ["norm.layer._target_"]}, n_runs=2)


def test_compile_true_trains_and_checkpoints_only_the_net(tmp_path, cache_dir):
    cfg = compose_train(FAST + ["compile=true", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
                                "test=false"], tmp_path, cache_dir)
    metrics = run(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert state and all(k.startswith("net.") for k in state)  # the compiled wrapper adds no duplicate keys


@pytest.mark.slow
def test_sweep_of_twelve_block_choices(tmp_path, cache_dir):
    """docs/sweeps_and_ddp.md's sweep: norm × ffn × moe, 12 jobs, each its own W&B offline run with attention maps."""
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", "model=causal_lm", "norm=pre,post,rms", "ffn=relu,swiglu", "moe=off,on", "debug=fast",
                   f"hydra.sweep.dir={sweep}"], cache_dir, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 12
    for job in jobs:
        (run_dir,) = (job / "wandb").glob("offline-run-*")
        assert list(run_dir.glob("files/media/images/attention/*.png"))


def test_bf16_mixed_precision_runs_on_cpu(tmp_path, cache_dir):
    cfg = compose_train(FAST + ["precision=bf16-mixed", "callbacks.rich_progress_bar=null",
                                "trainer.enable_progress_bar=false", "test=false"], tmp_path, cache_dir)
    metrics = run(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/loss"])) and metrics["val/loss"] < 6.3  # ln(512) = 6.24


def test_same_seed_same_config_same_metrics(tmp_path, cache_dir):
    common = FAST + ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
                     "callbacks.throughput=null", "callbacks.attention_maps=null"]
    first = run(compose_train(common, tmp_path / "a", cache_dir))
    second = run(compose_train(common, tmp_path / "b", cache_dir))
    for key in ("train/loss", "val/loss", "test/loss"):
        assert first[key] == second[key], key
    other = run(compose_train(common + ["seed=7"], tmp_path / "c", cache_dir))
    assert other["val/loss"] != first["val/loss"]  # the seed matters, so the equality above means something


# ----------------------------------------------------------------------------------------------------------------
# train.py as a user runs it: every logger option, one line for a NaN stop and for a bad input found inside fit
# ----------------------------------------------------------------------------------------------------------------
NO_LOGGER = [a for a in TINY if not a.startswith("logger=")]


def test_every_logger_option_trains(tmp_path, cache_dir):
    """One sweep over the `logger=` options (one interpreter start for all): every job trains and logs, here with
    another optimizer and LR schedule than the defaults (optim=sgd sched=constant), which the loggers' configs
    record."""
    try:
        import tensorboard  # noqa: F401
        options = ["wandb", "csv", "tensorboard", "none"]
    except ImportError:  # the tensorboard extra is not installed
        options = ["wandb", "csv", "none"]
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", *NO_LOGGER, "optim=sgd", "sched=constant", f"logger={','.join(options)}",
                   f"hydra.sweep.dir={sweep}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]  # a failed job makes the sweep exit 1
    written = {"wandb": "wandb/offline-run-*", "csv": "csv/version_0/metrics.csv",
               "tensorboard": "tensorboard/**/events.*"}
    for job, logger in enumerate(options):
        assert (sweep / str(job) / "metrics.json").is_file(), logger
        if logger != "none":
            assert list((sweep / str(job)).glob(written[logger])), logger
    # the chosen optimizer and schedule, as W&B's and the CSV logger's configs hold them
    sgd, constant = "torch.optim.SGD", "attnlab.optim.schedules.warmup_constant"
    (logged,) = read_offline_runs(offline_run_dirs(sweep / str(options.index("wandb"))))
    assert logged.config["optim._target_"] == sgd and logged.config["sched._target_"] == constant
    hparams = yaml.safe_load((sweep / str(options.index("csv")) / "csv/version_0/hparams.yaml").read_text())
    assert hparams["optim._target_"] == sgd and hparams["sched._target_"] == constant
    assert hparams["optim.lr"] == hparams["model.optimizer.lr"] and hparams["optim.momentum"] == 0.9
    lrs = column(read_csv_metrics(sweep / str(options.index("csv"))), "lr-SGD/pg1")  # SGD was what trained
    assert lrs and lrs[-1] == hparams["model.optimizer.lr"]  # constant after the warm-up
    # its run folder and checkpoint pass the allow-list of resume= and of the entry points that serve it
    job = sweep / str(options.index("csv"))
    check_run_config(OmegaConf.load(job / ".hydra" / "config.yaml"), job)
    task, _ = load_task(job / "checkpoints" / "last.ckpt", "attnlab.tasks.causal_lm.CausalLMTask", "language-model")
    assert task.optimizer_cfg["_target_"] == sgd and task.scheduler_cfg["_target_"] == constant
    # logger=none: the learning-rate monitor reports to a logger only: left out, with a note
    assert out.stdout.count("no logger: leaving out LearningRateMonitor") == 1


def test_wandb_online_composes_without_network(tmp_path):
    cfg = compose_train(["logger=wandb_online"], tmp_path)
    assert cfg.logger.wandb.offline is False and cfg.logger.wandb.project == "attnlab"


def test_a_nan_stop_is_one_line_naming_the_checkpoint_that_exists(tmp_path, cache_dir):
    out = run_cli([*TINY, "model.optimizer.lr=1e10", "trainer.max_steps=8", f"hydra.run.dir={tmp_path}/run"],
                  cache_dir)
    assert out.returncode == 1, out.stdout[-3000:]
    line = one_error_line(out.stdout, "non-finite")  # printed once
    # with the default callbacks nothing is saved before the end of the epoch: the message must not pretend
    assert "last good state: step 1, not saved (no checkpoint was written)" in line, line
    assert not list((tmp_path / "run").glob("checkpoints/*.ckpt"))


def test_a_bad_data_file_is_one_line_and_a_traceback_on_request(tmp_path, cache_dir):
    """The CIFAR-10 batches are read by train.py's data preflight (attnlab.runs.data_check), before Lightning is
    imported: refused with exit 2 and no folder left, the traceback added on request."""
    data = tmp_path / "cifar"
    data.mkdir()
    for name in (*[f"data_batch_{i}" for i in range(1, 6)], "test_batch", "batches.meta"):
        (data / name).write_bytes(b"not a pickle")
    args = ["model=vit", "data=cifar10", f"data.path={data}", *TINY[1:]]
    out = run_cli([*args, f"hydra.run.dir={tmp_path}/run"], cache_dir)
    assert out.returncode == 2, out.stdout[-3000:]
    one_error_line(out.stdout, f"malformed CIFAR-10 file {data}/data_batch_1")
    assert not (tmp_path / "run").exists()
    full = run_cli([*args, f"hydra.run.dir={tmp_path}/run2"], cache_dir, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 2 and "Traceback" in full.stdout and "CIFAR10FormatError" in full.stdout
    assert not (tmp_path / "run2").exists()
