"""``data=hf`` (conf/data/hf.yaml): a Hugging Face dataset read by the data module of the kind of data a family
reads (:func:`attnlab.families.hf_datamodule` looks the kind up).

Reading a dataset is :mod:`attnlab.data.hf_source`'s; this module only picks the data module, so that the data
modules import the reading functions and nothing imports back.
"""

from __future__ import annotations

import importlib
import inspect

from ..core.errors import ConfigError
from .hf_source import HF_DATA_MODULES


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# the data kinds (attnlab.families.DATA_KINDS) a Hugging Face dataset can give, and the data module that reads it
HF_READERS = {kind: _class(path) for kind, path in HF_DATA_MODULES.items()}


def hf_reader(kind: str, model: str, **options):
    """The data module of ``kind`` (a key of :data:`HF_READERS`) over a Hugging Face dataset; the options go to it
    with ``source="hf"`` (an option it does not have is a one-line error naming ``model``)."""
    cls = HF_READERS[kind]
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "source"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(f"data=hf with model={model} has no option {', '.join(unknown)}")
    return cls(source="hf", **options)
