"""The torch-threads rule (attnlab.runs.threads) as a pure function over (cores, load, running processes, the
user's settings, DDP ranks); and what apply() sets. train.py's line: tests/test_first_hour.py."""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

from attnlab.runs import threads
from attnlab.runs.threads import BUSY_FROM, Machine, choose

CORES = (1, 2, 4, 16)
LOADS = (0.0, 0.2, 0.35, 1.0, 2.3, 7.0)
RUNNING = (None, 1, 2, 4)  # /proc/loadavg's runnable count, this process included
RANKS = (1, 2)


def expected_auto(cores: int, load: float, running: int | None, ranks: int) -> int:
    """The rule written out: cores held by others (a core from 0.3 of it on, by the larger of the load average and
    the processes running now besides this one), the free ones shared among the ranks, at least one each."""
    others = max(load, (running or 1) - 1)
    busy = min(cores, math.floor(others + 1 - BUSY_FROM))
    return max(1, (cores - busy) // ranks)


@pytest.mark.parametrize("cores,load,running,ranks", list(itertools.product(CORES, LOADS, RUNNING, RANKS)))
def test_auto_takes_the_free_cores(cores, load, running, ranks):
    choice = choose(Machine(cores, load, running), ranks=ranks)
    assert choice.threads == expected_auto(cores, load, running, ranks)
    assert 1 <= choice.threads <= cores
    assert choice.line().startswith(f"torch threads: {choice.threads} (load {load:.1f}")
    assert f"on {cores} cores" in choice.line() and "set threads=N to choose" in choice.line()
    assert ("shared by 2 ranks" in choice.why) == (ranks == 2)


@pytest.mark.parametrize("load,running,want", [
    (0.0, 1, 2),  # the machine to itself: both cores
    (0.25, 1, 2),  # a little background work: still both
    (0.3, 1, 1),  # 0.3 of a core held by others: that core is busy
    (2.3, 3, 1),  # the machine: one thread
    (0.1, 2, 1),  # the load average lags a job started a moment ago: the running count sees it
    (7.0, 9, 1),  # never fewer than one
])
def test_two_cores(load, running, want):
    assert choose(Machine(2, load, running)).threads == want


@pytest.mark.parametrize("setting,env,torch_threads,want,why", [
    (3, None, None, 3, "threads=3"),  # the config key wins over everything
    (1, "4", 2, 1, "threads=1"),
    ("auto", "4", None, 4, "OMP_NUM_THREADS=4; threads=N overrides it"),  # the user's environment, kept under auto
    ("auto", " 2 ", 3, 2, "OMP_NUM_THREADS=2"),
    ("auto", None, 3, 3, "torch.set_num_threads before the run"),  # set in this process before train.py's job
    ("auto", "0", None, 1, "load 7.0"),  # not a thread count: the rule decides
    ("auto", "abc", None, 1, "load 7.0"),
])
def test_what_the_user_sets_wins(setting, env, torch_threads, want, why):
    choice = choose(Machine(2, 7.0, 9), setting, env, torch_threads)
    assert choice.threads == want and why in choice.why


@pytest.mark.parametrize("setting,env,torch_threads,previous,want,why", [
    ("auto", None, None, 2, 2, "as the run's earlier part"),  # resume=: the checkpoint's count, whatever the load
    ("auto", None, None, 1, 1, "as the run's earlier part"),
    (3, None, None, 2, 3, "threads=3"),  # what the user sets still wins
    ("auto", "4", None, 2, 4, "OMP_NUM_THREADS=4"),
    ("auto", None, 3, 2, 3, "torch.set_num_threads"),
    ("auto", None, None, None, 1, "load 7.0"),  # a new run (or a checkpoint from before the count was saved)
    ("auto", None, None, 0, 1, "load 7.0"),
    ("auto", None, None, True, 1, "load 7.0"),
])
def test_a_resumed_run_keeps_its_threads(setting, env, torch_threads, previous, want, why):
    choice = choose(Machine(2, 7.0, 9), setting, env, torch_threads, previous=previous)
    assert choice.threads == want and why in choice.why


def test_the_bench_names_its_own_option():
    assert "set --threads N to choose" in choose(Machine(2, 3.0, 4), option="--threads N").why


@pytest.mark.parametrize("devices,ranks", [(1, 1), (2, 2), ("auto", 1), (-1, 1), ([0, 1, 2], 3), ("0,1", 2),
                                           (None, 1), (True, 1)])
def test_ranks_of_a_trainer_config(devices, ranks):
    assert threads.ranks_of({"devices": devices}) == ranks


def test_read_machine_reads_this_one():
    m = threads.read_machine()
    assert 1 <= m.cores <= (os.cpu_count() or 1) and m.load >= 0 and (m.running is None or m.running >= 1)


def test_apply_sets_torch_and_the_ranks_environment(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(4)  # torch's default on the 4 cores below (the test workers set 1: a user's choice)
    monkeypatch.setattr(threads, "_STARTED_WITH", None)  # as if the user had set nothing
    monkeypatch.setattr(threads, "_applied", None)
    monkeypatch.setattr(threads, "read_machine", lambda: Machine(4, 0.0, 1))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert threads.apply("auto", ranks=2).threads == 2  # 4 free cores, 2 ranks
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"  # the ranks read it
        # a sweep's next job: what the first job set (in the environment and in torch) is not the user's, the rule
        # decides again
        monkeypatch.setattr(threads, "read_machine", lambda: Machine(4, 2.0, 3))
        assert threads.apply("auto").threads == 2
        monkeypatch.setattr(threads, "read_machine", lambda: Machine(4, 3.0, 4))
        assert threads.apply("auto").threads == 1 and torch.get_num_threads() == 1
        torch.set_num_threads(3)  # the user's own call before the next job
        assert threads.apply("auto").why.startswith("torch.set_num_threads") and torch.get_num_threads() == 3
        monkeypatch.setattr(threads, "_STARTED_WITH", "3")  # the user's OMP_NUM_THREADS
        assert threads.apply("auto").threads == 3
        assert threads.apply(1).line() == "torch threads: 1 (threads=1)"
    finally:
        torch.set_num_threads(before)
