"""Load a task from a checkpoint written by train.py, refusing one of another model family with one line.

Every checkpoint carries ``task_class`` (the LightningModule's import path, see ``Task.on_save_checkpoint``) and
its hyper-parameters, so the entry points (``generate``, ``translate``, ``synthesize``) need nothing but the file.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from .errors import UserError

# task class -> what the user would call it, and the entry point that serves it
FAMILIES = {
    "CausalLMTask": ("a language model", "generate.py"),
    "TranslationTask": ("a translation model", "translate.py"),
    "NATTranslationTask": ("a translation model", "translate.py"),
    "ImageClassificationTask": ("an image classifier", "train.py ckpt_path=... train=false"),
    "TTSTask": ("a text-to-speech model", "synthesize.py"),
}


class CheckpointError(UserError, ValueError):
    """A missing, unreadable or wrong-family checkpoint; the message is one line for the user."""


def load_task(path: str | Path, expected: type, what: str, device: str = "cpu") -> tuple[object, dict]:
    """``(task in eval mode, raw checkpoint dict)``; ``expected`` is the task base class this entry point serves,
    ``what`` names it in errors ("language-model", "translation")."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # truncated or not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    name = ckpt.get("task_class") if isinstance(ckpt, dict) else None
    if not name:
        raise CheckpointError(f"{path} is not a {what} checkpoint written by attnlab's train.py")
    task_cls = hydra.utils.get_class(name)
    if not issubclass(task_cls, expected):
        family, entry = FAMILIES.get(task_cls.__name__, (task_cls.__name__, "its own entry point"))
        raise CheckpointError(f"{path} is {family} checkpoint, not a {what} checkpoint; use {entry}")
    task = task_cls.load_from_checkpoint(path, map_location=device, weights_only=False)
    return task.eval(), ckpt
