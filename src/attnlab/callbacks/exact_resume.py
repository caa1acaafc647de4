"""Every checkpoint records where training stood; a run resumed from it continues from exactly there.

Added to every run by ``train.py`` (like Lightning's own checkpointing, it is not a callback one chooses): on saving
it stores :func:`attnlab.checkpoints.loop_position.record` in the checkpoint; on loading it rewrites Lightning's loop counters
into a state whose restart Lightning gets right (:func:`attnlab.checkpoints.loop_position.rewrite_loops`), tells a data module
with :class:`~attnlab.data.loading.MidEpochResume` where its epoch continues, and, when training continues at the
start of an epoch, clears the "restarting" flag that Lightning forces whenever ``max_steps`` is set (its restart
branch would run that epoch's end again instead of training it). See docs/reliability.md, "Exact resume".
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch

from ..checkpoints import loop_position

log = logging.getLogger(__name__)

METRICS_KEY = "logged_metrics"
RANKS_RNG_KEY = "rng_states_per_rank"


def restored_metrics(trainer: L.Trainer) -> dict[str, float]:
    """The metrics a resumed run's checkpoint carried (empty for a run that was not resumed)."""
    return next((dict(cb.restored_metrics) for cb in trainer.callbacks if isinstance(cb, ExactResume)), {})


class ExactResume(L.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.resumed_at: loop_position.Position | None = None
        self.restored_metrics: dict[str, float] = {}  # the metrics logged up to the checkpoint resumed from

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == "fit":
            checkpoint[loop_position.KEY] = loop_position.record(trainer)
            checkpoint[loop_position.THREADS_KEY] = torch.get_num_threads()
            # so that a run resumed after its training ended still reports them (metrics.json, the sweep's value)
            checkpoint[METRICS_KEY] = {k: float(v) for k, v in trainer.callback_metrics.items()}
            if trainer.world_size > 1:
                # every rank's random state (ranks draw different amounts: batches of different shapes); the task
                # saves only this rank's (rank 0 writes the file). Collective: every rank dumps every checkpoint.
                import random

                import torch.distributed as dist

                states: list[Any] = [None] * trainer.world_size
                dist.all_gather_object(states, {"torch": torch.get_rng_state(), "python": random.getstate()})
                checkpoint[RANKS_RNG_KEY] = states

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != "fit":
            return
        pos = loop_position.from_checkpoint(checkpoint)
        if pos is None:
            return
        self.resumed_at = pos
        per_rank = checkpoint.get(RANKS_RNG_KEY)
        if isinstance(per_rank, list) and len(per_rank) == trainer.world_size and hasattr(pl_module, "_pending_rng"):
            pl_module._pending_rng = per_rank[trainer.global_rank]  # Task restores it at the first training step
        metrics = checkpoint.get(METRICS_KEY)
        if isinstance(metrics, dict):
            self.restored_metrics = {str(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        loop_position.rewrite_loops(checkpoint, pos)
        datamodule = getattr(trainer, "datamodule", None)
        if hasattr(datamodule, "resume_from"):
            datamodule.resume_from(pos.epoch, pos.batches_done)
        where = f"batch {pos.batches_done} of epoch {pos.epoch}" if pos.mid_epoch else f"the start of epoch {pos.epoch}"
        log.info(f"resuming at {where} (global step {pos.global_step})")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pos, self.resumed_at = self.resumed_at, None
        if pos is None or pos.mid_epoch:
            return
        # At an epoch start nothing is half done: run it as an uninterrupted run does. With max_steps set, Lightning
        # keeps the loops "restarting" after any load (fit_loop.restarting's setter) and its epoch loop then treats
        # the epoch as one that ended before the checkpoint (RESTARTED_ON_LAST): no training on the first pass.
        fit = trainer.fit_loop
        try:
            from lightning.pytorch.loops.loop import _Loop

            _Loop.restarting.fset(fit, False)
            fit.reset_restart_stage()
            fit.epoch_loop.reset_restart_stage()
            fit.epoch_loop.val_loop.reset_restart_stage()
        except AttributeError:  # another Lightning: its own restart logic applies
            log.warning("ExactResume: this Lightning's loops differ from 2.6's; the resumed epoch start may not be exact")
