"""The code a checkpoint or a run folder may name: one allow-list, computed from the project's own config groups.

A checkpoint's ``hyper_parameters`` and a run's ``.hydra/config.yaml`` are data, but ``hydra.utils.instantiate``
imports and calls whatever their ``_target_`` strings name: ``{_target_: builtins.open, file: <path>, mode: w}``
truncates a file, ``pathlib.Path.write_text`` writes one. So every loader checks, *before anything is imported or
built*, each ``_target_`` at any depth (``net``, ``norm.layer``, ``ffn.activation``, inside ``_args_`` lists and
partials) with :func:`check_targets`, and the task class a checkpoint names with :func:`check_task_class`.

What is allowed is read from ``conf/**/*.yaml`` (never kept by hand), so a variant added the documented way (a
class and one YAML file, docs/adding_a_variant.md) is allowed by adding it:

* scope ``"model"`` (a checkpoint's hyper-parameters, a net config): the targets of the model-building groups
  (``model``, ``norm``, ``ffn``, ``moe``, ``attn``, ``pos``, ``optim``, ``sched``, wherever a config file sets
  them), the ones
  :mod:`attnlab.checkpoints.upgrade` writes for old checkpoints, and the layers ``torch.nn`` exports
  (``norm.layer._target_=torch.nn.RMSNorm``, ``ffn.activation._target_=torch.nn.Mish``: an ``nn.Module`` class
  of ``torch.nn`` itself, never a function or a submodule);
* scope ``"run"`` (a run folder's saved config): every target of every config group (data modules, callbacks,
  loggers, trainer, Hydra callbacks) and the model scope.

Besides ``_target_``, Lightning's own ``_instantiator`` / ``_class_path`` hyper-parameters name code: refused. A
string holding an interpolation (``${oc.create:...}``) in a plain config (a checkpoint's) is refused too: Hydra's
``instantiate`` resolves it, so it could become a ``_target_`` after this check; train.py saves resolved configs,
so a genuine checkpoint holds none. A saved run config keeps its interpolations; each value is checked as it
resolves (OmegaConf's own resolvers, Hydra's and attnlab's ``resume_dir`` and
``resume_sweep_dir``: none imports or runs named code).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import UnsafeTargetError
from ..core.paths import CONF_DIR

# the groups a task is built from: its net's parts, and the optimizer and LR schedule it saves in its checkpoint
MODEL_GROUPS = ("model", "norm", "ffn", "moe", "attn", "pos", "optim", "sched")
# keys that make Lightning import what they name when it builds a module from hyper-parameters
LIGHTNING_CODE_KEYS = ("_instantiator", "_class_path")
MAX_DEPTH = 64  # a config nests a few levels; deeper is a self-referencing interpolation, not a config


def _yaml_files(conf_dir: Path) -> Iterator[tuple[Path, Any]]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted(conf_dir.rglob("*.yaml")):
        try:
            yield path, yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        except (OSError, yaml.YAMLError, UnicodeDecodeError):  # a broken config file is Hydra's to report
            continue


def _targets_in(node: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "_target_" and isinstance(value, str):
                yield path, value
            else:
                yield from _targets_in(value, (*path, str(key)))
    elif isinstance(node, list):
        for value in node:
            yield from _targets_in(value, path)


@functools.cache
def _conf_targets(conf_dir: Path = CONF_DIR) -> dict[str, frozenset[str]]:
    """``{"model": ..., "run": ..., "task": ...}``: the ``_target_`` strings of ``conf_dir``, by scope."""
    model, run, task = set(), set(), set()
    for path, cfg in _yaml_files(conf_dir):
        head = path.read_text(encoding="utf-8", errors="replace").lstrip()[:200]
        rel = path.relative_to(conf_dir).parts
        # where the file's keys land: `# @package _global_` at the root, else under its group (conf/norm/x.yaml)
        prefix = () if "@package _global_" in head or len(rel) == 1 else (rel[0],)
        for where, target in _targets_in(cfg, prefix):
            run.add(target)
            if where and where[0] in MODEL_GROUPS:
                model.add(target)
            if where == ("model",):  # a model config's own target is its task (LightningModule)
                task.add(target)
    return {"model": frozenset(model), "run": frozenset(run | model), "task": frozenset(task)}


@functools.cache
def _upgrade_targets() -> frozenset[str]:
    """What :mod:`attnlab.checkpoints.upgrade` writes into an old checkpoint's net config, and the old names of the
    targets it renames (a saved run config's)."""
    from . import upgrade as up

    return frozenset([*up.NORM_LAYERS.values(), *up.ACTIVATIONS.values(), *up.POSITIONS.values(), up.ATTENTION,
                      "attnlab.modules.feedforward.FeedForward", "attnlab.modules.moe.mixture_of_experts",
                      up.OPTIMIZER, up.SCHEDULE, *up.MOVED_TARGETS])


def _torch_layer(target: str) -> bool:
    """``torch.nn.<Name>`` where Name is an ``nn.Module`` class that torch.nn exports (a layer or activation)."""
    prefix, _, name = target.rpartition(".")
    if prefix != "torch.nn" or not name.isidentifier():
        return False
    from torch import nn

    value = getattr(nn, name, None)
    # a name torch.nn lacks imports nothing either: Hydra reports it as "cannot build" (a typo, not an attack)
    return value is None or (isinstance(value, type) and issubclass(value, nn.Module))


def allowed(target: Any, scope: str = "model") -> bool:
    if not isinstance(target, str):
        return False
    if target in _conf_targets()[scope] or target in _upgrade_targets():
        return True
    return _torch_layer(target)


def task_classes() -> frozenset[str]:
    """The import paths of the project's tasks: the ``_target_`` of each model config."""
    return _conf_targets()["task"]


def _describe(scope: str) -> str:
    return (f"the model groups of attnlab's conf/ ({', '.join(MODEL_GROUPS)}) or a torch.nn layer"
            if scope == "model" else "attnlab's conf/ groups")


def _children(node: Any) -> Iterator[tuple[str, Any, bool]]:
    """``(key, value, resolved)`` of a config node; an OmegaConf value that does not resolve here is
    ``(key, error, False)``."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (DictConfig, ListConfig)):
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            name = str(key) if isinstance(node, DictConfig) else f"[{key}]"
            try:
                yield name, node[key], True
            except Exception as e:  # noqa: BLE001 - ${hydra:...} outside a Hydra run, a missing key
                yield name, e, False
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key), value, True
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield f"[{i}]", value, True


def _join(path: str, key: str) -> str:
    return f"{path}{key}" if key.startswith("[") or not path else f"{path}.{key}"


def refusals(tree: Any, scope: str = "model", path: str = "") -> Iterator[tuple[str, str]]:
    """``(key path, why)`` for each thing in ``tree`` that names code outside the allow-list (empty: safe)."""
    from omegaconf import DictConfig, ListConfig

    stack = [(tree, path, 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            yield where, f"nested more than {MAX_DEPTH} levels deep (a self-referencing interpolation?)"
            continue
        interpolated = isinstance(node, (DictConfig, ListConfig))
        for key, value, resolved in _children(node):
            at = _join(where, key)
            if key == "_target_":
                if not resolved:
                    yield at, f"an interpolation that does not resolve ({type(value).__name__})"
                elif not allowed(value, scope):
                    yield at, repr(value)
            elif key in LIGHTNING_CODE_KEYS:
                yield at, f"{value!r} (Lightning imports what this key names)"
            elif isinstance(value, str) and "${" in value and not interpolated:
                yield at, f"the interpolation {value!r} (instantiate would resolve it after this check)"
            elif resolved and isinstance(value, (Mapping, list, tuple, DictConfig, ListConfig)):
                stack.append((value, at, depth + 1))


def check_targets(tree: Any, where: str, scope: str = "model") -> None:
    """Refuse, in one line naming the key and the target, a config that names code outside the allow-list.

    ``tree``: plain dicts and lists (a checkpoint's hyper-parameters) or an OmegaConf node (a saved run config);
    ``where``: what it is, for the message ("<file>: hyper_parameters")."""
    for key, why in refusals(tree, scope):
        raise UnsafeTargetError(
            f"{where}: {key} = {why} is not one of {_describe(scope)}; refused, nothing from it was imported, "
            f"built or run")


def check_task_class(name: Any, where: str) -> None:
    """A checkpoint's ``task_class`` must be one of the project's tasks (checked before it is imported)."""
    if not isinstance(name, str) or name not in task_classes():
        raise UnsafeTargetError(
            f"{where}: task_class = {name!r} is not one of attnlab's tasks (the model configs' _target_ in "
            f"conf/model); refused, nothing from it was imported, built or run")


def load_config(path: str | Path, scope: str = "run"):
    """A run's saved config (``.hydra/config.yaml``), refused in one line if it names code outside the allow-list
    (:func:`check_targets`); for everything that reads a run folder and may build from it (resume, the claims,
    the review notebooks)."""
    from omegaconf import OmegaConf

    from .upgrade import upgrade_targets

    cfg = upgrade_targets(OmegaConf.load(path))
    check_targets(cfg, str(path), scope)
    return cfg
