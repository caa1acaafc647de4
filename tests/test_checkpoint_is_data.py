"""A checkpoint or a run folder names no code that gets run.

``torch.load(weights_only=True)`` keeps a pickle from running code (tests/test_safe_checkpoints.py), but the config a
checkpoint or ``.hydra/config.yaml`` holds is instantiated by Hydra: a ``_target_`` is an import path that gets
called. Every loader checks every ``_target_`` against one allow-list (:mod:`attnlab.checkpoints.allowed_targets`, computed from
conf/) before anything is imported or built. Tested as a property:

* the space, in-process through the checking function every loader calls: every place a config node sits in the
  hyper-parameters of a real checkpoint of each family (generated from tests/fixtures/legacy_*.ckpt, upgraded to
  today's layout) x each hostile target (files written, copied, linked, a shell) x each way to name it (``_target_``,
  a partial, inside ``_args_``, an ``oc.create`` interpolation, Lightning's ``_instantiator``);
* that every entry point reaches that function: one hostile file per entry point, as a user runs it (subprocess):
  exit 2, one line naming the key and the target, and the marker the target would write never appears;
* damaged-but-loadable checkpoints (sizes changed, no tokenizer, no hyper-parameters) and ``ckpt_path=`` of another
  family or other sizes: one line naming the file and what is wrong, exit 2.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from cli_checks import one_error_line, snapshot
from helpers import run_cli

from attnlab.core.errors import UnsafeTargetError
from attnlab.checkpoints.allowed_targets import allowed, check_targets, refusals, task_classes
from attnlab.checkpoints.upgrade import upgrade_net_config
from attnlab.core.errors import CheckpointError, PartError
from attnlab.checkpoints.read import hyper_parameters
from attnlab.runs.load import load_task
from attnlab.core.paths import ROOT
from preloaded_python import run as run_python

FIXTURES = ROOT / "tests" / "fixtures"
LEGACY = {p.stem.removeprefix("legacy_"): p for p in sorted(FIXTURES.glob("legacy_*.ckpt"))}
REFUSED = "refused, nothing from it was imported, built or run"
QUIET = ["logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]


# ---------------------------------------------------------------------------------------------------------------
# the hostile targets: each would write the marker file if Hydra instantiated it
# ---------------------------------------------------------------------------------------------------------------
def hostile_configs(marker: Path) -> dict[str, dict]:
    """target -> a config that, instantiated, creates ``marker`` (os.system and exec: Hydra's own blocklist stops
    them, the allow-list must anyway)."""
    source = FIXTURES / "legacy_causal_lm.ckpt"
    return {
        "builtins.open": {"_target_": "builtins.open", "file": str(marker), "mode": "w"},
        "pathlib.Path.write_text": {"_target_": "pathlib.Path.write_text",
                                    "_args_": [{"_target_": "pathlib.Path", "_args_": [str(marker)]}, "import os"]},
        "shutil.copyfile": {"_target_": "shutil.copyfile", "src": str(source), "dst": str(marker)},
        "os.symlink": {"_target_": "os.symlink", "src": str(source), "dst": str(marker)},
        "os.system": {"_target_": "os.system", "_args_": [f"touch {marker}"]},
        "builtins.exec": {"_target_": "builtins.exec", "_args_": [f"open({str(marker)!r}, 'w')"]},
    }


WRITES_FILES = ("builtins.open", "pathlib.Path.write_text", "shutil.copyfile", "os.symlink")  # not on Hydra's blocklist


@pytest.mark.parametrize("target", WRITES_FILES)
def test_each_hostile_target_does_write_when_instantiated(target, tmp_path):
    """The premise: these configs are dangerous, and the allow-list refuses each."""
    import hydra

    marker = tmp_path / "marker"
    cfg = hostile_configs(marker)[target]
    try:
        hydra.utils.instantiate(cfg)
    except Exception:  # noqa: BLE001 - open() returns a file object, write_text an int: only the side effect counts
        pass
    assert marker.exists() or marker.is_symlink()
    assert not allowed(target) and not allowed(target, "run")


# ---------------------------------------------------------------------------------------------------------------
# the space, in-process: every config node of every family's checkpoint x every target x every way to name it
# ---------------------------------------------------------------------------------------------------------------
def hparams_of(family: str) -> dict:
    ckpt = torch.load(LEGACY[family], weights_only=True)
    hp = dict(ckpt["hyper_parameters"])
    hp["net"] = upgrade_net_config(hp["net"])  # today's layout: parts (norm.layer, ffn.activation, pos, attn)
    return hp


def mapping_paths(node, path=()) -> list[tuple]:
    """Every place a mapping sits (the root included): where a config node, and so a _target_, can be."""
    out = [path] if isinstance(node, dict) else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += mapping_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += mapping_paths(v, (*path, i))
    return out


def at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def inject(hp: dict, path: tuple, how: str, hostile: dict) -> dict:
    hp = copy.deepcopy(hp)
    node = at(hp, path)
    if how == "target":  # the node itself becomes the hostile call (replacing or adding its _target_)
        node.clear()
        node.update(copy.deepcopy(hostile))
    elif how == "partial":
        node.clear()
        node.update({**copy.deepcopy(hostile), "_partial_": True})
    elif how == "args":  # a hostile call among the node's positional arguments
        node["_args_"] = [1, copy.deepcopy(hostile)]
    elif how == "interpolation":  # instantiate resolves it into a node with a _target_
        node["extra"] = "${oc.create:" + yaml.safe_dump(hostile, default_flow_style=True).strip() + "}"
    elif how == "lightning":
        node["_instantiator"] = hostile["_target_"]
    return hp


HOW = ("target", "partial", "args", "interpolation", "lightning")


@pytest.mark.parametrize("family", sorted(LEGACY))
def test_every_place_and_way_a_checkpoint_names_code_is_refused(family, tmp_path):
    """The generated space for one family: refusals() names the spot, hyper_parameters() (what every loader calls)
    raises one line naming the key and the target."""
    hp = hparams_of(family)
    hyper_parameters({"hyper_parameters": hp}, "ok.ckpt")  # the genuine one passes
    marker = tmp_path / "marker"
    places = mapping_paths(hp)
    assert len(places) >= 4, places  # root, net, optimizer, scheduler (+ the parts of today's layout)
    checked = 0
    for target, hostile in hostile_configs(marker).items():
        for path in places:
            for how in HOW:
                bad = inject(hp, path, how, hostile)
                found = list(refusals(bad))
                assert found, (family, target, path, how)
                with pytest.raises(UnsafeTargetError) as info:
                    hyper_parameters({"hyper_parameters": bad}, "x.ckpt")
                message = str(info.value)
                assert "\n" not in message and REFUSED in message and message.startswith("x.ckpt: hyper_parameters")
                if how in ("target", "partial", "args"):
                    assert f"{target!r}" in message, message
                checked += 1
    assert not marker.exists()
    assert checked >= len(hostile_configs(marker)) * len(HOW) * 4


def test_the_allow_list_is_computed_from_conf_and_keeps_every_shipped_target():
    """Every _target_ the project's own configs and old checkpoints use passes; a hostile task class does not."""
    from attnlab.checkpoints.allowed_targets import _conf_targets

    targets = _conf_targets()
    assert "attnlab.modules.norm.RMSNorm" in targets["model"] and "torch.nn.GELU" in targets["model"]
    assert "lightning.pytorch.trainer.Trainer" in targets["run"] and "lightning.pytorch.trainer.Trainer" not in \
        targets["model"]  # a checkpoint may name parts of a model, never a trainer, logger or data module
    from attnlab.families import families

    assert task_classes() == {f.task for f in families()}  # the conf/model options' tasks: the registered families
    for family in LEGACY:  # old checkpoints (their upgraded configs) keep loading
        assert not list(refusals(hparams_of(family)))
    assert allowed("torch.nn.RMSNorm") and allowed("torch.nn.Mish")  # documented overrides: torch's own layers
    assert not allowed("torch.nn.functional") and not allowed("torch.nn.init.normal_")
    assert not allowed("torch.nn.modules.module.Module.register_forward_hook")


