"""A model exported from its checkpoint as a folder that holds no pickle (``python -m attnlab.export
format=safetensors``): what the inference entry points need, in formats any tool reads.

    model.safetensors   the task's weights (``net.*``: the state dict a checkpoint holds), in the dtype asked
    attnlab.json        the task class, its hyper-parameters (the net's config), the data settings, the dtype,
                        the epoch and step the weights are from
    tokenizer.json      the tokenizer, as the ``tokenizers`` library saves it (a model with one)

:func:`read_exported` turns the folder back into the dictionary a checkpoint read gives (without the training
state: no optimizer, loop or random-number state), so :func:`attnlab.checkpoints.read.read_trusted` checks it as
it checks a ``.ckpt`` (the task class and every ``_target_`` against the allow-list) and every entry point that
loads a checkpoint loads the folder too. Reading it runs no unpickler: JSON, and safetensors' header and bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointError, OptionError
from ..files.atomic import write_atomic

FORMAT = "attnlab-safetensors"
VERSION = 1
WEIGHTS, SETTINGS, TOKENIZER = "model.safetensors", "attnlab.json", "tokenizer.json"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # (torch's names: this module imports torch only to write)
INSTALL = 'pip install -e ".[weights]"'

# not settings: the training state (loops, optimizer, schedule, callbacks, random-number state), and what has a
# file of its own (the weights, the tokenizer); the epoch and step the weights are from stay (the explorer shows them)
NOT_SETTINGS = {"pytorch-lightning_version", "optimizer_states", "lr_schedulers",
                  "callbacks", "loops", "rng_states", "state_dict", "hparams_name", "datamodule_hparams_name",
                  "tokenizer"}


def is_exported(path: str | Path) -> bool:
    """``path`` is a folder holding an export's settings file."""
    path = Path(path).expanduser()
    return path.is_dir() and (path / SETTINGS).is_file()


def _safetensors_torch():
    try:
        import safetensors.torch
    except ImportError:
        raise CheckpointError(f"reading or writing model.safetensors needs the safetensors package: {INSTALL}") \
            from None
    return safetensors.torch


def exported_settings(ckpt: dict, dtype: str) -> dict:
    """The JSON of ``attnlab.json`` for checkpoint ``ckpt``: every entry but the training state and the data
    module's own loop state (Lightning keeps it under the data module's class name)."""
    kept = {k: v for k, v in ckpt.items() if k not in NOT_SETTINGS and not k[:1].isupper()}
    return {"format": FORMAT, "version": VERSION, "dtype": dtype, **kept}


def write_exported(ckpt: dict, out: Path, dtype: str = "fp32") -> list[Path]:
    """Write checkpoint ``ckpt`` (a trusted read's contents) as an export folder ``out`` (new, or empty); the files
    written. The folder is written beside ``out`` and renamed into place whole: an export that fails (a full disk)
    leaves no folder, and nothing in ``out`` is ever overwritten."""
    import os
    import shutil

    import torch

    st = _safetensors_torch()
    if dtype not in DTYPES:
        raise OptionError(f"dtype={dtype}: choose one of {', '.join(DTYPES)}")
    kind = getattr(torch, DTYPES[dtype])
    settings = json.dumps(exported_settings(ckpt, dtype), indent=1, sort_keys=True)  # (fails on a non-JSON value)
    # (cloned: tied weights share a tensor, which safetensors refuses to store twice)
    tensors = {k: v.detach().to(kind if v.is_floating_point() else v.dtype).clone().contiguous()
               for k, v in ckpt["state_dict"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        # (one metadata key: safetensors writes a map's keys in no fixed order, and an export's bytes should repeat)
        write_atomic(partial / WEIGHTS, st.save(tensors, metadata={"format": "pt"}))
        if isinstance(ckpt.get("tokenizer"), str):
            write_atomic(partial / TOKENIZER, ckpt["tokenizer"])
        write_atomic(partial / SETTINGS, settings + "\n")
        if out.is_dir():
            out.rmdir()  # empty (the caller checked): fails rather than replace anything put there since
        os.rename(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return [out / name for name in (WEIGHTS, TOKENIZER, SETTINGS) if (out / name).is_file()]


def read_exported(folder: Path) -> dict:
    """The export in ``folder`` as a checkpoint's dictionary (``state_dict``, ``tokenizer`` text, the settings);
    a missing, unreadable or damaged file is one line naming it."""
    try:
        settings = json.loads((folder / SETTINGS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{folder / SETTINGS} cannot be read (damaged?): {e}") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise CheckpointError(f"{folder / SETTINGS} is not an attnlab export (no \"format\": \"{FORMAT}\")")
    if settings.get("version") != VERSION:
        raise CheckpointError(f"{folder / SETTINGS}: export version {settings.get('version')!r}; this attnlab reads "
                              f"version {VERSION}")
    contents: dict[str, Any] = {k: v for k, v in settings.items() if k not in ("format", "version", "dtype")}
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights} is missing: the export is incomplete")
    st = _safetensors_torch()
    try:
        contents["state_dict"] = st.load_file(str(weights), device="cpu")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError (and OSError) for a bad file
        raise CheckpointError(f"{weights} cannot be read (damaged?): {str(e).splitlines()[0]}") from None
    if (folder / TOKENIZER).is_file():
        try:
            contents["tokenizer"] = (folder / TOKENIZER).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{folder / TOKENIZER} cannot be read: {e}") from None
    return contents
