"""Two nodes on one machine, as a cluster user starts them: ``python -m attnlab.torchrun --nnodes=2 --nproc-per-node=1
--node-rank=<r> --master-addr=127.0.0.1 --master-port=<p> train.py trainer=ddp_cpu trainer.num_nodes=2
trainer.devices=1 hydra.run.dir=<shared dir>`` once per node (docs/sweeps_and_ddp.md; attnlab.torchrun is torchrun
with bounded waits and one-line failures).

- Both nodes given the same run (or sweep) folder write one run: rank 0 its ``.hydra/``, ``train.log``, checkpoints,
  results and the sweep's files, node 1 only its own ``rank1.log``; 2 nodes × 1 process train the parameters one
  process trains with the doubled batch, a run and every job of a sweep (the comparison and its tolerance are
  tests/test_ddp_equivalence.py's).
- Nothing hangs: a world size torchrun does not give, a node that never arrives (either one), a node that refused
  its setting, a node lost in training (its worker, or the whole node) end every rank within 60 s, each with one
  line naming the setting or the node; no process is left.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, run_cli
from test_ddp_equivalence import COMMON, ONE_THREAD, STEPS

LM = [*COMMON, "model=causal_lm"]
NODES = ["trainer=ddp_cpu", "trainer.num_nodes=2", "trainer.devices=1"]


def _free_port() -> int:
    """A free port below the ephemeral range (32768-60999 here), which a bind to port 0 elsewhere (Lightning's DDP
    in another test worker) never hands out between this check and torchrun's bind."""
    while True:
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def _env(cache_dir: str) -> dict[str, str]:
    env = {**os.environ, **ONE_THREAD, "ATTNLAB_CACHE": cache_dir, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _node(rank: int, port: int, args: list[str], cache_dir: str, *launcher: str) -> subprocess.Popen:
    """One node: its torchrun (attnlab's), in a session of its own so that a test can lose the whole node."""
    return subprocess.Popen([sys.executable, "-m", "attnlab.torchrun", "--nnodes=2", "--nproc-per-node=1",
                             f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}", *launcher,
                             "train.py", *args], cwd=ROOT, env=_env(cache_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_all(nodes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Wait for every node; when one fails, the others are given 60 s (a peer used to wait for it forever)."""
    deadline = time.monotonic() + timeout
    while any(n.poll() is None for n in nodes) and time.monotonic() < deadline:
        if any(n.returncode not in (None, 0) for n in nodes):
            deadline = min(deadline, time.monotonic() + 60)
        time.sleep(0.5)
    for n in nodes:
        if n.poll() is None:
            os.killpg(n.pid, signal.SIGKILL)
    return [n.communicate()[0] for n in nodes]


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *_descendants(k)]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _assert_state_equal(a_path: Path, b_path: Path) -> None:
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    assert a["global_step"] == b["global_step"] == STEPS
    for k in a["state_dict"]:
        if not k.endswith(("qkv_proj.bias", "kv_proj.bias")):  # the key biases' noise: test_ddp_equivalence.py
            diff = (a["state_dict"][k] - b["state_dict"][k]).abs().max().item()
            assert diff <= 1e-5, f"{k}: max difference {diff:.3g}"


def _one_process_wrote(folder: Path) -> None:
    assert (folder / "rank1.log").is_file() and (folder / "metrics.json").is_file()
    assert "[rank: 1]" not in (folder / "train.log").read_text()  # node 1 logged to its own file
    assert sorted(p.name for p in (folder / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]


def test_two_nodes_write_one_run_and_train_what_one_process_trains(tmp_path, cache_dir):
    one = run_cli([*LM, "data.batch_size=8", f"trainer.limit_train_batches={STEPS}", f"hydra.run.dir={tmp_path}/single"],
                  cache_dir, env=ONE_THREAD)
    assert one.returncode == 0, one.stdout[-3000:]

    shared, port = tmp_path / "shared run", _free_port()
    args = [*LM, *NODES, "data.batch_size=4", f"trainer.limit_train_batches={STEPS}", f"hydra.run.dir='{shared}'"]
    nodes = [_node(rank, port, args, cache_dir) for rank in (0, 1)]
    outs = _wait_all(nodes, timeout=300)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outs)
    _one_process_wrote(shared)
    _assert_state_equal(tmp_path / "single/checkpoints/last.ckpt", shared / "checkpoints/last.ckpt")


@pytest.mark.slow  # (21 s; CI runs it: .ci/run)
def test_a_sweep_on_two_nodes_is_the_sweep_one_process_runs(tmp_path, cache_dir):
    """train.py -m on every node: rank 0's node writes the sweep (plan, summary, job statuses), the jobs meet under
    new process-group names each time (torchrun's store outlives a job: the second job used to read the first's
    addresses and fail with "Connection refused"), and every job trains what one process trains."""
    sweep = ["-m", *LM, "seed=0,1", f"trainer.limit_train_batches={STEPS}"]
    one = run_cli([*sweep, "data.batch_size=8", f"hydra.sweep.dir={tmp_path}/single"], cache_dir, env=ONE_THREAD)
    assert one.returncode == 0, one.stdout[-3000:]

    shared, port = tmp_path / "shared sweep", _free_port()
    nodes = [_node(rank, port, [*sweep, *NODES, "data.batch_size=4", f"hydra.sweep.dir='{shared}'"], cache_dir)
             for rank in (0, 1)]
    outs = _wait_all(nodes, timeout=300)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outs)
    assert "sweep_summary.md" in outs[0] and "sweep_summary.md" not in outs[1]  # node 0 wrote and said it
    assert sorted(p.name for p in shared.iterdir()) == ["0", "1", "multirun.yaml", "sweep_plan.json",
                                                       "sweep_summary.md"]
    for job in ("0", "1"):
        _one_process_wrote(shared / job)
        assert (shared / job / "job_status.json").read_text().count('"completed"') == 1
        _assert_state_equal(tmp_path / "single" / job / "checkpoints/last.ckpt", shared / job / "checkpoints/last.ckpt")


def test_num_nodes_against_torchruns_world_size_is_one_line(tmp_path, cache_dir):
    """trainer.num_nodes=2 under a torchrun that started one process: refused in one line, well within 60 s."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                          "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "train.py", *LM, *NODES,
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=_env(cache_dir), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode != 0 and time.monotonic() - start < 60
    assert ("trainer.num_nodes=2 × trainer.devices=1 = 2 processes, but torchrun started 1 (WORLD_SIZE: --nnodes × "
            "--nproc-per-node); make them agree") in out.stdout, out.stdout[-2000:]
    assert "ValueError" not in out.stdout and not (tmp_path / "run").exists()


@pytest.mark.parametrize("present", [0, 1])
def test_a_node_that_never_arrives_is_named_in_one_line(tmp_path, cache_dir, present):
    """Only one node is started: node 0 names how many arrived, node 1 the master it could not reach; one line
    each (torchrun: 600 s of silence, then two tracebacks), nothing written."""
    start = time.monotonic()
    node = _node(present, _free_port(), [*LM, *NODES, f"hydra.run.dir={tmp_path / 'run'}"], cache_dir,
                 "--rdzv-conf=timeout=5")
    (out,) = _wait_all([node], timeout=60)
    assert node.returncode == 1 and time.monotonic() - start < 30, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out, out
    expected = ("not every node arrived at 127.0.0.1:" if present == 0 else "node 0 (the master, 127.0.0.1:")
    assert lines[0].startswith(f"attnlab.torchrun: node {present}: {expected}") and "within 5 s" in lines[0], out
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_default_wait_for_a_missing_node_ends_within_a_minute(tmp_path, cache_dir):
    start = time.monotonic()
    node = _node(0, _free_port(), [*LM, *NODES, f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    (out,) = _wait_all([node], timeout=120)
    assert node.returncode == 1 and time.monotonic() - start < 60 and "within 50 s" in out, out


@pytest.mark.slow  # (18 s; CI runs it: .ci/run)
def test_a_node_that_refuses_its_setting_ends_the_other_in_one_line(tmp_path, cache_dir):
    """Node 1 refuses a value node 0 does not have: node 0 names rank 1 / node 1 instead of waiting in Lightning's
    rendezvous for 30 minutes."""
    port, run = _free_port(), tmp_path / "run"
    args = [*LM, *NODES, f"hydra.run.dir={run}"]
    nodes = [_node(0, port, args, cache_dir, "--rdzv-conf=timeout=10"),
             _node(1, port, [*args, "trainer.max_epochs=-5"], cache_dir, "--rdzv-conf=timeout=10")]
    start = time.monotonic()
    outs = _wait_all(nodes, timeout=120)
    assert [n.returncode for n in nodes] == [1, 2] and time.monotonic() - start < 60, "\n".join(outs)
    assert "trainer.max_epochs=-5: must be an integer >= -1 (or null)" in outs[1]
    assert ("rank(s) 1 (node 1) of this distributed run did not arrive within 10 s (refused, crashed or not started: "
            "that node's output says why); rank 0 stops") in outs[0], outs[0][-2000:]
    for out in outs:
        assert "Traceback" not in out


# (16 s each: the second in -m slow, which CI runs, to keep the suite under 10 minutes)
@pytest.mark.parametrize("lost", ["node 1's worker", pytest.param("node 0 whole", marks=pytest.mark.slow)])
def test_a_node_lost_in_training_ends_every_rank_in_one_line(tmp_path, cache_dir, lost):
    """One node's training process (or all of node 0: its torchrun, which holds the rendezvous store, and its
    worker) is killed after the first checkpoint: the other node ends within 60 s with one line naming the lost
    process's address and how to resume; no process of either node is left."""
    port, run = _free_port(), tmp_path / "run"
    args = [*LM, *NODES, "trainer.max_epochs=500", "trainer.limit_val_batches=1", f"hydra.run.dir={run}"]
    nodes = [_node(rank, port, args, cache_dir) for rank in (0, 1)]
    deadline = time.monotonic() + 120
    while not (run / "checkpoints/last.ckpt").is_file() and time.monotonic() < deadline:
        assert all(n.poll() is None for n in nodes), "a node ended before its first checkpoint"
        time.sleep(0.2)
    everyone = [pid for n in nodes for pid in [n.pid, *_descendants(n.pid)]]
    victim, survivor = (nodes[1], nodes[0]) if lost == "node 1's worker" else (nodes[0], nodes[1])
    workers = [pid for pid in _descendants(victim.pid) if "train.py" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert workers
    start = time.monotonic()
    for pid in workers if lost == "node 1's worker" else [victim.pid, *workers]:
        os.kill(pid, signal.SIGKILL)
    outs = _wait_all(nodes, timeout=90)
    assert survivor.returncode == 1 and time.monotonic() - start < 60, "\n".join(o[-2000:] for o in outs)
    said = outs[nodes.index(survivor)]
    assert "a process of this distributed run is gone (the process at 127.0.0.1, port " in said, said[-2000:]
    assert f"resume={run} continues from last.ckpt" in said and "Traceback" not in said
    if lost == "node 1's worker":
        assert victim.returncode == 128 + signal.SIGKILL and "was ended by SIGKILL" in outs[1]
    time.sleep(1)
    assert not [pid for pid in everyone if _alive(pid)]


def test_an_optuna_search_under_torchrun_is_refused_in_one_line(tmp_path, cache_dir):
    """Every rank would ask the study for trials of its own."""
    out = subprocess.run([sys.executable, "-m", "attnlab.torchrun", "--nnodes=1", "--nproc-per-node=2",
                          "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "train.py", "-m",
                          "hparams_search=lm_optuna", *LM, "trainer=ddp_cpu", f"hydra.sweep.dir={tmp_path / 's'}"],
                         cwd=ROOT, env=_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "an Optuna search runs on one node (a trial may use all of its devices): start it without torchrun" \
        in out.stdout and "Traceback" not in out.stdout
    assert not (tmp_path / "s").exists()


def test_the_torchrun_wrapper_waits_50_s_unless_told():
    from attnlab.cli.torchrun import _with_timeout

    assert _with_timeout("") == ("timeout=50", 50)
    assert _with_timeout("read_timeout=5") == ("read_timeout=5,timeout=50", 50)
    assert _with_timeout("timeout=300,join_timeout=9") == ("timeout=300,join_timeout=9", 300)
