"""``launcher=local``: a sweep whose jobs submitit runs, each its own process (what ``launcher=slurm`` does on a
cluster). Property: a job preempted with SIGUSR1 anywhere (training, its validation, the test, before training) is
requeued and ends as the job run straight, bit for bit; a job stopped otherwise (SIGTERM: ``scancel``) or lost
(SIGKILL: out of memory) ends the job, not the sweep, and ``resume=<sweep dir>`` continues it to the same end. The
settings submitit's tasks and nodes must agree with are refused before submission, in one line, leaving nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import exactly_equal, run_cli
from test_sweep_continue import JOB, assert_job_equals_straight

TESTS = Path(__file__).resolve().parent
SEEDS = "seed=0,1"


def faults(marks: Path) -> list[dict]:
    """The stops, in order for each job (tests/fault_injection.py: each fires once, its marker made)."""
    points = [
        (0, "on_train_batch_end", 2, "SIGUSR1"),  # mid-epoch: checkpoint at step 3, requeued
        (0, "on_validation_batch_end", 6, "SIGUSR1"),  # in the epoch's validation: checkpoint at its end, requeued
        (0, "on_test_batch_end", None, "SIGUSR1"),  # in the test: requeued, tested again
        (1, "on_job_start", None, "SIGUSR1"),  # nothing written yet: folder moved aside, run anew
        (1, "on_train_batch_end", 8, "SIGTERM"),  # scancel: the job ends interrupted, the sweep goes on
        (1, "on_train_batch_end", 10, "SIGKILL"),  # (in the continuation) its process lost
    ]
    return [{"job": job, "hook": hook, "signal": sig, "marker": str(marks / str(i)), **({"step": step} if step else {})}
            for i, (job, hook, step, sig) in enumerate(points)]


def _train(args: list[str], cache_dir: str, fault: list[dict] | None = None):
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env["ATTNLAB_FAULT"] = json.dumps(fault or [])
    return run_cli(args, cache_dir, env=env)


def _status(job_dir: Path) -> dict:
    path = job_dir / "job_status.json"
    return json.loads(path.read_text()) if path.is_file() else {}


@pytest.mark.slow  # (86-91 s; CI runs it: .ci/run)
def test_preempted_jobs_are_requeued_and_stopped_ones_continue(tmp_path, cache_dir):
    sweep, marks = tmp_path / "sweep", tmp_path / "marks"
    marks.mkdir()
    points = faults(marks)

    def local_sweep(*extra: str):
        r = _train(["-m", "launcher=local", *JOB, SEEDS, f"hydra.sweep.dir={sweep}", *extra], cache_dir, points)
        assert r.returncode == 0, r.stdout[-4000:]
        return r

    local_sweep()
    assert sorted(int(p.name) for p in marks.iterdir()) == [0, 1, 2, 3, 4]
    assert _status(sweep / "0")["status"] == "completed"  # preempted thrice, requeued by submitit each time
    assert list(sweep.glob("1.old-*")), "job 1 stopped before any checkpoint: its first folder moved aside"
    assert _status(sweep / "1")["status"] == "interrupted"  # SIGTERM ended job 1 only
    summary = (sweep / "sweep_summary.md").read_text()
    assert "| 1 |" in summary and "interrupted" in summary
    assert not (sweep / ".submitit" / "%j").exists()

    r = local_sweep(f"resume={sweep}")  # job 1 continued, then its process killed
    assert (marks / "5").exists()
    assert "job 1 ended without a result" in r.stdout and f"resume={sweep}" in r.stdout, r.stdout[-3000:]
    r = local_sweep(f"resume={sweep}")
    assert "continued from their last.ckpt: 1" in r.stdout, r.stdout[-3000:]

    straight = tmp_path / "straight"  # the same jobs, one after the other in this process, never stopped
    r = _train(["-m", *JOB, SEEDS, f"hydra.sweep.dir={straight}"], cache_dir)
    assert r.returncode == 0, r.stdout[-4000:]
    for job in ("0", "1"):
        assert_job_equals_straight(sweep / job, straight / job)


@pytest.mark.slow  # (33 s; CI runs it: .ci/run)
def test_ctrl_c_stops_a_local_sweep_with_its_jobs_state_saved(tmp_path, cache_dir):
    """Ctrl+C in the terminal reaches the sweep, submitit's controllers and the jobs (one process group): the job
    saves its state and stops, the sweep waits for it, writes its summary and says how to continue, in one line
    (exit 130); continued, the job ends as the straight run."""
    sweep = tmp_path / "sweep"
    ctrl_c = [{"job": 0, "hook": "on_train_batch_end", "step": 2, "signal": "SIGINT", "group": True,
               "marker": str(tmp_path / "fired")}]
    env = {**os.environ, "WANDB_SILENT": "true", "ATTNLAB_CACHE": cache_dir, "ATTNLAB_FAULT": json.dumps(ctrl_c),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    args = [sys.executable, "train.py", "-m", "launcher=local", *JOB, "seed=0", f"hydra.sweep.dir={sweep}"]
    with subprocess.Popen(args, cwd=TESTS.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True) as p:  # (its own group: the signal reaches no test)
        out, _ = p.communicate(timeout=300)
    assert p.returncode == 130, out[-4000:]
    assert "Traceback" not in out and f"continue it with resume={sweep}" in out, out[-4000:]
    assert _status(sweep / "0")["status"] == "interrupted"
    assert "Sweep stopped by SIGINT" in out and (sweep / "sweep_summary.md").is_file()

    r = _train(["-m", "launcher=local", *JOB, "seed=0", f"hydra.sweep.dir={sweep}", f"resume={sweep}"], cache_dir,
               ctrl_c)
    assert r.returncode == 0, r.stdout[-4000:]
    straight = tmp_path / "straight"
    r = _train(["-m", *JOB, "seed=0", f"hydra.sweep.dir={straight}"], cache_dir)
    assert r.returncode == 0, r.stdout[-4000:]
    a, b = (torch.load(d / "0" / "checkpoints" / "last.ckpt", weights_only=True) for d in (sweep, straight))
    assert exactly_equal(a["state_dict"], b["state_dict"]) and exactly_equal(a["optimizer_states"], b["optimizer_states"])
    assert _status(sweep / "0")["value"] == _status(straight / "0")["value"]


REFUSED = {
    "local_tasks": (["launcher=local", "hydra.launcher.tasks_per_node=2"], {}, "tasks_per_node=2 nodes=1"),
    "local_nodes": (["launcher=local", "hydra.launcher.nodes=2"], {}, "set both to 1"),
    "slurm_devices": (["launcher=slurm", "trainer=ddp_cpu"], {}, "tasks_per_node=1 but trainer.devices=2"),
    "slurm_auto": (["launcher=slurm", "trainer=ddp", "hydra.launcher.gpus_per_node=4"], {},
                   "tasks_per_node=1 but trainer.devices=auto (4 per node)"),
    "slurm_nodes": (["launcher=slurm", "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"], {}, "hydra.launcher.nodes=1 but trainer.num_nodes=2"),
    "one_job_differs": (["launcher=slurm", "trainer.devices=1,2"], {}, "trainer.devices=2"),
    "signal_not_handled": (["launcher=local"], {"SUBMITIT_PREEMPT_SIGNAL": "USR2"}, "does not handle it"),
    "no_preemption_callback": (["launcher=local", "callbacks.preemption=null"], {}, "its signals: none"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_what_submitit_starts_must_be_the_run(case, tmp_path, cache_dir):
    """Refused before anything is submitted (no sbatch here: a SLURM sweep that got past the check would fail
    differently), one line, exit 2, no sweep folder."""
    args, env, message = REFUSED[case]
    sweep = tmp_path / "sweep"
    r = run_cli(["-m", "debug=fast", *args, "seed=0,1", f"hydra.sweep.dir={sweep}"], cache_dir, env=env)
    assert r.returncode == 2, r.stdout[-3000:]
    errors = [line for line in r.stdout.splitlines() if "Error" in line or "error" in line]
    assert message in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stdout and len(errors) <= 1, r.stdout[-3000:]
    assert not sweep.exists()


@pytest.mark.parametrize("executor,launcher,trainer", [
    ("local", {"tasks_per_node": 1, "nodes": 1}, {"devices": 2, "num_nodes": 1}),  # Lightning starts both itself
    ("slurm", {"tasks_per_node": 2, "nodes": 2}, {"devices": 2, "num_nodes": 2}),
    ("slurm", {"tasks_per_node": 4, "nodes": 1, "gpus_per_node": 4}, {"devices": "auto", "num_nodes": 1}),
    ("slurm", {"tasks_per_node": 2, "nodes": 1}, {"devices": [0, 1], "num_nodes": 1}),
    ("slurm", {"tasks_per_node": 3, "nodes": 1}, {"devices": "auto", "num_nodes": 1}),  # auto, no gpus: unknown
])
def test_settings_that_agree_pass(executor, launcher, trainer):
    from attnlab.runs.submitit_jobs import check_job

    check_job(executor, launcher, trainer, ["SIGTERM", "SIGUSR1"], "USR1")
