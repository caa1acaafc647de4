"""Where a checkpoint stands in training, recorded by this project, and Lightning's loop state rebuilt from it.

Lightning 2.6 saves its loops' progress counters and, on loading, guesses from them where training stopped. Its
guesses are right for one kind of checkpoint only, one written in ``on_train_batch_end`` inside an epoch. For the
others it skips or repeats work (docs/reliability.md, "Exact resume"):

* written at the end-of-epoch validation (``ModelCheckpoint``'s default): the resumed run marks the epoch as done,
  then skips the next epoch's training too (``_TrainingEpochLoop`` restarts "on last" with the old epoch's batch
  counters, which already count a full epoch) — the run loses an epoch;
* written at ``on_train_epoch_end`` with ``max_steps`` set: the fit loop always "restarts" and runs the epoch-end
  branch again, without training;
* written in the epoch's last ``on_train_batch_end``: the epoch is marked done and its validation never runs.

So every checkpoint also carries :func:`record` (``checkpoint["loop_position"]``): the epoch, how many of its
batches have stepped, whether the epoch (its validation and epoch-end hooks included) is complete, the global step
and the logging step. On loading, :func:`rewrite_loops` replaces the loop counters with one of two states whose
restart Lightning does get right:

* ``mid-epoch``: exactly what Lightning itself writes in ``on_train_batch_end`` of batch ``n`` (``0 < n < N``);
* ``epoch start``: epoch ``E`` about to begin, as if the previous epoch had just ended (every epoch counter ``E``,
  the batch counters of the epoch at 0); :class:`~attnlab.callbacks.exact_resume.ExactResume` also clears the
  fit loop's "restarting" flag that ``max_steps`` forces, so the epoch starts as it does in an uninterrupted run.

A checkpoint without the record is placed from its loop counters (:func:`from_checkpoint`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

KEY = "loop_position"
# torch's intra-op threads the run trained with: a resumed part keeps them (the order of a float sum depends on them)
THREADS_KEY = "torch_threads"


@dataclass(frozen=True)
class Position:
    epoch: int  # the epoch to continue: the one in progress, or the next one when ``batches_done`` is 0
    batches_done: int  # batches of that epoch whose training step ran
    global_step: int
    batches_stepped: int  # Lightning's logging step (``_batches_that_stepped``) after those batches
    total_batches: int  # training batches run in all epochs so far

    @property
    def mid_epoch(self) -> bool:
        return self.batches_done > 0


def record(trainer) -> dict[str, Any]:
    """The position of a checkpoint written now (any hook of ``fit``)."""
    fit = trainer.fit_loop
    ep = fit.epoch_progress.current
    loop = fit.epoch_loop
    bp = loop.batch_progress
    n = int(bp.current.processed)
    stepped = int(loop._batches_that_stepped)
    inside = ep.processed < ep.started  # the epoch's training loop (with its end-of-epoch validation) still runs
    if inside and n and not loop._should_accumulate():
        stepped += 1  # the loop adds this batch to the logging step after the hooks that may save (validation)
    total = int(bp.total.processed)
    limit = trainer.num_training_batches
    complete = bool(bp.is_last_batch) or (isinstance(limit, (int, float)) and math.isfinite(limit) and n >= limit)
    pos = Position(*_place(int(ep.started), inside, n, complete), int(trainer.global_step), stepped, total)
    return asdict(pos)


def _place(started: int, inside: bool, n: int, complete: bool) -> tuple[int, int]:
    """``(epoch, batches_done)`` from the number of epochs started, whether the last one's training loop still
    runs, how many of its batches stepped and whether that was all of them."""
    if started == 0:
        return 0, 0
    epoch = started - 1
    if complete or (n == 0 and not inside):
        return epoch + 1, 0  # the epoch is over (a stop at its last batch or in its validation included)
    return epoch, n  # inside it, or cut short (max_steps, a preemption): continue it after batch n


def from_checkpoint(checkpoint: dict) -> Position | None:
    """The checkpoint's position: its record, else read from Lightning's counters (a checkpoint without one)."""
    saved = checkpoint.get(KEY)
    if isinstance(saved, dict):
        try:
            return Position(**{k: int(saved[k]) for k in Position.__dataclass_fields__})
        except (KeyError, TypeError, ValueError):
            pass
    try:
        fit = checkpoint["loops"]["fit_loop"]
        ep = fit["epoch_progress"]["current"]
        bp = fit["epoch_loop.batch_progress"]
        n, stepped = int(bp["current"]["processed"]), int(fit["epoch_loop.state_dict"]["_batches_that_stepped"])
        total, step = int(bp["total"]["processed"]), int(checkpoint.get("global_step", 0))
    except (KeyError, TypeError, ValueError):
        return None
    inside = ep["processed"] < ep["started"]
    if inside and n:
        stepped += 1
    return Position(*_place(int(ep["started"]), inside, n, bool(bp.get("is_last_batch"))), step, stepped, total)


def rewrite_loops(checkpoint: dict, pos: Position) -> None:
    """Replace the fit loop's counters in ``checkpoint`` with the canonical state of ``pos`` (see the module)."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop")
    if not isinstance(fit, dict):
        return
    e, n, total = pos.epoch, pos.batches_done, pos.total_batches
    if n:  # Lightning's own on_train_batch_end checkpoint of batch n: epoch e started, its batch n stepped
        epochs = {"ready": e + 1, "started": e + 1, "processed": e, "completed": e}
        batches = {"current": {"ready": n, "started": n, "processed": n, "completed": n - 1},
                   "total": {"ready": total, "started": total, "processed": total, "completed": total - 1}}
        # Lightning adds the batch to the logging step again when it restarts here (unless it accumulates)
        stepped = pos.batches_stepped - 1
    else:  # epoch e about to start
        epochs = {"ready": e, "started": e, "processed": e, "completed": e}
        batches = {"current": {"ready": 0, "started": 0, "processed": 0, "completed": 0},
                   "total": {"ready": total, "started": total, "processed": total, "completed": total}}
        stepped = pos.batches_stepped
    fit["epoch_progress"] = {"current": dict(epochs), "total": dict(epochs)}
    fit["epoch_loop.batch_progress"] = {**batches, "is_last_batch": False}
    zero = {"ready": 0, "started": 0, "processed": 0, "completed": 0}
    fit["epoch_loop.val_loop.batch_progress"] = {"current": dict(zero), "total": dict(zero), "is_last_batch": False}
    state = fit.get("epoch_loop.state_dict")
    fit["epoch_loop.state_dict"] = {**(state if isinstance(state, dict) else {}), "_batches_that_stepped": stepped}
