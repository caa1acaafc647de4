"""Checkpoints written atomically, and a full disk reported in one line with nothing already written lost.

Lightning's default writer streams ``torch.save`` straight into the target file: a disk that fills up half-way
through overwriting ``last.ckpt`` leaves a truncated file and no good checkpoint at all. Here every checkpoint goes
to a temporary file in the same folder, is flushed to disk, and only then renamed over the target (``os.replace``
is atomic on POSIX), so the target is always either the old complete file or the new complete one. A failed write
removes its temporary file and raises :class:`CheckpointWriteError`, which ``train.py`` prints as one line (exit 1);
a full disk is a :class:`~attnlab.core.errors.DiskFullError` naming the space needed and free (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from .atomic import disk_full, open_new, temporary_name
from ..core.errors import CheckpointWriteError  # noqa: F401  (raised here; defined without Lightning for train.py)


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # remote filesystems (s3://, gs://): Lightning's fsspec writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        tmp = temporary_name(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open_new(tmp) as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # torch's zip writer reports a failed write as RuntimeError
            try:
                tmp.unlink(missing_ok=True)
            finally:
                full = disk_full(e, path, _tensor_bytes(checkpoint))
            if full is not None:
                raise full from None  # one line, exit 2
            reason = (getattr(e, "strerror", None) or str(e)).splitlines()[0]
            raise CheckpointWriteError(
                f"cannot write checkpoint {path}: {reason}; the checkpoints already in {path.parent} are kept"
            ) from None


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a checkpoint (about its size on disk)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0
