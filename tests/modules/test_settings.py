"""The typed part settings (attnlab.modules.settings, attnlab.tasks.masking) hold every rule of the block groups'
values once, and both places that meet a value use them: train.py's check before torch is imported
(validate_config) and the part built in Python. Everything here is generated from conf/ and from the settings types
themselves: a new option in a group's YAML, a new settings field or a new kind of check arrives with its tests.

* every key of every option YAML of every block group is declared by its group's settings (with a check);
* every settings field's bad values, generated from the kind of its check, are refused in one line naming the key,
  by validate_config and, with the same line, by the part's constructor;
* the relations to the net's sizes and the ViT's grid say the same in both places, over every option and a grid of
  sizes;
* the settings' defaults are the parts' own.
"""

from __future__ import annotations

import functools
import inspect
import math
import subprocess
import sys
from typing import Any

import pytest
from bad_values import Case, apply
from helpers import compose_train
from omegaconf import OmegaConf

from attnlab.core.errors import ConfigError, SettingError
from attnlab.modules.settings import PART_SETTINGS, Factory, PositionSettings, Settings, position_kind
from attnlab.core.paths import CONF_DIR, PACKAGE_DIR
from attnlab.tasks.masking import MaskingSettings
from attnlab.runs.validate import config_problems, validate_config
from attnlab.core.value_checks import (
    Boolean,
    NonNegativeInt,
    NonNegativeNumber,
    OneOf,
    Optional,
    PositiveInt,
    PositiveNumber,
    Probability,
    UnitInterval,
    show,
)

ALL_SETTINGS: list[type[Settings]] = [*PART_SETTINGS.values(), MaskingSettings]
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def own_keys(node: Any, prefix: str = "") -> list[str]:
    """The dotted keys an option YAML writes itself (its ``defaults`` and Hydra's keys left out)."""
    out = []
    for key, value in node.items():
        if key in HYDRA_KEYS or (not prefix and key == "defaults"):
            continue
        full = f"{prefix}.{key}" if prefix else str(key)
        out += own_keys(value, full) if isinstance(value, dict) and value else [full]
    return out


