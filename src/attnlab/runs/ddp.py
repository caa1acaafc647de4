"""DDP that also works inside Hydra multirun sweeps.

Lightning's DDP (``strategy=ddp``) starts ranks 1..N-1 by running the script again. Under Hydra it re-runs
``sys.argv`` plus ``hydra.run.dir=<run.dir>``; inside ``-m`` that argv is the whole sweep, so every child starts
its own sweep (duplicate output dirs, hangs: Lightning issue 18175). Two fixes:

1. :func:`hydra_child_command` replaces Lightning's command builder: a child re-runs the *current job's* saved,
   fully composed config (``<job dir>/.hydra/config.yaml``) as a single run in the same directory, writing no
   Hydra output of its own. That is exactly one job, whether the parent is a single run or one job of a sweep.
2. :func:`distributed_job` wraps every job: afterwards it destroys the process group and restores the
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
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
