"""``python -m attnlab.export format=safetensors``: a model's folder with no pickle in it, which every entry point
loads where it loads a checkpoint (docs/weights.md).

Properties, over their space: every family's committed checkpoint x {fp32, bf16} exports and loads back (no
unpickler runs) with the same task, settings, tokenizer and weights (bit for bit in fp32; bf16 rounding exactly as
torch rounds), the dtype on disk the one asked; an export exported again is the same file byte for byte. Through
the entry points as users run them, a checkpoint and its export give the same output. Every bad option, output
folder or damaged file is one line with nothing written, and a folder naming foreign code is refused like a
checkpoint that does.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import EPOCH, finished_run, one_error_line, snapshot
from helpers import run_cli, run_entry

from attnlab.checkpoints.exported import SETTINGS, TOKENIZER, WEIGHTS
from attnlab.cli.export import export
from attnlab.core.errors import CheckpointError, UnsafeTargetError
from attnlab.runs.load import load_task

FIXTURES = Path(__file__).parent / "fixtures"
LEGACY = sorted(FIXTURES.glob("legacy_*.ckpt"))
ON_DISK = {"fp32": "F32", "bf16": "BF16"}
TASK = "attnlab.tasks.base.Task"


def no_unpickling(monkeypatch):
    """Any pickle read from here on fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("an unpickler ran")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("ckpt", LEGACY, ids=lambda p: p.stem.removeprefix("legacy_"))
def test_every_family_exports_and_loads_back_without_pickle(ckpt, dtype, tmp_path, monkeypatch):
    from safetensors import safe_open

    task, contents = load_task(ckpt, TASK, "attnlab")
    out = tmp_path / "export"
    written = export(ckpt, out, dtype)
    assert {p.name for p in written} == {WEIGHTS, SETTINGS} | ({TOKENIZER} if contents.get("tokenizer") else set())
    with safe_open(str(out / WEIGHTS), "pt") as f:
        kinds = {f.get_slice(k).get_dtype() for k in f.keys() if task.state_dict()[k].is_floating_point()}
    assert kinds == {ON_DISK[dtype]}
    assert json.loads((out / SETTINGS).read_text())["dtype"] == dtype

    with monkeypatch.context() as m:
        no_unpickling(m)
        loaded, read = load_task(out, TASK, "attnlab")
    assert type(loaded) is type(task) and dict(loaded.hparams) == dict(task.hparams)
    assert read.get("tokenizer") == contents.get("tokenizer")
    ours, theirs = task.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        expected = value.to(torch.bfloat16).to(value.dtype) if dtype == "bf16" and value.is_floating_point() else value
        assert torch.equal(theirs[key], expected), key
    if dtype == "bf16":  # (the rounding is real: a bf16 export that kept fp32 values would fail above)
        assert any(not torch.equal(theirs[k], v) for k, v in ours.items() if v.is_floating_point())

    again = tmp_path / "again"
    export(out, again, dtype)  # an export's export: the same bytes
    assert (again / WEIGHTS).read_bytes() == (out / WEIGHTS).read_bytes()
    assert json.loads((again / SETTINGS).read_text()) == json.loads((out / SETTINGS).read_text())


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Each family's committed checkpoint exported once (fp32)."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name in ("transformer_mt", "causal_lm", "tts"):
        out[name] = root / name
        export(FIXTURES / f"legacy_{name}.ckpt", out[name])
    return out


# entry point -> (family, its command line for a checkpoint path and an output folder)
COMMANDS = {
    "translate": ("transformer_mt", lambda c, d: ("translate.py", f"ckpt={c}", f"hydra.run.dir={d}", "beam_size=2")),
    "generate": ("causal_lm", lambda c, d: ("generate.py", f"ckpt={c}", "prompt=def", "max_new_tokens=12",
                                            "temperature=0", f"hydra.run.dir={d}")),
    "synthesize": ("tts", lambda c, d: ("synthesize.py", f"ckpt={c}", "text=one", f"out_dir={d}/wav",
                                        "griffin_lim_iters=2", f"hydra.run.dir={d}")),
    "explore": ("causal_lm", lambda c, d: ("-m", "attnlab.explore", f"ckpt={c}", "text=def", f"out={d}/page.html",
                                           f"hydra.run.dir={d}")),
}


