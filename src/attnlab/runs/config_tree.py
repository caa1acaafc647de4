"""Config helpers for train.py: validation, tags, flattening, and the printed/saved config tree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..core.errors import ConfigError

BLOCK_GROUPS = ("norm", "ffn", "moe", "attn", "pos")


def used_groups(cfg: DictConfig, narrow: bool = True, net: Mapping | None = None) -> list[str]:
    """The block groups the chosen model is built from: its family's (:mod:`attnlab.families`), narrowed by the
    net's config where the family reads them only in some settings (the sequence classifier: only its attention
    encoder). A model of no registered family uses none. ``narrow=False``: all the groups the family is built
    from, without resolving the net's config. ``net``: ``model.net`` already resolved (else resolved here, when
    the family narrows)."""
    from ..families import for_config

    family = for_config(cfg) if "model" in cfg else None
    if family is None:
        return []
    if not (narrow and family.narrow_groups):
        net = None
    elif net is None:
        net = OmegaConf.to_container(cfg.model.net, resolve=True)
    return list(family.block_groups(net))


def check_block_groups(cfg: DictConfig, overrides: Sequence[str] = (), net: Mapping | None = None) -> None:
    """Refuse a block-group override (``norm=rms``) for a model that is not built from that group.

    ``overrides`` are the command line's overrides (``HydraConfig.get().overrides.task``); a group the model does
    not use (:func:`used_groups`) and that the user chose explicitly would otherwise be a silent no-op. ``net``:
    ``model.net`` already resolved.
    """
    uses = used_groups(cfg, net=net)
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    ignored = sorted(g for g in BLOCK_GROUPS if g in chosen and g not in uses)
    if ignored:
        name = cfg.model.get("name", "this model")
        raise ConfigError(
            f"{', '.join(g + '=' for g in ignored)} does not apply to model={name} "
            f"(it is built from: {', '.join(uses) or 'none of ' + '/'.join(BLOCK_GROUPS)}); drop the override"
        )


def group_choices() -> dict[str, str]:
    """The option chosen for each config group in this Hydra run (``{"norm": "rms", ...}``); empty outside one."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return {k: str(v) for k, v in HydraConfig.get().runtime.choices.items() if v is not None}
    except ValueError:  # no Hydra run (a config composed by hand)
        return {}


def auto_tags(cfg: DictConfig, groups: Sequence[str] | None = None) -> list[str]:
    """The run's W&B tags: the model, its block groups' choices (``groups``: :func:`used_groups`, if known), the
    experiment and the config's own ``tags``."""
    tags = [str(cfg.model.get("name", "model"))]
    choices = group_choices()
    tags += [f"{g}={choices[g]}" for g in (used_groups(cfg) if groups is None else groups) if g in choices]
    if cfg.get("experiment_name"):
        tags.append(f"experiment={cfg.experiment_name}")
    return tags + [str(t) for t in cfg.get("tags") or []]


def flatten(d: Mapping, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out


def print_config_tree(cfg: Mapping, save_to: Path | None = None) -> None:
    """Print the composed config as a rich tree (one branch per top-level group) and save it as text. ``cfg``: the
    config, or the plain containers it resolves to (then nothing is resolved again)."""
    import rich
    import rich.syntax
    import rich.tree
    import yaml

    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    first = ["data", "model", "norm", "ffn", "moe", "pos", "trainer", "callbacks", "logger", "paths"]
    for key in first + [k for k in cfg if k not in first]:
        if key not in cfg:
            continue
        value = cfg[key]
        if isinstance(value, DictConfig):
            text = OmegaConf.to_yaml(value, resolve=True)
        elif isinstance(value, dict):  # as OmegaConf.to_yaml writes it
            text = yaml.dump(value, default_flow_style=False, allow_unicode=True, sort_keys=False)
        else:
            text = str(value)
        tree.add(str(key), style="bold").add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    if save_to is not None:
        import io

        from ..files.atomic import write_atomic

        text = io.StringIO()
        rich.print(tree, file=text)
        write_atomic(save_to, text.getvalue(), durable=False)