@pytest.mark.parametrize("target", list(hostile_configs(Path("m"))))
def test_the_parts_build_nothing_a_config_names(target, tmp_path):
    """The modules take built parts only: a config mapping given where a part goes is refused, never instantiated
    (whatever it names), so the only builders of a file's config are behind the trusted read."""
    from attnlab.modules.parts import resolve_norm, resolve_part

    marker = tmp_path / "marker"
    hostile = {**hostile_configs(marker)[target], "_partial_": True}
    builds = [lambda: resolve_norm({"placement": "pre", "layer": hostile})]
    builds += [lambda g=g: resolve_part(g, hostile, None) for g in ("ffn", "moe", "attn", "pos")]
    for build in builds:
        with pytest.raises(PartError, match=f"got the config of {target}, not the part"):
            build()
    assert not marker.exists()


@pytest.mark.parametrize("place", [("net",), ("net", "norm", "layer"), ("net", "ffn", "activation"), ("optimizer",),
                                   ("scheduler",)])
def test_lightnings_load_from_checkpoint_goes_through_the_trusted_read(place, tmp_path):
    """``Task.load_from_checkpoint`` (Lightning's spelling, which notebooks use) reads through ``read_trusted``: a
    hostile target anywhere in the file is one line, nothing built; a genuine file loads strictly."""
    from attnlab.tasks.causal_lm import CausalLMTask

    marker = tmp_path / "marker"
    raw = torch.load(LEGACY["causal_lm"], weights_only=True)
    for target, hostile in hostile_configs(marker).items():
        ckpt = tmp_path / "hostile.ckpt"
        torch.save({**raw, "hyper_parameters": inject(hparams_of("causal_lm"), place, "target", hostile)}, ckpt)
        with pytest.raises(UnsafeTargetError, match=rf"hyper_parameters: {'.'.join(place)}\._target_ = '{target}'"):
            CausalLMTask.load_from_checkpoint(ckpt, weights_only=True)
    assert not marker.exists()
    task = CausalLMTask.load_from_checkpoint(LEGACY["causal_lm"], weights_only=True)
    ours = torch.load(LEGACY["causal_lm"], weights_only=True)["state_dict"]
    assert len(task.state_dict()) == len(ours)


