"""Read checkpoints written by train.py without ever running code from them, and load a task from one, refusing a
file of another model family with one line.

A ``.ckpt`` is a pickle: read with ``weights_only=False``, a file whose unpickling calls ``os.system`` runs its
command the moment it is loaded, before any check of what it holds. Every path that reads a checkpoint (the
``generate``/``translate``/``synthesize`` entry points, ``train.py`` test/``ckpt_path``/``resume``, the claims, the
notebooks) therefore goes through :func:`read_checkpoint` or :func:`verified` here, which load with
``weights_only=True``: PyTorch's restricted unpickler accepts tensors and plain containers only and refuses any
other global *before* calling it.

What train.py writes is plain already: the task's hyper-parameters are plain dicts (``train.build_model`` converts
the config), the tokenizer is a JSON string, the random state is tensors and tuples, callback and data-module states
are dicts of numbers. :data:`SAFE_GLOBALS` is the one place to allow-list a type should a checkpoint ever need one
(``tests/test_safe_checkpoints.py`` loads every family's checkpoint through here, so such a need shows up there).

Every checkpoint carries ``task_class`` (the LightningModule's import path, see ``Task.on_save_checkpoint``) and
its hyper-parameters, so the entry points need nothing but the file.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import hydra
import torch

from .errors import UserError

# Types the safe unpickler may build beyond tensors and plain containers. Empty: attnlab's checkpoints need none.
# Add a class here (never a function: a callable global is how a pickle runs code) only if train.py starts saving it.
SAFE_GLOBALS: list[type] = []
# Registered for the whole process, so Lightning's own loads (trainer.fit/test(ckpt_path=..., weights_only=True) in
# train.py, which imports this module) accept the same types as read_checkpoint.
torch.serialization.add_safe_globals(SAFE_GLOBALS)

# task class -> what the user would call it, and the entry point that serves it
FAMILIES = {
    "CausalLMTask": ("a language model", "generate.py"),
    "TranslationTask": ("a translation model", "translate.py"),
    "NATTranslationTask": ("a translation model", "translate.py"),
    "ImageClassificationTask": ("an image classifier", "train.py ckpt_path=... train=false"),
    "TTSTask": ("a text-to-speech model", "synthesize.py"),
    "SequenceClassificationTask": ("a sequence classifier", "train.py ckpt_path=... train=false"),
}

# Lightning's own names for a checkpoint (trainer.fit/test(ckpt_path="last"|"best"|...)): not files to check here
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc")


class CheckpointError(UserError, ValueError):
    """A missing, unreadable or wrong-family checkpoint; the message is one line for the user."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint whose unpickling would build something other than tensors and plain containers (run code)."""


def _load(path: Path, map_location: Any, mmap: bool = False) -> Any:
    return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


def _refusal(path: Path, error: Exception) -> CheckpointError:
    """The one-line CheckpointError for a file torch.load(weights_only=True) could not read."""
    text = str(error)
    # torch names the refused global as "Unsupported global: GLOBAL builtins.getattr" or, for a blocked module,
    # "unsupported GLOBAL posix.system whose module posix is blocked"
    refused = re.search(r"unsupported (?:global: )?GLOBAL (\S+)", text, flags=re.IGNORECASE)
    if refused:
        return UnsafeCheckpointError(
            f"{path} is not a safe attnlab checkpoint: loading it with weights_only=True refused "
            f"{refused.group(1)} (its unpickling would call code); nothing from it was run")
    if isinstance(error, pickle.UnpicklingError) or "WeightsUnpickler" in text:
        return CheckpointError(f"cannot read checkpoint {path}: not a PyTorch checkpoint file")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return CheckpointError(f"cannot read checkpoint {path} (truncated, or not a PyTorch checkpoint): "
                           f"{type(error).__name__}: {first}")


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict:
    """The checkpoint's contents, loaded with ``weights_only=True`` (never runs code from the file); a missing,
    unreadable or unsafe file is a one-line :class:`CheckpointError`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    try:
        ckpt = _load(path, map_location)
    except Exception as e:  # refused global, truncated file, not a torch file
        raise _refusal(path, e) from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by attnlab's train.py (it holds a "
                              f"{type(ckpt).__name__}, not a dict)")
    return ckpt


def verified(ckpt_path: str | Path | None) -> str | Path | None:
    """``ckpt_path`` unchanged once it is known to load with ``weights_only=True``; for ``trainer.fit/test(
    ckpt_path=verified(...), weights_only=True)``, so that an unsafe or broken file is one line, not Lightning's
    traceback. Memory-mapped where the file allows it, so checking a large checkpoint reads little of it."""
    if ckpt_path is None or str(ckpt_path) in LIGHTNING_CKPT_NAMES or "://" in str(ckpt_path):
        return ckpt_path
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    try:
        _load(path, "cpu", mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise _refusal(path, e) from None
        read_checkpoint(path)  # a legacy (non-zip) torch file cannot be memory-mapped: read it whole
    except Exception as e:
        raise _refusal(path, e) from None
    return ckpt_path


def load_task(path: str | Path, expected: type | str, what: str, device: str = "cpu") -> tuple[object, dict]:
    """``(task in eval mode, raw checkpoint dict)``; ``expected`` is the task base class this entry point serves
    (or its import path: imported only once the file has been read, so a bad file is refused before Lightning is
    imported, seconds sooner), ``what`` names it in errors ("language-model", "translation")."""
    path = Path(path).expanduser()
    ckpt = read_checkpoint(path, device)
    name = ckpt.get("task_class")
    if not name or not isinstance(name, str):
        raise CheckpointError(f"{path} is not a {what} checkpoint written by attnlab's train.py")
    if not name.startswith("attnlab."):  # the class is imported below: only this project's own tasks
        raise CheckpointError(f"{path} names task_class {name!r}, not an attnlab task; not a {what} checkpoint")
    try:
        task_cls = hydra.utils.get_class(name)
    except Exception:
        raise CheckpointError(f"{path} names task_class {name!r}, which this attnlab does not have") from None
    if isinstance(expected, str):
        expected = hydra.utils.get_class(expected)
    if not issubclass(task_cls, expected):
        family, entry = FAMILIES.get(task_cls.__name__, (task_cls.__name__, "its own entry point"))
        raise CheckpointError(f"{path} is {family} checkpoint, not a {what} checkpoint; use {entry}")
    task = task_cls.load_from_checkpoint(path, map_location=device, weights_only=True)
    return task.eval(), ckpt