def _outputs(folder: Path) -> dict:
    """What a command wrote: its WAVs and text files, and the data of an explorer page (its title names the file)."""
    from attnlab.explorer.page import read_payload

    out: dict = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
                 if p.is_file() and p.suffix in (".wav", ".txt")}
    for page in folder.rglob("*.html"):
        out[page.name] = {k: v for k, v in read_payload(page).items() if k != "title"}
    return out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_entry_points_give_the_same_output_from_the_export(command, exports, tmp_path, cache_dir):
    family, line = COMMANDS[command]
    results = []
    for name, ckpt in (("ckpt", FIXTURES / f"legacy_{family}.ckpt"), ("export", exports[family])):
        out = run_entry(list(line(ckpt, tmp_path / name)), cache_dir, stdin="twenty one\nfour\n")
        assert out.returncode == 0, out.stdout[-3000:]
        printed = [line for line in out.stdout.splitlines() if not line.startswith("[") and str(tmp_path) not in line]
        results.append((printed, _outputs(tmp_path / name)))
    assert results[0] == results[1]
    assert results[0][0] or results[0][1]  # (something was compared)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir):
    return finished_run(tmp_path_factory, cache_dir)


def test_train_py_tests_an_export_as_its_checkpoint_and_refuses_to_continue_from_it(finished, tmp_path, cache_dir):
    ckpt = finished / "checkpoints" / "last.ckpt"
    exported = tmp_path / "export"
    out = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={exported}", "dtype=fp32"], cache_dir)
    assert out.returncode == 0 and str(exported) in out.stdout.splitlines(), out.stdout[-3000:]
    metrics = []
    for name, path in (("ckpt", ckpt), ("export", exported)):
        run = tmp_path / f"tested_{name}"
        out = run_cli([*EPOCH, "train=false", "test=true", f"ckpt_path={path}", f"hydra.run.dir={run}"], cache_dir)
        assert out.returncode == 0, out.stdout[-3000:]
        metrics.append({k: v for k, v in json.loads((run / "metrics.json").read_text()).items()
                        if "per_sec" not in k and "time" not in k})
    assert metrics[0] == metrics[1] and "test/loss" in metrics[0]

    out = run_cli([*EPOCH, f"ckpt_path={exported}", f"hydra.run.dir={tmp_path / 'continued'}"], cache_dir)
    assert out.returncode == 2
    assert "is an exported model (weights, no training state): train=false tests it" in \
        one_error_line(out.stdout, "exported model")
    assert not (tmp_path / "continued").exists()


@pytest.mark.parametrize("case", ["out_holds_files", "out_is_a_file", "dtype", "format", "no_ckpt", "not_attnlab"])
def test_bad_export_commands_are_one_line_and_write_nothing(case, tmp_path, cache_dir):
    ckpt, out = FIXTURES / "legacy_causal_lm.ckpt", tmp_path / "out"
    args, expected = {
        "out_holds_files": ([], "already holds files: choose a new folder (nothing is overwritten)"),
        "out_is_a_file": ([], "is a file, not a folder"),
        "dtype": (["dtype=fp16"], "is not allowed: fp32 | bf16"),
        "format": (["format=onnx"], "is not allowed: safetensors"),
        "no_ckpt": ([f"ckpt={tmp_path / 'missing.ckpt'}"], "checkpoint not found"),
        "not_attnlab": ([f"ckpt={tmp_path / 'other'}"], "is a folder, not a checkpoint"),
    }[case]
    if case == "out_holds_files":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    if case == "out_is_a_file":
        out.write_text("mine")
    if case == "not_attnlab":
        (tmp_path / "other").mkdir()
    before = snapshot(tmp_path)
    result = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={out}", *args,
                        f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 2, result.stdout[-2000:]
    one_error_line(result.stdout, expected)
    assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()


