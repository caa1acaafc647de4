"""Property: a sweep stopped anywhere and continued with ``python train.py -m <same overrides> resume=<sweep dir>``
equals the sweep run straight.

"Equals", job by job: the same job numbers and folders, the same final weights, optimizer and scheduler state (bit
for bit), the same losses logged at every step, the same test metrics and ``job_status.json``; the same
``sweep_summary.md`` rows and the same ``attnlab.compare`` table. A job that had finished when the sweep stopped is
left byte for byte as it was. Stops are made from inside the sweep (tests/fault_injection.py: a Lightning hook of one
job, a checkpoint write, or a Hydra callback between jobs and before the summary), never by timing.

The default chain stops one sweep in every phase, each signal used: job 0's training, its checkpoint write, its
validation, its test; between the jobs (after job 0 ended; as job 1 started, before Hydra wrote its config); job 1
before its first checkpoint (run anew), after one, trained but not tested; and before the summary. Every part and
every continuation runs through ``python train.py -m`` as a user would. ``-m slow``: the other signals.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from helpers import exactly_equal, run_cli
from test_resume_anywhere import KILLED, _logged, _untimed, point

TESTS = Path(__file__).resolve().parent
# 2 jobs of 2 epochs of 6 batches: steps 1-6 are epoch 0, validation after steps 6 and 12, then the test. threads=1:
# a job run anew (stopped before its first checkpoint) chooses its threads by the load then, as a new job does, and
# float sums differ between thread counts (a resumed job keeps its first part's: runs/threads.py)
JOB = ["debug=fast", "data.train_size=48", "data.val_size=16", "data.test_size=16", "trainer.limit_val_batches=2",
       "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "logger=csv", "model.net.dropout=0.1",
       "trainer.deterministic=true", "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null",
       "trainer.enable_progress_bar=false", "threads=1", "+callbacks.fault._target_=fault_injection.Fault",
       "+hydra.callbacks.fault._target_=fault_injection.SweepFault"]
SWEEP = [*JOB, "seed=0,1"]
KILLED_BY_TERM = -15


def at(job: int | None, hook: str, signal: str, rc: int = 0, **kw) -> dict:
    spec = point(hook, signal, rc=rc, **kw)
    if job is not None:
        spec["job"] = job
    return spec


DEFAULT = [
    at(0, "on_train_batch_end", "SIGTERM", step=2),  # job 0 mid-epoch: a preemption checkpoint, exit 0
    at(0, "during_save", "SIGKILL", step=6, file="last.ckpt", rc=KILLED),  # its last.ckpt half written
    at(0, "on_validation_batch_end", "SIGKILL", step=12, rc=KILLED),  # in its last validation
    at(0, "on_test_batch_end", "SIGINT", rc=130),  # in its test
    at(0, "on_job_end", "SIGKILL", rc=KILLED),  # between the jobs: job 0 finished, job 1 not started
    at(1, "on_job_start", "SIGTERM", rc=KILLED_BY_TERM),  # job 1's folder made, nothing in it yet
    at(1, "on_train_batch_end", "SIGKILL", step=2, rc=KILLED),  # before job 1's first checkpoint: run anew
    at(1, "after_save", "SIGTERM", step=6, file="last.ckpt"),  # just after an epoch checkpoint
    at(1, "on_fit_end", "SIGKILL", step=12, rc=KILLED),  # trained, not tested
    at(None, "on_multirun_end", "SIGKILL", rc=KILLED),  # every job done, the summary not written
]
SLOW = {
    "other_signals": [
        at(0, "on_train_batch_end", "SIGKILL", step=3, rc=KILLED),  # before any checkpoint: job 0 run anew
        at(0, "after_save", "SIGINT", step=6, file="last.ckpt", rc=130),
        at(0, "on_validation_end", "SIGTERM", step=12),
        at(0, "on_test_batch_end", "SIGKILL", rc=KILLED),
        at(1, "on_job_start", "SIGKILL", rc=KILLED),
        at(1, "on_validation_batch_end", "SIGINT", step=6, rc=130),
        at(1, "on_test_batch_end", "SIGTERM"),
        at(None, "on_multirun_end", "SIGTERM", rc=KILLED_BY_TERM),
    ],
}


def _train(args: list[str], cache_dir: str, fault: dict | None = None):
    """train.py with tests/ importable (the fault callbacks are in every command's config)."""
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if fault:
        env["ATTNLAB_FAULT"] = json.dumps({k: v for k, v in fault.items() if k != "rc"})
    return run_cli(args, cache_dir, env=env)


def _sweep(sweep_dir: Path, cache_dir: str, fault: dict | None = None, resume: bool = False):
    return _train(["-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}", *([f"resume={sweep_dir}"] if resume else [])],
                  cache_dir, fault)


def _files(job_dir: Path) -> dict[str, tuple[str, float]]:
    return {str(p.relative_to(job_dir)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
            for p in sorted(job_dir.rglob("*")) if p.is_file()}


def _rows(sweep_dir: Path) -> list[str]:
    return [line for line in (sweep_dir / "sweep_summary.md").read_text().splitlines() if line.startswith("| ")]


def _compare_table(sweep_dir: Path) -> list[tuple]:
    from attnlab.cli.compare import compare

    result = compare(sweep_dir, metric="test/loss")
    return [(row.setting, row.values, row.seeds, row.jobs) for row in result.rows]


@pytest.fixture(scope="module")
def straight_sweep(tmp_path_factory, cache_dir) -> Path:
    sweep_dir = tmp_path_factory.mktemp("straight") / "sweep"
    r = _sweep(sweep_dir, cache_dir)
    assert r.returncode == 0, r.stdout[-3000:]
    return sweep_dir


def assert_job_equals_straight(got: Path, want: Path) -> None:
    """A job stopped and continued ends as the same job run straight: its final weights, optimizer and scheduler
    state bit for bit (12 steps), every logged loss, its test metrics, its status and value."""
    a = torch.load(got / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(want / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 12
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert exactly_equal(a[key], b[key]), f"job {got.name}: {key} differs from the straight run's"
    assert _logged(got) == _logged(want), f"job {got.name}: a logged loss differs"
    assert _untimed(got / "metrics.json") == _untimed(want / "metrics.json")
    status, straight_status = (json.loads((d / "job_status.json").read_text()) for d in (got, want))
    assert status["status"] == "completed" and status["value"] == straight_status["value"]


def _check_chain(chain: list[dict], straight: Path, tmp_path: Path, cache_dir: str) -> None:
    sweep_dir = tmp_path / "sweep"
    kept: dict[int, dict] = {}  # job -> its files when it was first seen finished
    for i, fault in enumerate(chain):
        r = _sweep(sweep_dir, cache_dir, fault, resume=i > 0)
        assert r.returncode == fault["rc"], f"part {i} stopped at {fault}: exit {r.returncode}\n{r.stdout[-3000:]}"
        for job, files in kept.items():
            assert _files(sweep_dir / str(job)) == files, f"part {i} changed the finished job {job}"
        for job in (0, 1):
            status = sweep_dir / str(job) / "job_status.json"
            if job not in kept and status.is_file() and json.loads(status.read_text())["status"] == "completed":
                kept[job] = _files(sweep_dir / str(job))
    r = _sweep(sweep_dir, cache_dir, resume=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "continuing the sweep" in r.stdout

    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == ["0", "1"]
    for job in ("0", "1"):
        assert_job_equals_straight(sweep_dir / job, straight / job)
    assert _rows(sweep_dir) == _rows(straight)
    assert _compare_table(sweep_dir) == _compare_table(straight)


def test_a_sweep_stopped_in_every_phase_then_continued_equals_the_straight_sweep(straight_sweep, tmp_path,
                                                                                 cache_dir):
    _check_chain(DEFAULT, straight_sweep, tmp_path, cache_dir)
    # the jobs run anew left what they had beside them (nothing is deleted), outside the sweep's jobs
    aside = sorted(p.name for p in (tmp_path / "sweep").iterdir() if ".old-" in p.name)
    assert len(aside) == 2 and all(name.startswith("1.old-") for name in aside), aside


@pytest.mark.slow
@pytest.mark.parametrize("chain", SLOW)
def test_more_stops_then_continued_equals_the_straight_sweep(chain, straight_sweep, tmp_path, cache_dir):
    _check_chain(SLOW[chain], straight_sweep, tmp_path, cache_dir)


# ----------------------------------------------------------------------------------------------------------------
# a changed sweep, extend_sweep=true, resume=auto, and resume= naming what is not this sweep
# ----------------------------------------------------------------------------------------------------------------
def _copy(straight: Path, tmp_path: Path) -> Path:
    import shutil

    sweep_dir = tmp_path / "outputs" / "debug" / "multiruns" / "2026-01-01_00-00-00"
    shutil.copytree(straight, sweep_dir)
    return sweep_dir


@pytest.mark.parametrize("command, message", [
    (["seed=0"], "this command is not the sweep there (seed=1 there, not here); give the sweep's own overrides"),
    (["seed=0,1", "model.net.dropout=0.2"], "(model.net.dropout=0.1 there, not here; model.net.dropout=0.2 here, "
                                            "not there)"),
    (["seed=0,1,2"], "this command adds 1 job(s) to the sweep there (seed=2 here, not there); add extend_sweep=true"),
    (["seed=0,1", "extend_sweep=true", "resume=null"], "extend_sweep=true adds jobs to a sweep being continued: give "
                                                       "resume=<sweep dir> too"),
])
def test_a_changed_sweep_is_refused_in_one_line_and_nothing_is_written(command, message, straight_sweep, tmp_path,
                                                                     cache_dir):
    sweep_dir = _copy(straight_sweep, tmp_path)
    before = {str(p): p.stat().st_mtime for p in sweep_dir.rglob("*")}
    job = [a for a in JOB if not a.startswith("model.net.dropout") or "model.net.dropout=0.2" not in command]
    r = _train(["-m", *job, *command, f"hydra.sweep.dir={sweep_dir}",
                 *([] if "resume=null" in command else [f"resume={sweep_dir}"])], cache_dir)
    assert r.returncode == 2, r.stdout[-2000:]
    errors = [line for line in r.stdout.splitlines() if "ERROR" in line or message[:30] in line]
    assert len(errors) == 1 and message in errors[0], r.stdout[-2000:]
    assert {str(p): p.stat().st_mtime for p in sweep_dir.rglob("*")} == before


@pytest.mark.parametrize("resume, message", [
    ("{sweep}/0", "is a run folder, not a sweep folder: continue it without -m"),
    ("{tmp}/nowhere", "not a sweep folder (no such folder)"),
    ("{tmp}", "not a sweep folder (no multirun.yaml there)"),
])
def test_resume_naming_no_sweep_is_refused_in_one_line(resume, message, straight_sweep, tmp_path, cache_dir):
    sweep_dir = _copy(straight_sweep, tmp_path)
    value = resume.format(sweep=sweep_dir, tmp=tmp_path)
    r = _train(["-m", *SWEEP, f"paths.log_dir={tmp_path / 'outputs'}", f"resume={value}"], cache_dir)
    assert r.returncode == 2 and message in r.stdout, r.stdout[-2000:]
    assert sorted(p.name for p in sweep_dir.parent.iterdir()) == [sweep_dir.name]  # no new sweep folder


def test_extend_sweep_runs_only_the_new_jobs_and_resume_auto_finds_the_sweep(straight_sweep, tmp_path, cache_dir):
    """extend_sweep=true adds seed=2 as job 2 (jobs 0 and 1 untouched); then the extended command with
    resume=auto finds that sweep (the newest of this command) and has nothing left to run."""
    sweep_dir = _copy(straight_sweep, tmp_path)
    other = sweep_dir.with_name("2026-01-02_00-00-00")  # newer, of another command: passed over by resume=auto
    (other / "0" / ".hydra").mkdir(parents=True)
    (other / "multirun.yaml").write_text("{}\n")
    (other / "0" / ".hydra" / "overrides.yaml").write_text("- norm=rms\n")
    kept = {job: _files(sweep_dir / job) for job in ("0", "1")}
    log_dir = f"paths.log_dir={tmp_path / 'outputs'}"
    r = _train(["-m", *JOB, "seed=0,1,2", log_dir, f"resume={sweep_dir}", "extend_sweep=true"], cache_dir)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "finished (kept as they are): 0, 1; continued from their last.ckpt: none; run anew: none; not started " \
           "before: 2" in r.stdout
    assert {job: _files(sweep_dir / job) for job in ("0", "1")} == kept
    assert json.loads((sweep_dir / "2" / "job_status.json").read_text())["status"] == "completed"
    assert [row.split(" | ")[0] for row in _rows(sweep_dir)[1:]] == ["| 0", "| 1", "| 2"]
    plan = json.loads((sweep_dir / "sweep_plan.json").read_text())["jobs"]
    assert [j["num"] for j in plan] == [0, 1, 2] and "seed=2" in plan[2]["overrides"]

    r = _train(["-m", *JOB, "seed=0,1,2", log_dir, "resume=auto"], cache_dir)
    assert r.returncode == 0, r.stdout[-3000:]
    assert f"continuing the sweep {sweep_dir}: finished (kept as they are): 0, 1, 2;" in r.stdout
    r = _train(["-m", *JOB, "seed=5,6", log_dir, "resume=auto"], cache_dir)
    assert r.returncode == 2 and "resume=auto: no sweep of this command under" in r.stdout, r.stdout[-2000:]
