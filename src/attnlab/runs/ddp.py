"""DDP that also works inside Hydra multirun sweeps.

Lightning's DDP (``strategy=ddp``) starts ranks 1..N-1 by running the script again. Under Hydra it re-runs
``sys.argv`` plus ``hydra.run.dir=<run.dir>``; inside ``-m`` that argv is the whole sweep, so every child starts
its own sweep (duplicate output dirs, hangs: Lightning issue 18175). Two fixes:

1. :func:`hydra_child_command` replaces Lightning's command builder: a child re-runs the *current job's* saved,
   fully composed config (``<job dir>/.hydra/config.yaml``) as a single run in the same directory, writing no
   Hydra output of its own. That is exactly one job, whether the parent is a single run or one job of a sweep.
2. :func:`distributed_job` wraps every job: afterwards it destroys the process group (keeping its name used, so a
   sweep's next job on several nodes meets the others under a new one) and restores the
   rendezvous variables. Lightning's launcher writes ``LOCAL_RANK=0``, ``WORLD_SIZE``, ``MASTER_PORT`` … into the
   launching process's environment; left there, the next job of the sweep would believe an outside launcher
   (torchrun, SLURM) had started its ranks, start no children, and wait for them forever.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..core.quoting import hydra_value


def hydra_child_command(local_rank: int) -> tuple[Sequence[str], str]:
    import __main__
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd

    hc = HydraConfig.get()
    job_dir = hc.runtime.output_dir
    if __main__.__spec__ is None:
        command = [sys.executable, os.path.abspath(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    if hc.output_subdir is not None:  # the job's composed config was saved: run exactly that
        command += ["-cp", os.path.join(job_dir, hc.output_subdir), "-cn", "config.yaml"]
    else:  # nothing saved: fall back to the job's own overrides (never the sweep's argv)
        command += list(hc.overrides.task)
    # quoted for Hydra's override parser: a run folder with a comma (a sweep list to Hydra), parentheses, spaces or
    # quotes in its path made the child fail to parse its command line, and Lightning then killed the process group
    command += [f"hydra.run.dir={hydra_value(job_dir)}", "hydra.output_subdir=null",
                f"hydra.job.name=ddp_rank{local_rank}"]
    return command, get_original_cwd()


def launching_process() -> bool:
    """Rank 0, read from the environment the way Lightning's ``rank_zero_only`` reads it (without importing
    Lightning, which a refused command line should not pay for): torchrun/Lightning, SLURM, LSF."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return True


