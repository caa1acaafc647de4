"""Whether a state dict fits a model, checked before the strict ``load_state_dict``: one line naming the file and
the first difference instead of PyTorch's list of every mismatch (the tasks' own loads and the checkpoint loader
share it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError


def _shape(t: Any) -> str:
    shape = tuple(getattr(t, "shape", ()))
    return "x".join(map(str, shape)) or "a scalar"


def check_fits(model: torch.nn.Module, state_dict: Any, path: str | Path) -> None:
    """Refuse in one line a state dict that does not fit ``model`` (another size, other parts, keys missing or
    extra), as the strict ``load_state_dict`` would, naming the file and the first difference; keys of an earlier
    layout are expected renamed already (``Task.on_load_checkpoint``)."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{path} holds no state_dict (the weights): damaged, or not written by train.py")
    own = model.state_dict()
    hint = ("; it was trained with other model settings: give the overrides of its run "
            "(<run>/.hydra/overrides.yaml), or a checkpoint of this model")
    for key, value in own.items():
        if key in state_dict and tuple(getattr(state_dict[key], "shape", ())) != tuple(getattr(value, "shape", ())):
            raise CheckpointError(f"{path} does not fit this model: size mismatch for {key}: checkpoint "
                                  f"{_shape(state_dict[key])}, this model {_shape(value)}{hint}")
    missing = [k for k in own if k not in state_dict]
    extra = [k for k in state_dict if k not in own]
    for keys, verdict in ((missing, "this model has {} that the checkpoint lacks"),
                          (extra, "the checkpoint has {} that this model lacks")):
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise CheckpointError(f"{path} does not fit this model: {verdict.format(keys[0] + more)}{hint}")
