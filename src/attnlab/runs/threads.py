"""How many intra-op threads torch gets: as many as the cores other processes leave free, at least one.

PyTorch's default is one thread per core, and its OpenMP threads (libgomp here) wait for each other by spinning: on
a machine where other processes hold cores, a thread descheduled by that work keeps the others of every parallel
region spinning at the barrier. The default job's training step on 2 AVX2-only AMD EPYC cores (mean s/step, two
threads against one; docs/getting_started.md has the table): 7.8 against 0.45 (the issue's author, a busy machine),
2.0 and 1.2 against 0.27 and 0.25 with one other busy process, 1.2 and 4.4 against 0.2-0.8 with two; with the cores
to itself two threads were ~1.3x faster (0.11 against 0.14). ``OMP_WAIT_POLICY=passive`` (honoured by this build)
cures the spinning but was no faster than one thread under load and slower idle (0.16), so it is not used.

:func:`choose` is the rule, a pure function of the machine's numbers; :func:`apply` reads them, applies the choice
to this process (and, through ``OMP_NUM_THREADS``, to the DDP ranks it starts) and returns the line train.py
logs. What the user sets wins: ``threads=N`` (conf/train.yaml), else ``OMP_NUM_THREADS``, else a
``torch.set_num_threads`` already made in this process. The choice is made once, at the start: a load that
arrives later is not followed.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

ENV = "OMP_NUM_THREADS"
# OMP_NUM_THREADS as the process started: what train.py itself sets for its DDP ranks (and a sweep's earlier job
# left) is not a user's choice
_STARTED_WITH = os.environ.get(ENV)
_applied: int | None = None  # what apply() last set (a sweep's earlier job): not a user's torch.set_num_threads


@dataclass(frozen=True)
class Machine:
    """What the rule reads. ``load``: the 1-minute load average; ``running``: runnable processes now (the 4th
    field of /proc/loadavg, this process included; None where unknown)."""

    cores: int
    load: float = 0.0
    running: int | None = None


@dataclass(frozen=True)
class Choice:
    threads: int
    why: str

    def line(self) -> str:
        return f"torch threads: {self.threads} ({self.why})"


# the share of a core other processes may hold before it counts as busy: a second thread gains at most ~1.3x on free
# cores, and a process holding a quarter to a half of a core already made two threads slower on average than one
# (0.17-1.15 s a step against 0.15, other jobs on the machine too)
BUSY_FROM = 0.3


def busy_cores(machine: Machine) -> int:
    """Cores other processes hold: the larger of the load average and the processes runnable now (minus this
    one; the load average lags a job started a minute ago, the running count is one instant), a core counted from
    :data:`BUSY_FROM` of it on."""
    others = max(machine.load, float((machine.running or 1) - 1))
    return min(machine.cores, math.floor(others + 1 - BUSY_FROM))


def choose(machine: Machine, setting: int | str = "auto", env: str | None = None, torch_threads: int | None = None,
           ranks: int = 1, option: str = "threads=N", previous: int | None = None) -> Choice:
    """Intra-op threads per process, and why.

    Args:
        setting: the ``threads`` key: a positive int, or ``auto``.
        env: ``OMP_NUM_THREADS`` as the user set it (None: unset).
        torch_threads: ``torch.get_num_threads()`` when this process already set it itself (None: it did not).
        ranks: processes training on this machine (DDP ranks): each gets its share of the free cores.
        option: how the user sets it, for the line (``threads=N``; the bench's ``--threads N``).
        previous: the threads a resumed run trained with so far (its checkpoint's): kept, so that the resumed run
            sums its floats in the same order as the run straight would (resume is exact).
    """
    if setting != "auto":
        return Choice(int(setting), f"threads={setting}")
    if env is not None and env.strip().isdigit() and int(env) >= 1:
        return Choice(int(env), f"{ENV}={env.strip()}; {option} overrides it")
    if torch_threads is not None:
        return Choice(torch_threads, f"torch.set_num_threads before the run; {option} overrides it")
    if isinstance(previous, int) and not isinstance(previous, bool) and previous >= 1:
        return Choice(previous, f"as the run's earlier part: a resumed run keeps them, so that it continues exactly; "
                                f"set {option} to choose")
    busy = busy_cores(machine)
    share = max(1, (machine.cores - busy) // max(1, ranks))
    others = (machine.running or 1) - 1
    now = f" and {others} other process{'es' if others > 1 else ''} running" if others > machine.load else ""
    per = f", shared by {ranks} ranks" if ranks > 1 else ""
    return Choice(share, f"load {machine.load:.1f}{now} on {machine.cores} cores{per}; set {option} to choose")


def read_machine() -> Machine:
    """This machine's numbers: the cores this process may run on (its affinity), the load, the running count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    running = None
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        pass
    return Machine(cores=cores, load=load, running=running)


def physical_cores() -> int | None:
    """Cores (not hardware threads) among the CPUs this process may run on, from /proc/cpuinfo; None if unknown."""
    try:
        allowed = os.sched_getaffinity(0)
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except (AttributeError, OSError):
        return None
    found, cpu, package = set(), None, "0"
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            cpu, package = int(value), "0"
        elif key == "physical id":
            package = value
        elif key == "core id" and cpu in allowed:
            found.add((package, value))
    return len(found) or None


def _set_by_torch_user(cores: int) -> int | None:
    """``torch.get_num_threads()`` if code in this process changed it from torch's default (one per core, or per
    physical core where MKL sets it), None if torch is not imported yet or has its default."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    n = torch.get_num_threads()
    return None if n in (cores, physical_cores(), _applied) else n


def ranks_of(trainer_cfg) -> int:
    """The processes a trainer config starts on this machine: its ``devices`` when it names a count or a list."""
    devices = trainer_cfg.get("devices", 1) if trainer_cfg is not None else 1
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 1:
        return devices
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    return 1


def apply(setting: int | str = "auto", ranks: int = 1, previous: int | None = None) -> Choice:
    """Choose (:func:`choose`) and set the threads of this process and of the processes it starts (DDP ranks
    read ``OMP_NUM_THREADS``; so does Lightning, which would otherwise give each rank cores / ranks)."""
    global _applied
    machine = read_machine()
    env = _STARTED_WITH
    choice = choose(machine, setting, env, None if env is not None else _set_by_torch_user(machine.cores), ranks,
                    previous=previous)
    os.environ[ENV] = str(choice.threads)
    import torch

    torch.set_num_threads(choice.threads)
    _applied = choice.threads
    return choice
