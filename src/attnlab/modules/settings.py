"""Typed settings of the parts the block groups build (conf/attn, conf/ffn, conf/norm, conf/moe, conf/pos), without
torch: each value is checked once, by its group's settings type, wherever it comes from.

* train.py's config check (:func:`attnlab.runs.validate.validate_config`) builds every used group's settings from
  the resolved config before torch is imported (:meth:`Settings.from_config`): a bad value is one line in a second;
* the part builds the same settings from its arguments (``MultiHeadAttention(...)`` makes an
  :class:`AttentionSettings`), so a model built in Python or a notebook gets the same line.

A setting is a dataclass field whose check (:mod:`attnlab.core.value_checks`) is its metadata; every message names the
key as the user types it (``attn.window=0: must be a positive integer (or null)``). The relations to the net's sizes
are methods (:meth:`AttentionSettings.check_sizes`), called from both places too. A key the settings do not declare
is refused (``+attn.foo=1``): a new option of a part is a field here, and tests/modules/test_settings.py walks every
option YAML of every group so that it cannot be left out.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

from ..core.choices import BALANCE, PLACEMENTS
from ..core.errors import SettingError
from ..core.value_checks import (
    Check,
    boolean,
    non_negative_number,
    one_of,
    optional,
    positive_int,
    positive_number,
    show,
)

# keys of a part's config that are Hydra's, not settings
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})


def setting(check: Check, default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """A settings field: its value must pass ``check``."""
    return field(default=default, default_factory=default_factory, metadata={"check": check})


def _raise(problems: list[str]) -> None:
    if problems:
        raise SettingError("; ".join(problems))


class Settings:
    """The base of a group's settings: a subclass is a frozen dataclass of :func:`setting` fields, with its group's
    name (the first part of its keys) in ``GROUP``; its values are checked when it is made."""

    GROUP: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _raise(self.problems())

    @classmethod
    def settings(cls) -> list[dataclasses.Field]:
        """The fields a config sets (a derived field, like the positions' kind, is not one)."""
        return [f for f in dataclasses.fields(cls) if "check" in f.metadata]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in cls.settings()]

    @classmethod
    def key(cls, name: str) -> str:
        return f"{cls.GROUP}.{name}"

    def problems(self) -> list[str]:
        """Every bad value, one phrase each; when there is none, the relations between the values."""
        found = [p for f in self.settings() for p in value_problems(self.key(f.name), getattr(self, f.name),
                                                                     f.metadata["check"])]
        return found or self.relation_problems()

    def relation_problems(self) -> list[str]:
        return []

    def size_problems(self, d_model: Any, n_heads: Any) -> list[str]:
        """Why a net of these sizes (``model.net.d_model``, ``model.net.n_heads``) cannot have a part of these
        settings; [] when it can (most settings do not care)."""
        return []

    def check_sizes(self, d_model: int, n_heads: int) -> int:
        """The width of each head, d_model / n_heads, once these settings accept a net of these sizes (else one
        line): what the part calls, as train.py's check calls :meth:`size_problems`."""
        _raise(self.size_problems(d_model, n_heads))
        return d_model // n_heads

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **derived: Any):
        """The settings of a group's config (resolved): a key they do not declare, or a required one left out, is
        refused in one line with the values' own problems."""
        names = cls.names()
        problems = [f"{cls.key(k)}={show(v)}: unknown key; {cls.GROUP} has {', '.join(names)}"
                    for k, v in config.items() if k not in names and k not in HYDRA_KEYS]
        problems += [f"{cls.key(f.name)} is not set: it {f.metadata['check'](None)}" for f in cls.settings()
                     if f.name not in config and f.default is MISSING and f.default_factory is MISSING]
        _raise(problems)
        return cls(**{k: config[k] for k in names if k in config}, **derived)

    @classmethod
    def problems_in(cls, flat: Mapping[str, Any]) -> list[str]:
        """The problems of the settings a flattened config holds (``model.mask_prob`` -> 0.15); [] when they pass.
        For settings among other keys (the masking among the model's), so only the declared keys are read."""
        try:
            cls.from_config({n: flat[cls.key(n)] for n in cls.names() if cls.key(n) in flat})
        except SettingError as e:
            return [str(e)]
        return []


def value_problems(key: str, value: Any, check: Check) -> list[str]:
    """``key=value: what is allowed``, for the value and for the arguments a part config gives its part."""
    problem = check(value)
    if problem:
        return [f"{key}={show(value)}: {problem}"]
    return check.argument_problems(key, value) if isinstance(check, Factory) else []


