"""The model families: one :class:`Family` object each, declared in its own module of this package.

A family is what ``model=<name>`` trains: a task (LightningModule), the net it builds, the data it reads, the block
groups (``norm``, ``ffn``, ``moe``, ``attn``, ``pos``) it is built from, the entry point that serves its checkpoints,
its own config rules and a tiny synthetic batch for tests. Everything that needs the list of families reads
this registry: the block groups a run uses (:func:`attnlab.runs.config_tree.used_groups`), the checkpoint
loader's refusals (:mod:`attnlab.runs.load`), ``data=hf`` (:func:`hf_datamodule`), the family rules of
:mod:`attnlab.runs.validate`, the tests' parametrizations and the docs' model table.

Adding a family is adding files: its model and task, ``conf/model/<name>.yaml`` and a module here that defines
``FAMILY = Family(...)``; every module of this package is imported on the first lookup (:func:`families`) and
collected, so no existing file changes. Class paths are strings, imported only when asked for, so reading the
registry costs no torch or Lightning import.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What a family's data module gives it; ``data=hf`` serves the text kinds (attnlab.data.hf_source.HF_READERS).
DATA_KINDS = ("lm_text", "translation", "images", "speech", "sequences")
BLOCK_GROUPS = ("norm", "ffn", "moe", "attn", "pos")
# What ``python -m attnlab.explore`` reads for a family's checkpoint (attnlab.cli.explore_inputs.INPUTS): a source
# sentence (and its translation), text through the checkpoint's tokenizer, an image file, text to speak, token ids.
EXPLORER_INPUTS = ("translation", "text", "image", "speech", "ids")

# A family's config rules: the flattened, resolved config (``model.net.d_model`` -> 32) -> problems, one phrase each.
Rules = Callable[[Mapping[str, Any]], list[str]]


def _no_rules(flat: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class Family:
    """One model family.

    Args:
        name: the ``conf/model/<name>.yaml`` that trains it (and the family's name in tests and tables).
        task: import path of its task (the checkpoint's ``task_class``).
        net: import path of its net (``model.net._target_``).
        data: what its data module gives, one of :data:`DATA_KINDS`.
        groups: the block groups its net is built from (those ``model.net`` interpolates).
        what: what a user calls it in a sentence ("a language model").
        serves: the command that serves its checkpoints.
        description: one line for the docs' model table.
        models: every ``conf/model`` option of this family (default: ``name`` alone), e.g. a preset of its YAML.
        narrow_groups: ``net config -> groups`` where the net reads the groups only in some settings (the sequence
            classifier's RNN and CNN encoders read none).
        rules: its config rules (:data:`Rules`): values only this family has (``model.cell``), relations between
            them; merged into :func:`attnlab.runs.validate.validate_config`'s one line.
        batch_loss: ``(net, torch.Generator) -> loss`` of one fixed tiny synthetic batch through the net's own
            forward, with the family's natural loss (tests train every family on it).
        test_overrides: the train.py overrides on top of ``debug=fast`` that make a run of a few seconds (tiny
            data sets), for the tests that train every family end to end.
        explorer_input: the input ``python -m attnlab.explore`` runs its checkpoints on, one of
            :data:`EXPLORER_INPUTS` (None: the explorer refuses its checkpoints in one line).
    """

    name: str
    task: str
    net: str
    data: str
    groups: tuple[str, ...]
    what: str
    serves: str
    description: str
    models: tuple[str, ...] = ()
    narrow_groups: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
    rules: Rules = _no_rules
    batch_loss: Callable[..., Any] | None = None
    test_overrides: tuple[str, ...] = ()
    explorer_input: str | None = None
    module: str = field(default="", compare=False)

    def __post_init__(self):
        if self.data not in DATA_KINDS:
            raise ValueError(f"family {self.name}: data={self.data!r}, not one of {', '.join(DATA_KINDS)}")
        if self.explorer_input is not None and self.explorer_input not in EXPLORER_INPUTS:
            raise ValueError(f"family {self.name}: explorer_input={self.explorer_input!r}, not one of "
                             f"{', '.join(EXPLORER_INPUTS)}")
        if unknown := set(self.groups) - set(BLOCK_GROUPS):
            raise ValueError(f"family {self.name}: unknown block groups {sorted(unknown)}")
        if not self.models:
            object.__setattr__(self, "models", (self.name,))

    @property
    def task_name(self) -> str:
        """The task's class name (``CausalLMTask``)."""
        return self.task.rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """``what`` without its article ("language model"), as the review notebook prints it."""
        return self.what.split(" ", 1)[1] if self.what.startswith(("a ", "an ")) else self.what

    def block_groups(self, net_cfg: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The groups a net of ``net_cfg`` (resolved) reads: :attr:`groups`, narrowed by :attr:`narrow_groups`."""
        if self.narrow_groups is None or net_cfg is None:
            return self.groups
        narrow = set(self.narrow_groups(net_cfg))
        return tuple(g for g in self.groups if g in narrow)


@functools.cache
def _registry() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            continue
        if family.name in found:
            raise ValueError(f"two families named {family.name}: {found[family.name].module} and {module.__name__}")
        object.__setattr__(family, "module", module.__name__)
        found[family.name] = family
    return found


def families() -> list[Family]:
    """Every registered family, by name."""
    return sorted(_registry().values(), key=lambda f: f.name)


def get(name: str) -> Family:
    """The family of ``name`` (a family or one of its ``conf/model`` options); KeyError if none."""
    for family in families():
        if name == family.name or name in family.models:
            return family
    raise KeyError(name)


def model_names() -> list[str]:
    """Every ``conf/model`` option a family declares."""
    return [m for f in families() for m in f.models]


def for_task(task_class: str) -> Family | None:
    """The family of a task class (import path or bare class name), None if no family has it. Families sharing a
    task (translation: the transformer and the RNN) agree on what it is and what serves it."""
    short = str(task_class).rsplit(".", 1)[-1]
    for family in families():
        if task_class == family.task or short == family.task_name:
            return family
    return None


def for_net(net_target: str) -> Family | None:
    """The family whose net is ``net_target`` (``model.net._target_``), None if none."""
    return next((f for f in families() if f.net == net_target), None)


def for_config(cfg: Any) -> Family | None:
    """The family a composed train config builds (by its ``model.net._target_``, then ``model.name``)."""
    model = cfg.get("model") if hasattr(cfg, "get") else None
    if not model:
        return None
    net = model.get("net") if hasattr(model, "get") else None
    family = for_net(str(net.get("_target_"))) if hasattr(net, "get") else None
    if family is None and model.get("name"):
        try:
            family = get(str(model.get("name")))
        except KeyError:
            return None
    return family


def hf_datamodule(model: str, **options):
    """``data=hf`` (conf/data/hf.yaml): the data module of ``model``'s family for a Hugging Face dataset, by the
    kind of data the family reads. ``model`` is ``${model.name}``."""
    from ..data.hf_datamodule import HF_READERS, hf_reader
    from ..core.errors import ConfigError

    try:
        kind = get(model).data
    except KeyError:
        kind = None
    if kind not in HF_READERS:
        served = [m for f in families() if f.data in HF_READERS for m in f.models]
        raise ConfigError(f"data=hf serves {', '.join(served)}, not model={model}")
    return hf_reader(kind, model, **options)
