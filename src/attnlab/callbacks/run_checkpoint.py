"""``ModelCheckpoint`` whose ``last.ckpt`` is always the newest state, written where a resume is exact.

Lightning 2.6's ``ModelCheckpoint`` rewrites ``last.ckpt`` only when it also saved a top-k checkpoint, i.e. only
when the monitored metric improved: after a worse epoch ``last.ckpt`` keeps an older state, ``resume=`` retrains
from there and ``ckpt=.../last.ckpt`` serves old weights. And by default it saves at the end of the validation,
inside the epoch's training loop, a point whose restart Lightning gets wrong (see :mod:`attnlab.checkpoints.loop_position`).

Here, at the end of every training epoch (after its validation, when every other callback's epoch-end hook ran):

* the top-k checkpoints (``epoch_NNN.ckpt``; ``save_top_k: 1``: the best epoch by the monitored metric, what the
  test phase uses) are updated if the epoch was complete and validated;
* ``last.ckpt`` is written whatever the metric did.

Two files for one state (``epoch_NNN.ckpt`` and ``last.ckpt``) cannot be written at once, so the pair is
journaled: ``last.ckpt`` is written first, carrying the names of the top-k files that are copies of it and of the
top-k file it supersedes; then the copy is made (a copy of the bytes, not a hard link: damage to one file in place
must leave the other intact, the fallback a damaged ``last.ckpt`` is refused with) and the old file removed. A run
killed in between is repaired when it is resumed from that ``last.ckpt``: the missing copy is made, the superseded
file removed, so the resumed run ends with the same set of checkpoints as one run straight.

The file paths in a checkpoint's state are input (a run folder is copied, moved, shared): each is used only as a
plain ``.ckpt`` name inside the folder the checkpoint was written to (:func:`attnlab.files.folder_paths.name_in`), and
then as that name in this run's checkpoint folder. A checkpoint resumed from this folder (``resume=``, or a run
folder moved or copied before it was resumed) keeps its top-k bookkeeping there; one from another folder
(``ckpt_path=`` of another run) starts it afresh, so nothing of the other run's folder is tested, copied or
removed.

A step-triggered save (``every_n_train_steps``) that falls on an epoch's last batch is left to that epoch's end, so
no checkpoint is ever written between an epoch's last step and its validation. The callback state is stored under
``ModelCheckpoint``'s key, so runs checkpointed before keep their best-model bookkeeping when resumed.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from ..checkpoints import loop_position
from ..files.atomic import write_atomic
from ..files.folder_paths import CHECKPOINT_PATH_FIELDS, name_in

log = logging.getLogger(__name__)


class RunCheckpoint(ModelCheckpoint):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["save_on_train_epoch_end"] = True  # the only place it saves at an epoch's end (see the module)
        super().__init__(*args, **kwargs)
        self._validated = False
        self._last_position: dict | None = None
        self._journal: dict[str, list[str]] | None = None  # top-k writes and removals decided, not yet done
        self._pending: dict[str, list[str]] = {}  # saved with last.ckpt: its copies to make, files to remove
        self._restored_here = False  # the checkpoint being restored lies in this run's checkpoint folder

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pending": self._pending}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Finish the top-k update that the checkpoint being resumed announced, if the run stopped before it."""
        source = trainer.ckpt_path
        self._restored_here = bool(source) and self.dirpath is not None and \
            Path(source).resolve().parent == Path(self.dirpath).resolve()
        state = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        pending = _in_this_folder(state.get("pending") or {}, state.get("dirpath"), self.dirpath)
        if not self._restored_here or trainer.state.fn != "fit" or not trainer.is_global_zero:
            return
        if not Path(source).is_file():
            return
        for path in pending.get("copies", []):
            if not Path(path).is_file():
                log.info(f"writing {Path(path).name}: the stopped run had not written this copy of {source}")
                _copy(Path(source), Path(path))
        for path in pending.get("delete", []):
            if Path(path).is_file() and Path(path).resolve() != Path(source).resolve():
                log.info(f"removing {Path(path).name}: the stopped run had not removed it (no longer top-k)")
                Path(path).unlink()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's bookkeeping (best score, top-k files, last file), its paths moved into this run's checkpoint
        folder; none of it from a checkpoint of another folder."""
        if not self._restored_here:
            return
        here = _in_this_folder(state_dict, state_dict.get("dirpath"), self.dirpath)
        super().load_state_dict({**state_dict, **here, "dirpath": self.dirpath})

    def _generate_state_key(self, **kwargs: Any) -> str:
        return f"ModelCheckpoint{kwargs!r}"  # Lightning's key: checkpoints of either class restore each other

    def note_last_saved(self, trainer: L.Trainer) -> None:
        """Another callback (PreemptionCheckpoint) wrote ``last.ckpt`` at this position: nothing to write again."""
        self._last_position = loop_position.record(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        epoch_loop = trainer.fit_loop.epoch_loop
        if getattr(epoch_loop, "_num_ready_batches_reached", lambda: False)():
            return  # the epoch's last batch: its validation follows, and the save at the epoch's end
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        candidates = self._monitor_candidates(trainer)
        complete = not loop_position.record(trainer)["batches_done"]
        fresh = self.monitor is None or self._validated
        journal: dict[str, list[str]] = {"copies": [], "delete": []}
        if complete and fresh and self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._journal = journal
            try:  # Lightning's top-k bookkeeping, with its writes and removals recorded instead of done
                self._save_topk_checkpoint(trainer, candidates)
            finally:
                self._journal = None
        if not (journal["copies"] or journal["delete"]):
            self._save_last_checkpoint(trainer, candidates)
            return
        if not self.save_last:  # no last.ckpt to copy: write the top-k files themselves
            for path in journal["copies"]:
                super()._save_checkpoint(trainer, path)
        else:
            self._pending = journal
            try:
                self._save_last_checkpoint(trainer, candidates, force=True)
            finally:
                self._pending = {}
            if trainer.is_global_zero:
                for path in journal["copies"]:
                    _copy(Path(self.last_model_path), Path(path))
            trainer.strategy.barrier("RunCheckpoint.copies")
        for path in journal["delete"]:
            super()._remove_checkpoint(trainer, path)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if self._journal is None:
            return super()._save_checkpoint(trainer, filepath)
        self._journal["copies"].append(filepath)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if self._journal is None:
            return super()._remove_checkpoint(trainer, filepath)
        self._journal["delete"].append(filepath)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict, force: bool = False) -> None:
        if not self.save_last:
            return
        position = loop_position.record(trainer) if trainer.state.fn == "fit" else None
        if not force and position is not None and position == self._last_position and self.last_model_path:
            return  # this very state is already last.ckpt
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._last_position = position


def _in_this_folder(state: dict[str, Any], saved_dir: Any, dirpath: str | None) -> dict[str, Any]:
    """The path-valued fields of a saved ``ModelCheckpoint`` state (``state``: the whole state, or its ``pending``
    journal), each kept only as a ``.ckpt`` name of the folder it was saved in (``saved_dir``) and moved into
    ``dirpath``; any other value (elsewhere, ``..``, a URL) is left out, never acted on."""
    def moved(value: Any) -> str | None:
        name = name_in(str(saved_dir), value) if isinstance(saved_dir, str) and dirpath else None
        return str(Path(dirpath) / name) if name is not None and name.endswith(".ckpt") else None

    out: dict[str, Any] = {}
    for key in CHECKPOINT_PATH_FIELDS:
        if key in state:
            out[key] = moved(state[key]) or ""
    if isinstance(state.get("best_k_models"), dict):
        out["best_k_models"] = {m: v for k, v in state["best_k_models"].items() if (m := moved(k))}
    for key in ("copies", "delete"):
        if isinstance(state.get(key), list):
            out[key] = [m for v in state[key] if (m := moved(v))]
    return out


def _copy(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source`` (its own bytes), written beside it and renamed into place; a full
    disk is one line naming it (the files already there are kept)."""
    with open(source, "rb") as src:
        write_atomic(target, lambda f: shutil.copyfileobj(src, f, 1 << 20), needed=os.fstat(src.fileno()).st_size)