def _is_module(value: Any) -> bool:
    """A torch module object (one exists only once torch is imported, so this needs no torch import)."""
    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(value, nn.Module)


def _options(group: str) -> list[str]:
    from ..core.paths import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@dataclass(frozen=True)
class Factory:
    """A part inside a part: a config with ``_target_`` (what train.py sees) or what Hydra built of it, a callable
    (what the part sees). ``args``: checks of the arguments the config gives it (``norm.layer.eps``); the others
    are its class's business. ``per_layer``: it is built once per layer (an activation, whose PReLU weight is each
    layer's own), so the config must be ``_partial_`` and a built module is refused: it would be shared."""

    what: str
    example: str
    choose: str = ""  # a group whose options are the usual values (ffn=gelu|...)
    args: Mapping[str, Check] = field(default_factory=dict)
    per_layer: bool = False

    def __call__(self, value: Any) -> str | None:
        if isinstance(value, Mapping) and "_target_" in value:
            return self._shared() if self.per_layer and value.get("_partial_") is not True else None
        if callable(value) and not _is_module(value):
            return None
        if self.per_layer and _is_module(value):
            return self._shared()
        hint = f" (or choose {self.choose}={'|'.join(_options(self.choose))})" if self.choose else ""
        return f"must be {self.what} such as {self.example}{hint}"

    def _shared(self) -> str:
        return f"must build one module per layer ({self.example}); one module would be shared by every layer"

    def argument_problems(self, key: str, value: Any) -> list[str]:
        given = value if isinstance(value, Mapping) else getattr(value, "keywords", None) or {}  # a partial's
        return [p for name, check in self.args.items() if name in given
                for p in value_problems(f"{key}.{name}", given[name], check)]


# --- the net's sizes the parts split ----------------------------------------------------------------------------


def head_dim_problem(d_model: Any, n_heads: Any) -> str | None:
    """Why ``n_heads`` heads cannot split ``d_model`` (each gets d_model / n_heads channels), or None."""
    for key, value in (("model.net.d_model", d_model), ("model.net.n_heads", n_heads)):
        if problem := positive_int(value):
            return f"{key}={show(value)}: {problem}"
    if d_model % n_heads:
        return (f"model.net.d_model={d_model} is not divisible by model.net.n_heads={n_heads} (each head gets "
                f"d_model / n_heads dimensions)")
    return None


# --- the groups ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionSettings(Settings):
    """conf/attn: :class:`~attnlab.modules.attention.MultiHeadAttention`'s options (its docstring says what each
    does)."""

    GROUP: ClassVar[str] = "attn"

    kv_heads: int | None = setting(optional(positive_int), None)  # null: n_heads (plain multi-head)
    qk_norm: bool = setting(boolean, False)
    qk_norm_eps: float | None = setting(optional(positive_number), None)  # null: torch's default for the dtype
    window: int | None = setting(optional(positive_int), None)  # null: every position
    scaled: bool = setting(boolean, True)

    def size_problems(self, d_model: Any, n_heads: Any) -> list[str]:
        if problem := head_dim_problem(d_model, n_heads):
            return [problem]
        if self.kv_heads is not None and n_heads % self.kv_heads:
            return [f"model.net.n_heads={n_heads} is not divisible by attn.kv_heads={self.kv_heads} (grouped-query "
                    f"attention shares each key/value head among n_heads / kv_heads query heads)"]
        return []


ACTIVATION = Factory("a module config", "{_target_: torch.nn.GELU, _partial_: true}", choose="ffn", per_layer=True)


@dataclass(frozen=True)
class FeedForwardSettings(Settings):
    """conf/ffn: :class:`~attnlab.modules.feedforward.FeedForward`'s options."""

    GROUP: ClassVar[str] = "ffn"

    # left out of a config (``~ffn.activation``): the feed-forward's own default
    activation: Any = setting(ACTIVATION, default_factory=lambda: {"_target_": "torch.nn.GELU", "_partial_": True})
    gated: bool = setting(boolean, False)
    hidden_mult: float = setting(positive_number, 4.0)
    multiple_of: int = setting(positive_int, 8)
    bias: bool | None = setting(optional(boolean), None)  # null: biases in the plain units, none in the gated


