"""``data=hf`` (conf/data/hf.yaml): one config for every model that reads text, built as that model's data module.

Reading a dataset is :mod:`attnlab.data.hf_source`'s; this module only picks the data module, so that the data
modules import the reading functions and nothing imports back.
"""

from __future__ import annotations

import inspect

from ..errors import ConfigError
from .lm_datamodule import LMDataModule
from .translation_datamodule import TranslationDataModule

# model.name -> the data module data=hf builds for it
TRANSLATION_MODELS = ("transformer_mt", "transformer_nat", "seq2seq_attention", "seq2seq_baseline")
LM_MODELS = ("causal_lm",)


def hf_datamodule(model: str, **options):
    """``data=hf``: one config for every model that reads text. ``model`` is ``${model.name}``; the other options
    go to that model's data module with ``source="hf"`` (an option it does not have is a one-line error)."""
    if model in TRANSLATION_MODELS:
        cls = TranslationDataModule
    elif model in LM_MODELS:
        cls = LMDataModule
    else:
        raise ConfigError(f"data=hf serves {', '.join(LM_MODELS + TRANSLATION_MODELS)}, not model={model}")
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "source"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(f"data=hf with model={model} has no option {', '.join(unknown)}")
    return cls(source="hf", **options)