def test_load_task_refuses_each_target_before_building(tmp_path):
    """Through the file loader every entry point uses: each target at a part of today's layout and at the net."""
    marker = tmp_path / "marker"
    raw = torch.load(LEGACY["causal_lm"], weights_only=True)
    hp = hparams_of("causal_lm")
    places = [("net",), ("net", "norm", "layer"), ("net", "ffn", "activation"), ("net", "pos")]
    for i, (target, hostile) in enumerate(hostile_configs(marker).items()):
        path = places[i % len(places)]
        ckpt = tmp_path / f"{i}.ckpt"
        torch.save({**raw, "hyper_parameters": inject(hp, path, "target", hostile)}, ckpt)
        with pytest.raises(UnsafeTargetError, match=rf"{ckpt}: hyper_parameters: {'.'.join(path)}\._target_ = "
                                                    rf"'{target}'"):
            load_task(ckpt, "attnlab.tasks.causal_lm.CausalLMTask", "language-model")
    # a hostile task class: never imported
    ckpt = tmp_path / "task.ckpt"
    torch.save({**raw, "task_class": "attnlab.claims.__main__.main"}, ckpt)
    with pytest.raises(UnsafeTargetError, match=r"task_class = 'attnlab.claims.__main__.main' is not one of"):
        load_task(ckpt, "attnlab.tasks.base.Task", "attnlab")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------------
# run folders: a hostile .hydra/config.yaml
# ---------------------------------------------------------------------------------------------------------------
def hostile_run(folder: Path, marker: Path, where: str = "callbacks", ckpt: Path | None = LEGACY["causal_lm"]) -> Path:
    """A run folder whose saved config names builtins.open (under ``where``) and whose last.ckpt is genuine."""
    (folder / ".hydra").mkdir(parents=True)
    cfg = {"model": {"name": "causal_lm"}, "data": {"_target_": "attnlab.data.lm_datamodule.LMDataModule"},
           where: {"evil": hostile_configs(marker)["builtins.open"]}}
    if where == "data":
        cfg["data"] = hostile_configs(marker)["builtins.open"]
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    if ckpt is not None:
        (folder / "checkpoints").mkdir()
        shutil.copy(ckpt, folder / "checkpoints" / "last.ckpt")
    return folder