YAML_KEYS = [(group, option, key) for group in PART_SETTINGS for option in options(group)
             for key in own_keys(OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml")))]


def check_of(settings: type[Settings], dotted: str):
    """The check a settings type declares for ``dotted`` (``layer.eps``: the part config's argument), or None."""
    first, _, rest = dotted.partition(".")
    field = {f.name: f for f in settings.settings()}.get(first)
    if field is None:
        return None
    check = field.metadata["check"]
    if not rest:
        return check
    return check.args.get(rest) if isinstance(check, Factory) else None


def test_the_generated_spaces_are_what_conf_holds():
    """(a generator that found nothing would pass everything below)"""
    assert {g for g, _, _ in YAML_KEYS} == {"attn", "ffn", "norm", "moe", "pos"}
    assert ("attn", "mha", "window") in YAML_KEYS and ("norm", "pre", "layer.eps") in YAML_KEYS
    assert len(FIELD_CASES) > 80, len(FIELD_CASES)


@pytest.mark.parametrize("group,option,key", YAML_KEYS, ids=[f"{g}={o}:{k}" for g, o, k in YAML_KEYS])
def test_every_key_of_every_option_is_a_declared_setting(group, option, key):
    """Adding ``softcap: null`` to conf/attn/mha.yaml without an AttentionSettings field (and its check) fails here."""
    assert check_of(PART_SETTINGS[group], key) is not None, (
        f"conf/{group}/{option}.yaml sets {group}.{key}, which {PART_SETTINGS[group].__name__} does not declare: add "
        f"a field with its check to attnlab/modules/settings.py")


@pytest.mark.parametrize("group,option", [(g, o) for g in PART_SETTINGS for o in options(g)])
def test_every_option_as_shipped_makes_its_settings(group, option):
    from attnlab.builders import part_config

    config = part_config(group, option)
    if group == "moe" and not config:  # moe=off: dense, no settings
        return
    settings = PART_SETTINGS[group].from_config(config)
    for key, value in config.items():
        if key not in HYDRA_KEYS:
            assert getattr(settings, key) == value


def test_importing_the_settings_imports_no_torch_hydra_or_lightning():
    """validate_config builds them before train.py imports torch: a refused value answers in about a second."""
    code = ("import sys, attnlab.modules.settings, attnlab.tasks.masking, attnlab.core.value_checks\n"
            "print(' '.join(m for m in ('torch', 'hydra', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, check=True)
    assert out.stdout.strip() == ""
    assert (PACKAGE_DIR / "modules" / "__init__.py").read_text() == ""  # importing a part's settings runs nothing else


# --- bad values, generated from the kind of each field's check -------------------------------------------------


def bad_values(check) -> list:
    """Values each kind of check must refuse: the edges of its range, another type, a switch, and null unless it is
    optional."""
    if isinstance(check, Optional):
        return [v for v in bad_values(check.check) if v is not None]
    kinds = {
        PositiveInt: [0, -1, 2.5, "abc", True],
        NonNegativeInt: [-1, 2.5, "abc", True],
        PositiveNumber: [0, -1, math.nan, "abc", True],
        NonNegativeNumber: [-1, math.nan, "abc", True],
        Probability: [-0.1, 1, math.nan, "abc", True],
        UnitInterval: [-0.1, 1.5, math.nan, "abc", True],
        Boolean: ["abc", 2, 0],
        OneOf: ["no_such_choice", 1, True],
        Factory: ["abc", 3],
    }
    assert type(check) in kinds, f"no bad values for the kind {type(check).__name__}: add them to bad_values()"
    found = list(kinds[type(check)]) + [None]
    if isinstance(check, Factory) and check.per_layer:  # built once, shared by every layer
        found.append({"_target_": "torch.nn.GELU", "_partial_": False})
    return found


def field_cases() -> list[tuple[type[Settings], str, Any]]:
    cases = []
    for settings in ALL_SETTINGS:
        for field in settings.settings():
            check = field.metadata["check"]
            cases += [(settings, field.name, bad) for bad in bad_values(check)]
            for arg, arg_check in (check.args.items() if isinstance(check, Factory) else []):
                cases += [(settings, f"{field.name}.{arg}", bad) for bad in bad_values(arg_check)]
    return cases


FIELD_CASES = field_cases()


def override_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{override_value(x)}" for k, x in v.items()) + "}"
    return "nan" if isinstance(v, float) and math.isnan(v) else show(v)


def _target(group: str, option: str):
    from hydra.utils import get_object

    from attnlab.builders import part_config

    return get_object(part_config(group, option)["_target_"])


def option_reading(group: str, name: str) -> str:
    """A conf option of ``group`` whose part reads setting ``name``: one whose YAML sets it, else one whose class
    takes it (``pos.init_std``: learned)."""
    from attnlab.builders import part_config

    found = [o for o in options(group) if name in part_config(group, o)]
    found = found or [o for o in options(group) if part_config(group, o)
                      and name in inspect.signature(_target(group, o)).parameters]
    assert found, f"no {group} option reads {name}"
    return found[0]


def run_config(settings: type[Settings], dotted: str) -> list[str]:
    """The train.py overrides of a run whose model reads ``dotted`` of these settings."""
    if settings is MaskingSettings:
        return ["model=masked_lm"]
    group = settings.GROUP
    return ["model=causal_lm", f"{group}={option_reading(group, dotted.split('.')[0])}"]


@pytest.mark.parametrize("settings,key,bad", FIELD_CASES,
                         ids=[f"{s.GROUP}.{k}={override_value(b)}" for s, k, b in FIELD_CASES])
def test_every_bad_value_of_every_setting_is_one_line_from_train_py_and_from_the_part(settings, key, bad, tmp_path):
    full = settings.key(key)
    base = compose_train(run_config(settings, key), tmp_path)
    present = OmegaConf.select(base, full, default="<absent>") != "<absent>"
    override = f"{'' if present else '+'}{full}={override_value(bad)}"
    with pytest.raises(ConfigError) as refused:
        validate_config(apply(base, Case(override, "setting", (override,))), [override])
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{full}="), line
    assert f"{full}={show(bad)}: " in line, line
    # the part built in Python (a notebook) refuses it with the same line
    with pytest.raises(SettingError) as built:
        build_part(settings, key, bad)
    assert str(built.value) == line


def build_part(settings: type[Settings], key: str, value: Any) -> Any:
    """The part (or task) these settings belong to, built in Python with ``key`` (``layer.eps``: an argument of the
    part inside) set to ``value``."""
    import torch.nn as nn

    from attnlab.modules.attention import MultiHeadAttention
    from attnlab.modules.feedforward import FeedForward
    from attnlab.modules.moe import mixture_of_experts
    from attnlab.modules.parts import Norm
    from attnlab.tasks.masked_lm import MaskedLMTask

    name, _, arg = key.partition(".")
    if arg:  # an argument of the norm's layer
        value = functools.partial(nn.LayerNorm, **{arg: value})
    kw = {name: value}
    group = settings.GROUP
    if group == "attn":
        return MultiHeadAttention(16, 4, **kw)
    if group == "ffn":
        return FeedForward(16, **kw)
    if group == "norm":
        return Norm(**{"layer": functools.partial(nn.LayerNorm), **kw})
    if group == "moe":
        return mixture_of_experts(16, expert=nn.Identity, **kw)
    if group == "pos":
        return _target("pos", option_reading("pos", name))(max_len=8, d_model=16, n_heads=4, **kw)
    assert settings is MaskingSettings
    return MaskedLMTask(net=None, **kw)


@pytest.mark.parametrize("group", list(PART_SETTINGS))
def test_a_key_the_settings_do_not_declare_is_refused_naming_those_they_have(group, tmp_path):
    settings = PART_SETTINGS[group]
    override = f"+{group}.no_such_setting=1"
    base = compose_train(["model=causal_lm", *(["moe=on"] if group == "moe" else [])], tmp_path)
    with pytest.raises(ConfigError) as refused:
        validate_config(apply(base, Case(override, "override", (override,))), [override])
    assert str(refused.value) == f"{group}.no_such_setting=1: unknown key; {group} has {', '.join(settings.names())}"


# --- the relations, the same in both places ---------------------------------------------------------------------

SIZES = [(64, 4), (64, 3), (66, 6), (30, 4), (48, 8), (64, 16)]  # divisible or not; even, odd or 1-wide heads


def size_cases() -> list[tuple[str, str, tuple[str, ...]]]:
    """Every option of the groups whose settings relate to the net's sizes, with a few settings of those options
    (attn: kv_heads each divisor and not)."""
    cases = []
    for group, settings in PART_SETTINGS.items():
        if settings.size_problems is not Settings.size_problems:
            for option in options(group):
                extra = [()] if group != "attn" else [(), ("attn.kv_heads=2",), ("attn.kv_heads=3",)]
                cases += [(group, option, e) for e in extra]
    return cases


@pytest.mark.parametrize("group,option,extra", size_cases())
def test_relations_to_the_sizes_say_the_same_from_train_py_and_from_the_part(group, option, extra, tmp_path):
    from attnlab.models.causal_lm import CausalLM
    from attnlab.builders import load_part

    base = compose_train(["model=causal_lm", f"{group}={option}"], tmp_path)
    for d_model, n_heads in SIZES:
        overrides = (f"model.net.d_model={d_model}", f"model.net.n_heads={n_heads}", *extra)
        said = config_problems(apply(base, Case("sizes", "sizes", overrides)))
        part = load_part(group, option, **{o.split("=")[0].split(".")[1]: int(o.split("=")[1]) for o in extra})
        try:
            CausalLM(vocab_size=16, d_model=d_model, n_layers=1, n_heads=n_heads, max_len=8, **{group: part})
        except SettingError as e:
            built = [str(e)]
        else:
            built = []
        assert said == built, (d_model, n_heads, extra)


@pytest.mark.parametrize("option", options("pos"))
def test_the_vits_grid_refuses_the_same_positions_before_torch_and_when_built(option, tmp_path):
    from attnlab.builders import load_part
    from attnlab.modules.parts import resolve_positions

    said = config_problems(compose_train(["model=vit", f"pos={option}"], tmp_path))
    try:
        resolve_positions(load_part("pos", option))(max_len=17, d_model=16, n_heads=4, grid=(4, 4))
    except SettingError as e:
        built = [str(e)]
    else:
        built = []
    assert said == built
    assert bool(said) == (option in PositionSettings.SEQUENCE_ONLY)


def test_the_position_kinds_are_conf_pos_options():
    """Each conf/pos option is either a sequence-only or a grid position (a new one must say which), and is the
    kind of the class it builds."""
    assert sorted(PositionSettings.SEQUENCE_ONLY + PositionSettings.ON_A_GRID) == options("pos")
    for option in options("pos"):
        target = OmegaConf.load(CONF_DIR / "pos" / f"{option}.yaml")["_target_"]
        assert position_kind(target) == option


# --- defaults ---------------------------------------------------------------------------------------------------


def _builders(settings: type[Settings]) -> list:
    from hydra.utils import get_object

    from attnlab.builders import part_config
    from attnlab.modules.parts import Norm
    from attnlab.tasks.masked_lm import MaskedLMTask

    if settings is MaskingSettings:
        return [MaskedLMTask]
    if settings.GROUP == "norm":
        return [Norm]
    return [get_object(t) for t in {part_config(settings.GROUP, o).get("_target_") for o in options(settings.GROUP)}
            if t]


@pytest.mark.parametrize("settings", ALL_SETTINGS, ids=lambda s: s.__name__)
def test_every_setting_is_an_argument_of_its_part_with_the_same_default(settings):
    plain = (type(None), bool, int, float, str)
    builders = _builders(settings)
    for field in settings.settings():
        takes = [inspect.signature(b).parameters[field.name] for b in builders
                 if field.name in inspect.signature(b).parameters]
        assert takes, f"{settings.__name__}.{field.name} is an argument of none of {builders}"
        for parameter in takes:
            if isinstance(parameter.default, plain) and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == field.default, (settings.__name__, field.name)
