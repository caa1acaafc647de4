"""``debug=fast`` sets only what each family's data read: every key it puts under ``data`` is an argument of the data
module, the text data get the tiny vocabulary and sequence length (conf/debug/data/), and no data module takes an
argument it ignores. A debug run saved when every data option got those sizes still resumes."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import pytest
from helpers import compose_train
from hydra.utils import get_object
from omegaconf import OmegaConf, open_dict

from attnlab.runs import resume
from attnlab.data.hf_datamodule import HF_READERS
from attnlab.families import families
from attnlab.core.paths import CONF_DIR

SIZES = ("vocab_size", "seq_len")
DATA_OPTIONS = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))


def data_modules(target: str) -> list[type]:
    """The data module classes a ``data._target_`` builds (``data=hf``: a function picking one per data kind)."""
    obj = get_object(target)
    return [obj] if isinstance(obj, type) else sorted(set(HF_READERS.values()), key=lambda c: c.__name__)


def accepted(cls: type) -> set[str]:
    """The keyword arguments ``cls(...)`` takes: its ``__init__``'s, and its bases' while ``**kwargs`` passes on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


@functools.cache
def ignored(cls: type) -> dict[str, list[str]]:
    """``{class: [arguments its __init__ never reads]}`` over the attnlab classes of ``cls``'s MRO. An argument is
    read if its name is used in the ``__init__`` body; where the ``__init__`` saves its hyper-parameters (Lightning),
    also if the class reads it back anywhere (``self.hparams.seed``, ``hp["seed"]``: an attribute or a string of
    that name in the class)."""
    out = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or not klass.__module__.startswith("attnlab."):
            continue
        init = ast.parse(textwrap.dedent(inspect.getsource(vars(klass)["__init__"]))).body[0]
        args = init.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self"]
        params += [args.kwarg.arg] if args.kwarg else []
        body = [n for statement in init.body for n in ast.walk(statement)]
        read = {n.id for n in body if isinstance(n, ast.Name)}
        if any(isinstance(n, ast.Attribute) and n.attr == "save_hyperparameters" for n in body):
            for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(klass)))):
                read |= {n.attr} if isinstance(n, ast.Attribute) else set()
                read |= {n.value} if isinstance(n, ast.Constant) and isinstance(n.value, str) else set()
        out[klass.__name__] = [p for p in params if p not in read]
    return out


def data_node(overrides: list[str], tmp_path) -> dict:
    return OmegaConf.to_container(compose_train(overrides, tmp_path).data, resolve=True)


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_debug_fast_sets_only_what_the_familys_data_read(family, tmp_path):
    plain = data_node([f"model={family.name}"], tmp_path)
    fast = data_node([f"model={family.name}", "debug=fast"], tmp_path)
    classes = data_modules(fast["_target_"])
    takes = set.intersection(*(accepted(c) for c in classes))
    changed = {k for k in fast if k not in plain or fast[k] != plain[k]}
    assert "batch_size" in changed  # debug=fast reached this family's data at all
    assert changed <= takes, f"debug=fast sets data.{sorted(changed - takes)}, which {classes} do not take"
    # what the model and data read get the tiny sizes; a data module without them is given none
    assert {k for k in SIZES if k in takes} <= changed
    assert not set(SIZES) & (set(fast) - takes)
    for cls in classes:
        assert not any(ignored(cls).values()), f"{cls.__name__} takes arguments it never reads: {ignored(cls)}"


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_every_data_option_reads_its_arguments_and_debug_fast_sizes_it(option):
    target = OmegaConf.load(CONF_DIR / "data" / f"{option}.yaml").get("_target_")
    if target is None:  # an option that only changes another's values (text_file: pydoc's module)
        target = OmegaConf.load(CONF_DIR / "data" / "pydoc.yaml")._target_
    classes = data_modules(target)
    for cls in classes:
        assert not any(ignored(cls).values()), f"{cls.__name__} takes arguments it never reads: {ignored(cls)}"
    reads_sizes = any(set(SIZES) & accepted(c) for c in classes)
    assert (CONF_DIR / "debug" / "data" / f"fast_{option}.yaml").is_file() == reads_sizes


def test_a_command_line_size_wins_over_debug_fast(tmp_path):
    fast = data_node(["model=causal_lm", "debug=fast", "data.vocab_size=300"], tmp_path)
    assert (fast["vocab_size"], fast["seq_len"]) == (300, 32)


def test_a_debug_run_saved_with_the_sizes_on_image_data_still_resumes(tmp_path):
    """Its saved config names data.vocab_size / data.seq_len for data=digits; resume= compares every data key."""
    cfg = compose_train(["model=vit", "debug=fast"], tmp_path / "out")
    old = cfg.copy()
    with open_dict(old):
        old.data.vocab_size, old.data.seq_len = 512, 32  # as the preset set them on every data option
    assert resume.data_differences(old.data, cfg.data)  # compared as saved, they would be refused
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    OmegaConf.save(old, tmp_path / "run" / resume.SAVED_CONFIG)
    saved = resume.saved_config(tmp_path / "run")
    assert resume.data_differences(saved.data, cfg.data) == []
    get_object(saved.data._target_)(**{k: v for k, v in OmegaConf.to_container(saved.data, resolve=True).items()
                                        if k != "_target_"})  # and it builds