def outside_rank() -> str | None:
    """This process's rank when an outside launcher (torchrun on each node, SLURM, LSF) started it, else None."""
    return next((os.environ[k] for k in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK") if k in os.environ), None)


def check_world_size(trainer: dict) -> None:
    """Under torchrun: ``trainer.num_nodes × trainer.devices`` must be the processes torchrun started (its
    ``WORLD_SIZE``), else ConfigError, one line, on every rank; Lightning's own check is a traceback."""
    from ..core.errors import ConfigError

    world = os.environ.get("WORLD_SIZE")
    if "TORCHELASTIC_RUN_ID" not in os.environ or world is None or not world.isdigit():
        return
    nodes, devices = trainer.get("num_nodes", 1), trainer.get("devices", 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    if not (isinstance(nodes, int) and isinstance(devices, int)) or nodes * devices == int(world):
        return
    raise ConfigError(f"trainer.num_nodes={nodes} × trainer.devices={devices} = {nodes * devices} processes, but "
                      f"torchrun started {world} (WORLD_SIZE: --nnodes × --nproc-per-node); make them agree")


def _destroy_keeping_group_names(dist) -> None:
    """Destroy the process group; under torchrun's agent store, the next one gets names not used before.

    torch names the default group "0" again after a destruction, and torchrun's store outlives a job: in a sweep on
    several nodes the next job's rendezvous read the addresses the last job's group left there and connected to a
    closed port (gloo "Connection refused"). Every node runs the same jobs in the same order, so continuing the
    count gives every node the same fresh names."""
    from torch.distributed import distributed_c10d

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.destroy_process_group()
        return
    if not hasattr(distributed_c10d, "_world") or not hasattr(distributed_c10d._world, "group_count"):
        raise RuntimeError("torch.distributed has no _world.group_count: update attnlab/runs/ddp.py for this torch")
    count = distributed_c10d._world.group_count
    dist.destroy_process_group()
    distributed_c10d._world.group_count = count


# what gloo says when the process at the other end of a connection is gone (killed, its node lost)
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused")


def peer_lost(error: BaseException | None) -> str | None:
    """The one line for a collective that failed because another process of the run is gone (gloo's RuntimeError,
    raised inside Lightning's hooks), naming that process's address, or for a :class:`PeerError`; None for any
    other error. Every rank ends: the run cannot go on with a rank missing, and a sweep's next job would wait."""
    import re

    from ..core.errors import PeerError

    while error is not None:
        text = str(error)
        if isinstance(error, PeerError):
            return text
        if isinstance(error, RuntimeError) and any(s in text for s in _PEER_GONE):
            reason = next(s for s in _PEER_GONE if s in text)
            peer = re.search(r"\[([^\]]+)\]:(\d+)", text)
            where = f" (the process at {peer.group(1)}, port {peer.group(2)})" if peer else ""
            rank = os.environ.get("RANK", "?")
            return (f"a process of this distributed run is gone{where}: {reason} (gloo); rank {rank} stops too "
                    f"(that node's output says why)")
        error = error.__cause__ or error.__context__
    return None


RENDEZVOUS_TIMEOUT_ENV = "ATTNLAB_RDZV_TIMEOUT"  # seconds; python -m attnlab.torchrun passes its --rdzv-conf timeout


def meet_the_other_ranks(job: str) -> None:
    """Under torchrun with several processes: every rank of this run (``job``: a sweep's job number, or "run") says
    here that it passed its preflight, and waits for the others at most ATTNLAB_RDZV_TIMEOUT seconds (50).

    Lightning's own rendezvous waits 30 minutes for a rank that refused its setting, crashed or was never started,
    and one whose node's torchrun is gone waits as long; here it is one line naming the missing ranks and their
    nodes (:class:`PeerError`). Through torchrun's own store (its agent on node 0), under keys of this attempt."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from datetime import timedelta

    from torch.distributed import DistError, TCPStore

    from ..core.errors import PeerError

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    timeout = timedelta(seconds=float(os.environ.get(RENDEZVOUS_TIMEOUT_ENV, "50")))
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefix = f"attnlab/arrived/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{job}"
    try:
        # (the store is up when torchrun started this process: a connection that takes long finds it gone)
        store = TCPStore(addr, port, is_master=False, timeout=min(timeout, timedelta(seconds=10)))
        store.set(f"{prefix}/{rank}", "1")
        try:
            store.wait([f"{prefix}/{r}" for r in range(world)], timeout)
            return
        except DistError:
            missing = [r for r in range(world) if not store.check([f"{prefix}/{r}"])]
    except DistError as e:  # the store (node 0's torchrun) cannot be reached, or went away while waiting
        raise PeerError(f"rank {rank}: node 0's torchrun ({addr}:{port}) is gone ({str(e).splitlines()[0]}); this "
                        f"rank stops (node 0's output says why)") from None
    names = ", ".join(f"{r} (node {r // per_node})" for r in missing)
    raise PeerError(f"rank(s) {names} of this distributed run did not arrive within {timeout.total_seconds():.0f} s "
                    f"(refused, crashed or not started: that node's output says why); rank {rank} stops "
                    f"(attnlab.torchrun --rdzv-conf=timeout=<s> waits longer)")


def install() -> None:
    """Point Lightning's subprocess launcher at :func:`hydra_child_command` (idempotent)."""
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    # Both modules hold their own reference to the function (the Trainer's imports it from Fabric's).
    for module in (fabric_launcher, trainer_launcher):
        if not hasattr(module, "_hydra_subprocess_cmd"):
            raise RuntimeError(f"{module.__name__} has no _hydra_subprocess_cmd: update attnlab/runs/ddp.py for this Lightning")
        module._hydra_subprocess_cmd = hydra_child_command


_RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK")


@contextmanager
def distributed_job() -> Iterator[None]:
    """Run one job; then leave no process group and the rendezvous environment as it was before the job."""
    import torch.distributed as dist  # here, not at import: train.py refuses bad input before torch is imported

    saved = {k: os.environ.get(k) for k in _RENDEZVOUS_VARS}
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            _destroy_keeping_group_names(dist)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