def test_claims_and_sweep_readers_refuse_a_hostile_run_config(tmp_path):
    """The claims build data modules and nets from a job's saved config: refused when it names foreign code."""
    sys.path.insert(0, str(ROOT))
    try:
        from experiments.claims.base import Job
        from experiments.claims.runs import built_net, load_run
    finally:
        sys.path.remove(str(ROOT))
    marker = tmp_path / "marker"
    job = Job(hostile_run(tmp_path / "0", marker, where="data", ckpt=LEGACY["transformer_mt"]))
    for read in (lambda: job.config, lambda: load_run(job), lambda: built_net(job)):
        with pytest.raises(UnsafeTargetError, match=r"config.yaml: data\._target_ = 'builtins.open'"):
            read()
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------------
# every entry point reaches the check: one hostile file each, as a user runs it
# ---------------------------------------------------------------------------------------------------------------
def hostile_ckpt(tmp_path: Path, family: str, path: tuple, how: str, target: str, marker: Path) -> Path:
    raw = torch.load(LEGACY[family], weights_only=True)
    out = tmp_path / f"{family}_{how}.ckpt"
    torch.save({**raw, "hyper_parameters": inject(hparams_of(family), path, how, hostile_configs(marker)[target])},
               out)
    return out


def cli(script: str, *args: str, cache_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, *(["-m", script] if "." in script and not script.endswith(".py") else [script]), *args]
    return run_python(cmd, cwd=ROOT, env=env, input="one\n", capture_output=True, text=True, timeout=180)


