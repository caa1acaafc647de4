"""Property: a deterministic CPU run stopped anywhere and continued with ``resume=auto`` equals the run straight.

"Equals": the same final weights, optimizer and LR-scheduler state and global step (bit for bit), the same training
and validation loss logged at every step, the same epoch checkpoints, the same test metrics (``metrics.json``), and
a ``job_status.json`` that describes the finished run. Stops are made by ``tests/fault_injection.py`` from inside the
run, at a Lightning hook or a checkpoint write and a global step (never by timing), with SIGKILL, SIGTERM or SIGINT.

A kill chain keeps this cheap: one run is stopped at the first point, resumed with ``resume=auto`` and stopped at
the next, ... and the last part finishes; every part runs through ``python train.py`` exactly as a user would.
The default chain stops once in each phase (mid-epoch, just after an epoch checkpoint, in a checkpoint write with
its temporary file half written, in validation, in the test after the last epoch), and uses each signal. It runs
with ``mode=max`` on ``val/loss``, so the monitored metric gets worse after epoch 0 and ``last.ckpt`` must still
advance (Lightning's own ModelCheckpoint kept it at epoch 0). ``-m slow`` adds more chains: the other signal of
each phase, stops at an epoch start and after the test, the top-k file that is superseded every epoch
(``mode=min``), and ``trainer=ddp_cpu``.

3 epochs of 6 batches: steps 1-6 are epoch 0, validation after steps 6, 12 and 18, then the test.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch
from helpers import exactly_equal, run_cli

TESTS = Path(__file__).resolve().parent
BASE = ["debug=fast", "data.train_size=48", "data.val_size=16", "data.test_size=16", "trainer.limit_train_batches=1.0",
        "trainer.limit_val_batches=2", "trainer.max_epochs=3", "trainer.log_every_n_steps=1", "logger=csv",
        "model.net.dropout=0.1", "trainer.deterministic=true", "callbacks.attention_maps=null",
        "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
        "+callbacks.fault._target_=fault_injection.Fault"]


def point(hook: str, signal: str, step: int | None = None, file: str | None = None, rc: int = 0,
          times: int = 1) -> dict:
    spec = {"hook": hook, "signal": signal, "rc": rc, "times": times}
    if step is not None:
        spec["step"] = step
    if file is not None:
        spec["file"] = file
    return spec


KILLED = -9  # subprocess's return code for SIGKILL
# SIGTERM/SIGINT in training: a checkpoint at the next step boundary (or, in an epoch's last step or validation, at
# that epoch's end), exit 0 / 130; in the test: stop after that test batch, exit 0 / 130, no metrics.json. Either
# way job_status.json says "interrupted" until a resumed part finishes.
DEFAULT = [
    point("on_train_batch_end", "SIGTERM", step=2),  # mid-epoch: preemption checkpoint after step 3
    point("after_save", "SIGKILL", step=6, file="last.ckpt", rc=KILLED),  # just after an epoch checkpoint
    point("on_validation_end", "SIGINT", step=12, rc=130, times=2),  # Ctrl+C twice once the epoch is validated
    point("during_save", "SIGKILL", step=18, file="last.ckpt", rc=KILLED),  # last.ckpt's temp file half written
    point("on_fit_end", "SIGTERM", step=18),  # trained, before the test
    point("on_test_batch_end", "SIGTERM"),  # in the test, after the last epoch
]
SLOW = {
    "other_signals": [
        point("on_train_batch_end", "SIGINT", step=8, rc=130),  # (a kill before the first checkpoint: nothing to resume)
        point("on_train_batch_end", "SIGKILL", step=10, rc=KILLED),  # mid-epoch: steps 10 and up are done again
        point("on_validation_batch_end", "SIGTERM", step=12),
        point("on_train_epoch_start", "SIGKILL", step=12, rc=KILLED),
        point("on_validation_batch_end", "SIGINT", step=18, rc=130),  # in the last epoch's validation
        point("on_test_batch_end", "SIGINT", rc=130),
        point("on_fit_end", "SIGKILL", step=18, rc=KILLED),  # trained, before the test
    ],
    "topk_superseded": [
        point("after_save", "SIGKILL", step=6, file="last.ckpt", rc=KILLED),
        point("after_save", "SIGKILL", step=12, file="last.ckpt", rc=KILLED),
        point("on_validation_batch_end", "SIGKILL", step=18, rc=KILLED),
    ],
}
MODE = {"topk_superseded": "min"}


def _run(base: list[str], log_dir: Path, cache_dir: str, fault: dict | None = None, resume: bool = False,
         env: dict[str, str] | None = None):
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    if fault:
        env["ATTNLAB_FAULT"] = json.dumps({k: v for k, v in fault.items() if k != "rc"})
    args = [*base, f"paths.log_dir={log_dir}", *(["resume=auto"] if resume else [])]
    return run_cli(args, cache_dir, env=env)


def _only_run(log_dir: Path) -> Path:
    (run,) = (log_dir / "debug" / "runs").iterdir()
    return run


def _logged(run: Path) -> dict[str, dict[int, float]]:
    """Every logged training and validation loss by step, over all parts' CSV files; a step logged twice (by a
    stopped part and the part that redid it) must have the same value."""
    out: dict[str, dict[int, float]] = {"train/loss": {}, "val/loss": {}}
    for f in sorted(run.glob("csv/version_*/metrics.csv")):
        with open(f) as fh:
            for row in csv.DictReader(fh):
                for key, by_step in out.items():
                    if row.get(key):
                        step, value = int(row["step"]), float(row[key])
                        assert by_step.setdefault(step, value) == value, f"{key} at step {step} logged twice, differing"
    return out


def _untimed(path: Path) -> dict[str, float]:
    """metrics.json without the speed measurements (sentences per second, step time: wall-clock)."""
    return {k: v for k, v in json.loads(path.read_text()).items() if "per_sec" not in k and not k.startswith("perf/")}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache_dir):
    """The straight run of a checkpoint mode, made once and shared by every chain of that mode."""
    runs: dict[str, Path] = {}

    def get(mode: str, extra: tuple[str, ...] = ()) -> Path:
        key = mode + " ".join(extra)
        if key not in runs:
            log_dir = tmp_path_factory.mktemp(f"straight_{mode}")
            r = _run([*BASE, f"callbacks.model_checkpoint.mode={mode}", *extra], log_dir, cache_dir)
            assert r.returncode == 0, r.stdout[-3000:]
            runs[key] = _only_run(log_dir)
        return runs[key]

    return get


def _check_chain(chain: list[dict], mode: str, straight_run: Path, tmp_path: Path, cache_dir: str,
                 extra: list[str] = (), steps: int = 18) -> None:
    base = [*BASE, f"callbacks.model_checkpoint.mode={mode}", *extra]
    log_dir = tmp_path / "outputs"
    for i, fault in enumerate(chain):
        r = _run(base, log_dir, cache_dir, fault, resume=i > 0)
        assert r.returncode == fault["rc"], f"part {i} stopped at {fault}: exit {r.returncode}\n{r.stdout[-3000:]}"
        if fault["signal"] != "SIGKILL":  # a stop the run saw: marked as such, in training and in the test alike
            status = json.loads((_only_run(log_dir) / "job_status.json").read_text())
            assert status["status"] == "interrupted" and fault["signal"] in status["error"], status
            assert status["error"].endswith(f"continue with resume={_only_run(log_dir)}"), status
            assert not (_only_run(log_dir) / "metrics.json").exists()
    # the last part with threads=auto and no OMP_NUM_THREADS (the tests set it): it keeps the earlier parts' threads
    r = _run(base, log_dir, cache_dir, resume=True, env={"OMP_NUM_THREADS": ""})
    assert r.returncode == 0, r.stdout[-3000:]
    assert "(as the run's earlier part: a resumed run keeps them" in r.stdout
    run = _only_run(log_dir)

    want = torch.load(straight_run / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert got["global_step"] == want["global_step"] == steps  # last.ckpt is the newest state
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert exactly_equal(got[key], want[key]), f"{key} differs from the straight run's"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        sorted(p.name for p in (straight_run / "checkpoints").iterdir())  # no PREEMPTED, no temporary file left
    got_log, want_log = _logged(run), _logged(straight_run)
    for key in want_log:
        diverged = [s for s in sorted(want_log[key]) if got_log[key].get(s) != want_log[key][s]]
        assert not diverged and got_log[key].keys() == want_log[key].keys(), \
            f"{key} differs first at step {diverged[:1]}: {got_log[key].get(diverged[0]) if diverged else ''}"
    got_metrics, want_metrics = _untimed(run / "metrics.json"), _untimed(straight_run / "metrics.json")
    assert got_metrics == want_metrics and "val/loss" in want_metrics and "test/loss" in want_metrics
    status = json.loads((run / "job_status.json").read_text())
    assert status["status"] == "completed"
    assert status["value"] == json.loads((straight_run / "job_status.json").read_text())["value"]


def test_straight_run_keeps_last_ckpt_newest_when_the_metric_gets_worse(straight):
    """mode=max on val/loss: epoch 0 stays the best (the test uses it), last.ckpt still ends at the last step."""
    ckpts = straight("max") / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 18
    assert torch.load(ckpts / "epoch_000.ckpt", weights_only=True)["global_step"] == 6


def test_stopped_in_every_phase_by_every_signal_then_resumed_equals_straight(straight, tmp_path, cache_dir):
    _check_chain(DEFAULT, "max", straight("max"), tmp_path, cache_dir)


@pytest.mark.slow
@pytest.mark.parametrize("chain", SLOW)
def test_more_stops_then_resumed_equals_straight(chain, straight, tmp_path, cache_dir):
    mode = MODE.get(chain, "max")
    _check_chain(SLOW[chain], mode, straight(mode), tmp_path, cache_dir)


@pytest.mark.slow
def test_ddp_stopped_then_resumed_equals_straight(straight, tmp_path, cache_dir):
    """trainer=ddp_cpu (2 ranks: 3 steps an epoch): SIGKILL of rank 0 just after an epoch checkpoint (rank 1 goes
    with it), SIGTERM to both ranks in validation."""
    ddp = ("trainer=ddp_cpu",)
    chain = [point("after_save", "SIGKILL", step=3, file="last.ckpt", rc=KILLED),
             point("on_validation_batch_end", "SIGTERM", step=6)]
    _check_chain(chain, "max", straight("max", ddp), tmp_path, cache_dir, extra=ddp, steps=9)


def test_callbacks_none_still_keeps_last_ckpt_in_the_run_folder(tmp_path, cache_dir):
    """callbacks=none: Lightning's own default checkpoint went to <run>/<logger>/<version>/checkpoints/, no last.ckpt."""
    from helpers import compose_train

    from attnlab.cli.train import run

    run(compose_train(["debug=fast", "callbacks=none", "logger=csv", "test=false", "trainer.limit_train_batches=2",
                       "trainer.limit_val_batches=1"], tmp_path, cache_dir))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    assert not list(tmp_path.glob("*/version_*/checkpoints"))


