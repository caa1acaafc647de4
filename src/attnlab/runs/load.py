"""Load a task from a checkpoint (:func:`load_task`, the one loader of the inference entry points) and find the
checkpoint a training run continues from (:func:`for_training`): each from the one read of the file
(:mod:`attnlab.checkpoints.read`), refusing a file of another model family with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra

from ..checkpoints.read import (
    TrustedCheckpoint,
    model_config,
    check_callback_paths,
    read_trusted,
)
from ..core.errors import CheckpointError
from ..files.folder_paths import names_a_local_checkpoint


def _family(task_class: str, default_entry: str = "") -> tuple[str, str]:
    """(what the user calls the family of ``task_class``, the entry point that serves it), from the registry."""
    from ..families import for_task

    family = for_task(task_class)
    return (family.what, family.serves) if family else (task_class.rsplit(".", 1)[-1], default_entry)


def _task_class(ckpt: dict, path: Path, expected: type | str, what: str) -> type:
    """The task class of a checkpoint :func:`read_trusted` read (so one of the project's own), of the family this
    entry point serves."""
    name = ckpt.get("task_class")
    if not name or not isinstance(name, str):
        raise CheckpointError(f"{path} is not a {what} checkpoint written by attnlab's train.py")
    task_cls = hydra.utils.get_class(name)
    if isinstance(expected, str):
        expected = hydra.utils.get_class(expected)
    if not issubclass(task_cls, expected):
        family, entry = _family(name, "its own entry point")
        raise CheckpointError(f"{path} is {family} checkpoint, not a {what} checkpoint; use {entry}")
    return task_cls


def build_task(task_cls: type, ckpt: dict, path: str | Path, device: str = "cpu"):
    """The task rebuilt from the checkpoint :func:`read_trusted` read (never from the file again: what was checked
    is what is built), its weights loaded strictly (:meth:`Task.from_checkpoint`), after what a damaged file can get
    wrong: a net too big for this machine, a value out of range, a required argument missing. The build then has
    nothing to guard: an error from inside it is a bug (it keeps its traceback), or a part's own one-line refusal."""
    import inspect

    from .model_memory import net_memory_problem
    from .validate import model_value_problems

    hparams = model_config(ckpt, path)
    # the sizes are the file's: a model too big for this machine is one line, not an allocation failure
    too_big = net_memory_problem(hparams["net"], "gpu" if str(device).startswith("cuda") else "cpu",
                                 bytes_per_parameter=4, what="its float32 weights need",
                                 to_fix="a damaged checkpoint, or one for a bigger machine")
    if too_big:
        raise CheckpointError(f"{path}: {too_big}")
    hparams = task_cls.arguments_from(hparams)
    problems = model_value_problems(hparams)
    try:
        inspect.signature(task_cls).bind(**hparams)
    except TypeError as e:  # a required argument missing
        problems.append(str(e))
    if problems:
        raise CheckpointError(f"{path}: cannot build {task_cls.__name__} from its hyper_parameters (damaged?): "
                              f"{problems[0]}")
    return task_cls.from_checkpoint(ckpt, path).to(device)


def load_task(path: str | Path, expected: type | str, what: str, device: str = "cpu",
              trusted: TrustedCheckpoint | None = None) -> tuple[object, dict]:
    """``(task in eval mode, raw checkpoint dict)``; ``expected`` is the task base class this entry point serves
    (or its import path: imported only once the file has been read, so a bad file is refused before Lightning is
    imported, seconds sooner), ``what`` names it in errors ("language-model", "translation").

    Nothing named in the file is imported before it is checked (:func:`read_trusted`); a tokenizer the task needs
    must be there and readable; the weights must fit the model. Each refusal is one line naming the file."""
    trusted = trusted or read_trusted(path)  # (given: the caller's own read of ``path``, not read again)
    ckpt, path = trusted.contents, trusted.path
    task_cls = _task_class(ckpt, path, expected, what)
    model_config(ckpt, path)
    for key in getattr(task_cls, "checkpoint_keys", ()):
        check_tokenizer(ckpt.get(key), path, key)
    task = build_task(task_cls, ckpt, path, device)
    return task.eval(), ckpt


def check_tokenizer(text: Any, path: str | Path, key: str = "tokenizer") -> None:
    """A checkpoint's tokenizer (the JSON text train.py stores) must be there; one line otherwise. It is read back
    once, by the task (:func:`attnlab.tasks.base.saved_tokenizer`)."""
    if not isinstance(text, str) or not text:
        raise CheckpointError(f"{path} has no {key} (the model's vocabulary; damaged, or saved without its data "
                              f"module): its output could not be decoded")


def for_training(path: str | Path | None, model_cfg: Any, option: str) -> TrustedCheckpoint | None:
    """The checkpoint ``train.py ckpt_path=`` / ``resume=`` (``option``) continues from, read once and trusted:
    intact (a damaged one names an intact one next to it), data (every ``_target_`` and its ``task_class``
    allowed), its callback states naming only files of their own folder, and of the family ``model_cfg`` builds;
    one line otherwise. Needs no model, so it runs before Lightning is imported; whether the weights fit is checked
    once the model is built (:meth:`TrustedCheckpoint.check_fits`). None for a name Lightning resolves itself
    (``last``, a URL)."""
    if not names_a_local_checkpoint(path):
        return None
    trusted = read_trusted(path, option)
    path, ckpt = trusted.path, trusted.contents
    name = trusted.task_class
    if name is None:
        raise CheckpointError(f"{path} names no task_class: not a checkpoint written by attnlab's train.py")
    model_config(ckpt, path)
    check_callback_paths(ckpt, path)
    want = model_cfg.get("_target_") if isinstance(model_cfg, Mapping) else None
    if want and name != want:
        family, mine = _family(name)[0], _family(str(want))[0]
        raise CheckpointError(f"{path} is {family} checkpoint ({name.rsplit('.', 1)[-1]}), but this run builds "
                              f"{mine} ({str(want).rsplit('.', 1)[-1]}): choose its model= (see its run's "
                              f".hydra/overrides.yaml)")
    return trusted