# entry point -> (hostile file: family, place, way, target; command line)
ENTRY_POINTS = {
    "translate": (("transformer_mt", ("net", "norm", "layer"), "target", "builtins.open"),
                  lambda c, d: ("translate.py", f"ckpt={c}", f"hydra.run.dir={d}")),
    "generate": (("causal_lm", ("net", "ffn", "activation"), "target", "pathlib.Path.write_text"),
                 lambda c, d: ("generate.py", f"ckpt={c}", f"hydra.run.dir={d}")),
    "synthesize": (("tts", ("net", "ffn"), "args", "shutil.copyfile"),
                   lambda c, d: ("synthesize.py", f"ckpt={c}", "text=one", f"hydra.run.dir={d}")),
    # train.py ckpt_path= with train=true goes through the same check (train_job), shown by train_other_family below
    "train_test_only": (("causal_lm", ("net", "pos"), "partial", "os.symlink"),
                        lambda c, d: ("train.py", "model=causal_lm", "debug=fast", "train=false", f"ckpt_path={c}",
                                      *QUIET, f"hydra.run.dir={d}")),
    "surface_forms": (("transformer_mt", ("net", "ffn"), "interpolation", "builtins.open"),
                      lambda c, d: ("attnlab.cli.surface_forms", str(c))),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_checkpoint_entry_point_refuses_a_hostile_target(entry, tmp_path, cache_dir):
    (family, place, how, target), command = ENTRY_POINTS[entry]
    marker = tmp_path / "marker"
    ckpt = hostile_ckpt(tmp_path, family, place, how, target, marker)
    script, *args = command(ckpt, tmp_path / "run")
    proc = cli(script, *args, cache_dir=cache_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    line = one_error_line(out, REFUSED)
    assert str(ckpt) in line and ".".join(map(str, place)) in line, line
    assert not marker.exists() and not marker.is_symlink()
    assert not (tmp_path / "run").exists() or entry.startswith(("translate", "generate", "synthesize")), \
        sorted(p.name for p in (tmp_path / "run").iterdir())


@pytest.mark.parametrize("hostile", ["checkpoint", "saved_config"])
def test_resume_refuses_a_hostile_run_folder_and_leaves_it_untouched(hostile, tmp_path, cache_dir):
    """resume=<run>: its last.ckpt or its .hydra/config.yaml names builtins.open; refused before Hydra writes."""
    marker = tmp_path / "marker"
    if hostile == "checkpoint":
        ckpt = hostile_ckpt(tmp_path, "causal_lm", ("net", "norm", "layer"), "partial", "builtins.open", marker)
        run = hostile_run(tmp_path / "run", marker, ckpt=ckpt)
        (run / ".hydra" / "config.yaml").unlink()  # no saved config: the checkpoint alone must be refused
        expected = f"{run / 'checkpoints' / 'last.ckpt'}: hyper_parameters: net.norm.layer._target_"
    else:
        # in the part resume resolves (its callbacks and loggers are never read: a user's own callback is fine)
        run = hostile_run(tmp_path / "run", marker, where="model")
        expected = f"{run / '.hydra' / 'config.yaml'}: model.evil._target_ = 'builtins.open'"
    before = snapshot(run)
    proc = run_cli(["model=causal_lm", "debug=fast", f"resume={run}", *QUIET], cache_dir)
    assert proc.returncode == 2, proc.stdout[-3000:]
    line = one_error_line(proc.stdout, REFUSED)
    assert expected in line, line
    assert snapshot(run) == before and not marker.exists()


def test_review_notebook_refuses_a_hostile_checkpoint(tmp_path):
    """notebooks/review_run.ipynb on a run folder whose last.ckpt names builtins.open: the cell reading it stops
    with the one-line refusal; nothing after it runs (executed up to the failing cell, with nbclient)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    marker = tmp_path / "marker"
    ckpt = hostile_ckpt(tmp_path, "transformer_mt", ("net",), "target", "builtins.open", marker)
    run = hostile_run(tmp_path / "run", marker, ckpt=ckpt)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "transformer_mt"}}))
    nb = nbformat.read(ROOT / "notebooks" / "review_run.ipynb", as_version=4)
    [params] = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = f"RUN_DIR = {str(run)!r}"
    with pytest.raises(CellExecutionError) as info:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    assert "UnsafeTargetError" in str(info.value) and "net._target_ = 'builtins.open'" in str(info.value)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------------
# damaged-but-loadable checkpoints, and ckpt_path= of another family or other sizes
# ---------------------------------------------------------------------------------------------------------------
def damaged(raw: dict, kind: str) -> dict:
    """One kind of damage a file can have and still load with weights_only=True."""
    out = {**raw, "state_dict": dict(raw["state_dict"])}
    sd = out["state_dict"]
    if kind == "size":
        key = next(k for k, v in sd.items() if v.dim() == 2)
        sd[key] = torch.zeros(sd[key].shape[0] + 3, sd[key].shape[1])
    elif kind == "missing_key":
        sd.pop(next(iter(sd)))
    elif kind == "extra_key":
        sd["net.extra.weight"] = torch.zeros(2)
    elif kind == "no_state_dict":
        out.pop("state_dict")
    elif kind == "no_hyper_parameters":
        out.pop("hyper_parameters")
    elif kind == "no_net":
        out["hyper_parameters"] = {k: v for k, v in raw["hyper_parameters"].items() if k != "net"}
    elif kind == "no_tokenizer":
        out.pop("tokenizer")
    elif kind == "bad_tokenizer":
        out["tokenizer"] = out["tokenizer"][: len(out["tokenizer"]) // 2]
    elif kind == "bad_net":
        out["hyper_parameters"] = {**raw["hyper_parameters"], "net": {**raw["hyper_parameters"]["net"],
                                                                       "n_heads": "many"}}
    return out


DAMAGE = {"size": "size mismatch for net.", "missing_key": "that the checkpoint lacks",
          "extra_key": "net.extra.weight that this model lacks", "no_state_dict": "holds no state_dict",
          "no_hyper_parameters": "has no hyper_parameters", "no_net": "has no hyper_parameters",
          "no_tokenizer": "has no tokenizer", "bad_tokenizer": "its tokenizer cannot be read",
          "bad_net": "cannot build CausalLMTask from its hyper_parameters"}


def test_each_kind_of_damage_is_one_line_naming_the_file(tmp_path):
    raw = torch.load(LEGACY["causal_lm"], weights_only=True)
    for kind, text in DAMAGE.items():
        ckpt = tmp_path / f"{kind}.ckpt"
        torch.save(damaged(raw, kind), ckpt)
        with pytest.raises((CheckpointError, UnsafeTargetError)) as info:
            load_task(ckpt, "attnlab.tasks.causal_lm.CausalLMTask", "language-model")
        message = str(info.value)
        assert text in message and str(ckpt) in message and "\n" not in message, (kind, message)


def test_size_mismatch_names_both_sizes(tmp_path):
    raw = torch.load(LEGACY["causal_lm"], weights_only=True)
    ckpt = tmp_path / "size.ckpt"
    torch.save(damaged(raw, "size"), ckpt)
    with pytest.raises(CheckpointError, match=r"size mismatch for net\.\S+: checkpoint 303x16, this model 300x16"):
        load_task(ckpt, "attnlab.tasks.causal_lm.CausalLMTask", "language-model")


@pytest.mark.parametrize("case", [pytest.param("translate_size", marks=pytest.mark.slow),
                                  pytest.param("generate_no_tokenizer", marks=pytest.mark.slow),
                                  pytest.param("synthesize_no_hparams", marks=pytest.mark.slow),
                                  "train_other_family", "train_other_sizes"])
def test_damaged_or_foreign_checkpoints_through_the_entry_points(case, tmp_path, cache_dir):
    """Each CLI reaches load_task (shown above with hostile files), whose refusal of every kind of damage is tested
    in-process; through the entry points by default: train.py's own checks (the family before Lightning is imported,
    the sizes once the model is built, before any logger exists). The CLIs' with -m slow."""
    family = {"translate": "transformer_mt", "generate": "causal_lm", "synthesize": "tts"}.get(case.split("_")[0],
                                                                                              "causal_lm")
    raw = torch.load(LEGACY[family], weights_only=True)
    kind = {"translate_size": "size", "generate_no_tokenizer": "no_tokenizer",
            "synthesize_no_hparams": "no_hyper_parameters"}.get(case)
    ckpt = tmp_path / "x.ckpt"
    torch.save(damaged(raw, kind) if kind else raw, ckpt)
    run = tmp_path / "run"
    command = {
        "translate_size": ("translate.py", f"ckpt={ckpt}", f"hydra.run.dir={run}"),
        "generate_no_tokenizer": ("generate.py", f"ckpt={ckpt}", f"hydra.run.dir={run}"),
        "synthesize_no_hparams": ("synthesize.py", f"ckpt={ckpt}", "text=one", f"hydra.run.dir={run}"),
        # the default model translates: a language model's checkpoint is refused before Lightning is imported
        "train_other_family": ("train.py", "debug=fast", f"ckpt_path={ckpt}", *QUIET, f"hydra.run.dir={run}"),
        # model=causal_lm with its own sizes: the 16-wide, 1-layer checkpoint does not fit (checked once built);
        # its data settings (other data are refused before Lightning, tests/test_run_folder.py)
        "train_other_sizes": ("train.py", "model=causal_lm", "debug=fast", "data.seq_len=16", "data.vocab_size=300",
                              f"ckpt_path={ckpt}", *QUIET, f"hydra.run.dir={run}"),
    }[case]
    text = {"translate_size": "size mismatch for net.", "generate_no_tokenizer": "has no tokenizer",
            "synthesize_no_hparams": "has no hyper_parameters",
            "train_other_family": "is a language model checkpoint (CausalLMTask), but this run builds a translation",
            "train_other_sizes": "does not fit this model"}[case]
    proc = cli(*command, cache_dir=cache_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    line = one_error_line(out, text)
    assert str(ckpt) in line, line
    if case.startswith("train"):
        assert not run.exists(), sorted(p.name for p in run.rglob("*"))  # no W&B run, no folder left behind


def test_every_shipped_model_passes_and_a_command_line_target_does_not(tmp_path):
    """No false refusal: every model option's composed config passes the check train.py makes before Lightning is
    imported; and no conf/ file interpolates a _target_, so composing options (experiments included) yields only
    targets the files name literally. A class given only on the command line is refused (its checkpoint would be)."""
    from helpers import compose_train

    from attnlab.core.paths import CONF_DIR

    for path in CONF_DIR.rglob("*.yaml"):
        assert not [line for line in path.read_text().splitlines()
                    if "_target_:" in line.split("#")[0] and "${" in line.split("#")[0]], path
    for option in sorted((CONF_DIR / "model").glob("*.yaml")):
        check_targets(compose_train([f"model={option.stem}"], tmp_path).model, "model")
    cfg = compose_train(["model=causal_lm", "ffn.activation._target_=builtins.print"], tmp_path)
    with pytest.raises(UnsafeTargetError, match=r"model: net\.ffn\.activation\._target_ = 'builtins.print'"):
        check_targets(cfg.model, "model")