# ----------------------------------------------------------------------------------------------------------------
# a stop between the stages: after training and before the test, after the test, in a sweep
# ----------------------------------------------------------------------------------------------------------------
ONE_EPOCH = [*BASE, "trainer.max_epochs=1", "data.test_size=8"]


def _fault_env(fault: dict) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "ATTNLAB_FAULT": json.dumps(fault)}


@pytest.mark.parametrize("signal", ["SIGTERM", "SIGINT"])
def test_a_sweep_stopped_before_a_jobs_test_says_so_and_starts_no_other_job(signal, tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", *ONE_EPOCH, "seed=0,1", f"hydra.sweep.dir={sweep}"], cache_dir,
                  env=_fault_env({"hook": "on_fit_end", "signal": signal}))
    assert out.returncode == (130 if signal == "SIGINT" else 0), out.stdout[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()) == ["0"]
    status = json.loads((sweep / "0" / "job_status.json").read_text())
    assert status["status"] == "interrupted" and signal in status["error"], status
    assert status["error"].endswith(f"continue with resume={sweep}"), status  # the sweep's folder, not the job's
    assert f"continue with resume={sweep}\n" in out.stdout.replace("\x1b[0m", "")
    summary = (sweep / "sweep_summary.md").read_text()
    assert summary.startswith(f"Sweep stopped by {signal} after 1 job(s): 0 completed, 1 interrupted"), summary
    assert "after training, before the test: not tested" in out.stdout


def test_a_stop_after_the_test_keeps_the_finished_runs_results(tmp_path, cache_dir):
    run = tmp_path / "run"
    out = run_cli([*ONE_EPOCH, f"hydra.run.dir={run}"], cache_dir, env=_fault_env({"hook": "on_test_end",
                                                                                  "signal": "SIGTERM"}))
    assert out.returncode == 0, out.stdout[-3000:]
    assert "received SIGTERM after the test: the run had finished, its results are written" in out.stdout
    assert "test/loss" in json.loads((run / "metrics.json").read_text())
    assert json.loads((run / "job_status.json").read_text())["status"] == "completed"