LAYER = Factory("a layer config", "{_target_: torch.nn.LayerNorm, _partial_: true}", args={"eps": positive_number})


@dataclass(frozen=True)
class NormSettings(Settings):
    """conf/norm: which layer (built as ``layer(d_model)``) and where (:class:`~attnlab.modules.parts.Norm`)."""

    GROUP: ClassVar[str] = "norm"

    layer: Any = setting(LAYER)
    placement: str = setting(one_of(PLACEMENTS), "pre")  # pre: x + f(norm(x)); post: norm(x + f(x))


@dataclass(frozen=True)
class MoESettings(Settings):
    """conf/moe/on.yaml: :func:`~attnlab.modules.moe.mixture_of_experts`'s options (moe=off is ``{}``: no
    settings, a dense feed-forward)."""

    GROUP: ClassVar[str] = "moe"

    num_experts: int = setting(positive_int, 8)
    top_k: int = setting(positive_int, 2)
    aux_loss_coef: float = setting(non_negative_number, 0.01)
    z_loss_coef: float = setting(non_negative_number, 0.001)
    balance: str = setting(one_of(BALANCE), "layer")

    def relation_problems(self) -> list[str]:
        if self.top_k > self.num_experts:
            return [f"moe.top_k={self.top_k} is more than moe.num_experts={self.num_experts}: each token picks top_k "
                    f"of the experts"]
        return []


@dataclass(frozen=True)
class PositionSettings(Settings):
    """conf/pos: the kind of positions (the option's name: ``rotary``) and its options. ``base`` is rotary's,
    ``init_std`` learned's (whether a kind takes an option is its class's business: train.py's check of ``+``
    overrides)."""

    GROUP: ClassVar[str] = "pos"
    # Positions inside self-attention by distance along one sequence: they split d_model into heads, and have no
    # meaning on the ViT's 2-D grid of patches. The others can sit on a grid (a test keeps both lists = conf/pos).
    SEQUENCE_ONLY: ClassVar[tuple[str, ...]] = ("rotary", "alibi")
    ON_A_GRID: ClassVar[tuple[str, ...]] = ("learned", "sinusoidal", "none")

    kind: str | None = None  # not a setting: which option builds the class (:func:`position_kind`)
    base: float = setting(positive_number, 10000.0)
    init_std: float = setting(non_negative_number, 0.02)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **derived: Any) -> PositionSettings:
        return super().from_config(config, kind=position_kind(config.get("_target_")), **derived)

    def size_problems(self, d_model: Any, n_heads: Any) -> list[str]:
        if self.kind not in self.SEQUENCE_ONLY:
            return []
        if problem := head_dim_problem(d_model, n_heads):
            return [problem]
        if self.kind == "rotary" and (d_model // n_heads) % 2:  # RoPE turns pairs of a head's channels
            return [f"pos=rotary needs an even head dimension, but model.net.d_model={d_model} / model.net.n_heads="
                    f"{n_heads} = {d_model // n_heads}"]
        return []

    def grid_problem(self) -> str | None:
        """Why these positions cannot number the patches of an image (None: they can)."""
        if self.kind in self.SEQUENCE_ONLY:
            grid = ", ".join(self.ON_A_GRID[:-1]) + " or " + self.ON_A_GRID[-1]
            return f"pos={self.kind} is a 1-D sequence position; patches sit on a 2-D grid: use {grid}"
        return None

    def check_grid(self, grid: tuple[int, int] | None) -> None:
        """One line if positions on ``grid`` (rows, cols; None: a sequence) are of a kind that cannot sit there."""
        _raise([p for p in [grid is not None and self.grid_problem()] if p])


@functools.cache
def _kinds_by_target() -> dict[str, str]:
    import yaml

    from ..core.paths import CONF_DIR

    out = {}
    for path in sorted((CONF_DIR / "pos").glob("*.yaml")):
        target = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("_target_")
        if target:
            out[str(target)] = path.stem
    return out


def position_kind(target: Any) -> str | None:
    """The conf/pos option whose class ``target`` is (``attnlab.modules.positional.RotaryPositions``: rotary),
    read from conf/pos, which says which class each option builds; None for a class no option builds."""
    return _kinds_by_target().get(str(target)) if target else None


# the block groups' settings, by group
PART_SETTINGS: dict[str, type[Settings]] = {s.GROUP: s for s in (NormSettings, FeedForwardSettings, MoESettings,
                                                                   AttentionSettings, PositionSettings)}
