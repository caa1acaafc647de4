"""The parts a transformer is built from, as the config groups give them (torchtune / lightning-hydra-template style).

Each block config group holds a part that Hydra instantiates (``_target_`` + ``_partial_: true``); every transformer
model config points at the groups by interpolation (``attn: ${attn}``), so one CLI override (``attn=gqa``) reaches
every layer of every model. The builders finish the calls with the sizes:

    group  what conf/<group>/*.yaml holds                          how the builder calls it
    norm   {placement: pre|post, layer: <norm class, partial>}      norm.layer(d_model)
    ffn    <feed-forward, partial; its activation partial too>      ffn(dim=d_model, dropout=...)
    moe    {} (dense) or <mixture builder, partial>                 moe(dim=d_model, expert=lambda: ffn(...))
    attn   <attention, partial>                                     attn(d_model, n_heads, dropout=, bias=, ...)
    pos    <positions, partial>                                     pos(max_len=, d_model=, n_heads=[, grid=])

A new variant is a class (or none, when torch has it: ``torch.nn.LayerNorm``) and one YAML file; nothing here
changes. :func:`resolve` accepts a part as Hydra built it (or as Python code builds it:
``attnlab.builders.load_part("attn", "gqa", kv_heads=4)``), or None (the defaults below, which are what
``conf/train.yaml`` picks). Nothing here reads a config or imports a class by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..core.errors import PartError
from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .positional import LearnedPositions
from .settings import NormSettings


def _built(group: str, part: Any) -> Any:
    """A part as it arrives: built (a class or partial). A config mapping that names a class (``_target_``) has not
    been built: the parts build nothing from names, so that no code a file names runs here."""
    if isinstance(part, Mapping) and "_target_" in part:
        raise PartError(f"{group}: got the config of {part['_target_']}, not the part: build it first "
                        f"(attnlab.builders.load_part(group, option), or hydra.utils.instantiate)")
    return part


@dataclass(frozen=True)
class Norm:
    """The ``norm`` group: which layer (a factory ``layer(dim)``) and where (``pre``: x + f(norm(x)); ``post``:
    norm(x + f(x))). The placement is checked here, once, and the blocks get it as :attr:`pre`."""

    layer: Callable[[int], nn.Module]
    placement: str = "pre"

    def __post_init__(self):
        NormSettings(layer=self.layer, placement=self.placement)  # train.py's check and line

    @property
    def pre(self) -> bool:
        return self.placement == "pre"

    def final(self, dim: int) -> nn.Module:
        """After a pre-norm stack the residual stream was never normalized: one more norm. Post-norm ones did."""
        return self.layer(dim) if self.pre else nn.Identity()


DEFAULT_NORM = Norm(functools.partial(nn.LayerNorm, eps=1e-5), "pre")
DEFAULT_FFN = functools.partial(FeedForward, activation=nn.GELU)
DEFAULT_ATTN = functools.partial(MultiHeadAttention)
DEFAULT_POS = functools.partial(LearnedPositions)


def resolve_norm(norm: Any) -> Norm:
    if norm is None:
        return DEFAULT_NORM
    if isinstance(norm, Norm):
        return norm
    if not isinstance(norm, Mapping) or "layer" not in norm:
        raise PartError(f"norm must be {{placement: pre|post, layer: ...}} (conf/norm/*.yaml), got {norm!r}")
    settings = NormSettings.from_config(norm)  # its keys and values, before the layer is built
    return Norm(_built("norm.layer", norm["layer"]), settings.placement)


def resolve_part(group: str, part: Any, default: Any) -> Any:
    """``ffn``, ``attn``, ``pos``: a factory (callable). ``moe``: a factory, or None for a dense model."""
    if part is None:
        return default
    if isinstance(part, Mapping) and not part and group == "moe":  # conf/moe/off.yaml is {}: dense
        return None
    part = _built(group, part)
    if not callable(part):
        raise PartError(f"{group} must be a part (a class or partial, as conf/{group}/*.yaml builds it), "
                        f"got {part!r}")
    return part


@dataclass(frozen=True)
class BlockParts:
    """Everything a layer is built from besides its sizes."""

    norm: Norm = DEFAULT_NORM
    ffn: Callable[..., nn.Module] = DEFAULT_FFN
    moe: Callable[..., nn.Module] | None = None
    attn: Callable[..., nn.Module] = DEFAULT_ATTN

    @classmethod
    def resolve(cls, norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None) -> BlockParts:
        return cls(resolve_norm(norm), resolve_part("ffn", ffn, DEFAULT_FFN), resolve_part("moe", moe, None),
                   resolve_part("attn", attn, DEFAULT_ATTN))

    def feedforward(self, d_model: int, dropout: float = 0.0) -> nn.Module:
        """A dense feed-forward, or a mixture whose experts are each such a feed-forward."""
        make = lambda: self.ffn(dim=d_model, dropout=dropout)  # noqa: E731
        return make() if self.moe is None else self.moe(dim=d_model, expert=make)


def resolve_positions(pos: Any) -> Callable[..., nn.Module]:
    return resolve_part("pos", pos, DEFAULT_POS)
