"""The choices a transformer block is built from, one dataclass per Hydra config group.

``conf/norm/*.yaml``, ``conf/ffn/*.yaml``, ``conf/moe/*.yaml`` and ``conf/pos/*.yaml`` each hold the fields of one of
these; every transformer model config points at the group by interpolation (``norm: ${norm}``), so one CLI
override (``norm=rms``) reaches every block of every model. ``from_cfg`` accepts a dict, a DictConfig or an
instance and refuses unknown keys with a one-line error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .feedforward import FFN_ACTIVATIONS
from .norm import NORM_KINDS
from .positional import POSITION_KINDS

T = TypeVar("T", bound="_Spec")


class _Spec:
    @classmethod
    def from_cfg(cls: type[T], cfg: Any) -> T:
        if isinstance(cfg, cls):
            return cfg
        if cfg is None:
            return cls()
        if not isinstance(cfg, Mapping):
            raise TypeError(f"{cls.__name__} expects a mapping, got {type(cfg).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - fields)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
        return cls(**dict(cfg))

    def _check(self, field: str, allowed: tuple) -> None:
        value = getattr(self, field)
        if value not in allowed:
            raise ValueError(f"{type(self).__name__}.{field}={value!r}; choose one of {', '.join(allowed)}")


@dataclass(frozen=True)
class NormSpec(_Spec):
    """pre: LayerNorm before each sublayer; post: LayerNorm after each residual add (2017); rms: RMSNorm, pre;
    batch: BatchNorm over batch and positions, pre."""

    name: str = "pre"
    kind: str = "layernorm"
    placement: str = "pre"
    eps: float = 1e-5

    def __post_init__(self):
        self._check("kind", NORM_KINDS)
        self._check("placement", ("pre", "post"))


@dataclass(frozen=True)
class FFNSpec(_Spec):
    name: str = "gelu"
    activation: str = "gelu"
    hidden_mult: float = 4.0  # hidden = mult·d (relu/gelu) or ⅔·mult·d (swiglu), see feedforward.py
    multiple_of: int = 8
    bias: bool = True

    def __post_init__(self):
        self._check("activation", FFN_ACTIVATIONS)


@dataclass(frozen=True)
class MoESpec(_Spec):
    name: str = "off"
    enabled: bool = False
    num_experts: int = 8
    top_k: int = 2
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.001


@dataclass(frozen=True)
class PosSpec(_Spec):
    name: str = "learned"
    kind: str = "learned"
    rotary_base: float = 10000.0

    def __post_init__(self):
        self._check("kind", POSITION_KINDS)
