"""``conf/<group>/<option>.yaml`` read and built from Python: what ``<group>=<option>`` gives a model."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..core.errors import PartError
from ..core.paths import CONF_DIR


def part_config(group: str, option: str, **overrides: Any) -> dict:
    """The config of ``conf/<group>/<option>.yaml`` (with the options it extends through its ``defaults``) and
    ``overrides``, as a plain dict."""
    from omegaconf import OmegaConf

    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        raise PartError(f"no {group} option {option!r}; choose one of {', '.join(options)}")
    cfg = OmegaConf.load(path)
    base = OmegaConf.create()
    for entry in cfg.pop("defaults", []):  # the options this one extends, then itself (`_self_`)
        if entry != "_self_":
            base = OmegaConf.merge(base, OmegaConf.create(part_config(group, entry)))
    merged = OmegaConf.merge(base, cfg, OmegaConf.create(overrides))
    return OmegaConf.to_container(merged, resolve=True)


def load_part(group: str, option: str, **overrides: Any) -> Any:
    """The part :func:`part_config` names, built (a partial the model finishes with its sizes; ``norm``: its
    placement and built layer; ``moe=off``: ``{}``). A class that does not exist, or an argument it does not take,
    is one line before anything is built."""
    import hydra

    config = part_config(group, option, **overrides)
    _check_classes(group, config)
    return hydra.utils.instantiate(config, _convert_="all")


def _check_classes(group: str, node: Any) -> None:
    """Every ``_target_`` in ``node`` exists and takes the arguments given with it."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            _check_arguments(group, node)
        for key, value in node.items():
            _check_classes(f"{group}.{key}", value)
    elif isinstance(node, list):
        for value in node:
            _check_classes(group, value)


def _check_arguments(group: str, part: Mapping) -> None:
    import hydra

    try:
        target = hydra.utils.get_object(str(part["_target_"]))
    except ImportError:
        raise PartError(f"{group}: cannot build {part['_target_']}: no such class") from None
    args = {k: v for k, v in part.items() if not (k.startswith("_") and k.endswith("_"))}
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without one: torch checks its own arguments
        return
    try:
        (signature.bind_partial if part.get("_partial_") else signature.bind)(*part.get("_args_", ()), **args)
    except TypeError as e:
        raise PartError(f"{group}: cannot build {part['_target_']}: {e}") from None