def damage(folder: Path, how: str) -> None:
    if how == "truncated_weights":
        data = (folder / WEIGHTS).read_bytes()
        (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    elif how == "no_weights":
        (folder / WEIGHTS).unlink()
    elif how == "settings_not_json":
        (folder / SETTINGS).write_text("{not json")
    elif how == "other_version":
        settings = json.loads((folder / SETTINGS).read_text())
        (folder / SETTINGS).write_text(json.dumps({**settings, "version": 99}))
    elif how == "no_format":
        settings = json.loads((folder / SETTINGS).read_text())
        settings.pop("format")
        (folder / SETTINGS).write_text(json.dumps(settings))
    elif how == "header_lies":  # a header that promises more bytes than the file has
        data = bytearray((folder / WEIGHTS).read_bytes())
        data[8:8 + 2] = b"{ "
        (folder / WEIGHTS).write_bytes(bytes(data))


@pytest.mark.parametrize("how, expected", [
    ("truncated_weights", "model.safetensors cannot be read (damaged?)"),
    ("no_weights", "model.safetensors is missing"),
    ("settings_not_json", "attnlab.json cannot be read (damaged?)"),
    ("other_version", "export version 99; this attnlab reads version 1"),
    ("no_format", "is not an attnlab export"),
    ("header_lies", "model.safetensors cannot be read (damaged?)"),
])
def test_a_damaged_export_is_one_line(how, expected, exports, tmp_path):
    folder = shutil.copytree(exports["causal_lm"], tmp_path / "damaged")
    damage(folder, how)
    with pytest.raises(CheckpointError, match=re.escape(expected)) as e:
        load_task(folder, TASK, "attnlab")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("place", [("net",), ("net", "norm", "layer"), ("net", "ffn", "activation"), ("optimizer",)])
def test_an_export_naming_foreign_code_is_refused_through_translate(place, exports, tmp_path, cache_dir):
    """attnlab.json is checked as a checkpoint's hyper-parameters are: the allow-list, before anything is built."""
    marker = tmp_path / "marker"
    folder = shutil.copytree(exports["transformer_mt"], tmp_path / "hostile")
    settings = json.loads((folder / SETTINGS).read_text())
    node = settings["hyper_parameters"]
    for key in place:
        node = node.setdefault(key, {})
    node.clear()
    node.update({"_target_": "builtins.open", "file": str(marker), "mode": "w"})
    (folder / SETTINGS).write_text(json.dumps(settings))
    with pytest.raises(UnsafeTargetError, match=rf"hyper_parameters: {'.'.join(place)}\._target_ = 'builtins.open'"):
        load_task(folder, TASK, "attnlab")
    out = run_entry(["translate.py", f"ckpt={folder}", f"hydra.run.dir={tmp_path / 'run'}"], cache_dir, stdin="one\n")
    assert out.returncode == 2
    one_error_line(out.stdout, "builtins.open")
    assert not marker.exists()


def test_without_the_safetensors_package_the_export_says_what_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "safetensors", None)  # (import fails as if not installed)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(CheckpointError, match=re.escape('needs the safetensors package: pip install -e ".[weights]"')):
        export(FIXTURES / "legacy_causal_lm.ckpt", tmp_path / "out")
    assert not (tmp_path / "out" / WEIGHTS).exists()


@pytest.mark.parametrize("fails_at", [1, 2, 3])
def test_an_export_that_fails_midway_leaves_no_folder(fails_at, tmp_path, monkeypatch):
    """A full disk at the first, second or third file: no out= folder, no partial one beside it."""
    import attnlab.checkpoints.exported as exported
    from attnlab.core.errors import DiskFullError

    real, calls = exported.write_atomic, []

    def write(path, data, *args, **kwargs):
        calls.append(path)
        if len(calls) == fails_at:
            raise DiskFullError(f"{path}: no space left on device")
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(exported, "write_atomic", write)
    with pytest.raises(DiskFullError):
        export(FIXTURES / "legacy_transformer_mt.ckpt", tmp_path / "out")  # (has a tokenizer: three files)
    assert list(tmp_path.iterdir()) == []
