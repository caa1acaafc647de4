"""Files stay in their folder: nothing the project writes, renames or deletes lies outside the folder it belongs to,
is reached through a link placed in that folder, or is named by a path read from a file's content.

The space: every kind of link (to a file, to a folder, dangling) at every entry a resumed run writes, through
Hydra's callback wrapper as ``train.py`` starts it and, one per kind, through ``train.py`` itself; the atomic writer
every output goes through, at the target and at its temporary name; every path-valued field of a checkpoint's
callback state × hostile values (absolute elsewhere, ``..``, URL, relative, not a checkpoint), in-process and
through ``resume=`` / ``ckpt_path=``; a run folder copied elsewhere and resumed; an explorer page's inlined media.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import EPOCH, copy_of, finished_run, one_error_line, snapshot
from helpers import run_cli
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from attnlab.runs import folder as run_folder
from attnlab.files.atomic import temporary_name, write_atomic
from attnlab.callbacks.run_checkpoint import _in_this_folder
from attnlab.checkpoints.read import check_callback_paths
from attnlab.core.errors import CheckpointError, CorpusError
from attnlab.explorer.record import ExplorerRecord
from attnlab.explorer.page import page_html, write_page
from attnlab.core.paths import CONF_DIR



FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir) -> Path:
    return finished_run(tmp_path_factory, cache_dir)



def state_key(ckpt: dict) -> str:
    (key,) = [k for k in ckpt["callbacks"] if k.startswith("ModelCheckpoint")]
    return key


def checkpoint_state(ckpt: dict) -> dict:
    return ckpt["callbacks"][state_key(ckpt)]


# ----------------------------------------------------------------------------------------------------------------
# links in a run folder: refused before anything is written there
# ----------------------------------------------------------------------------------------------------------------
FILES = [".hydra/config.yaml", ".hydra/overrides.yaml", "train.log", "config_tree.log", "metrics.json",
         "checkpoints/last.ckpt", "checkpoints/epoch_000.ckpt", "csv/version_0/metrics.csv"]
FOLDERS = [".hydra", "checkpoints", "csv", "csv/version_0", "wandb"]
CASES = [(f, kind) for f in FILES for kind in ("to a file", "dangling")] + \
        [(f, kind) for f in FOLDERS for kind in ("to a folder", "dangling")]


def plant_link(run: Path, entry: str, kind: str, outside: Path) -> Path:
    """``run/entry`` replaced by a link: to a copy of it outside the run (so everything would still read), or to
    nothing. Returns the link's target."""
    where = run / entry
    target = outside / f"target-{entry.replace('/', '_')}"
    if kind != "dangling" and not where.exists():  # (wandb/: the run logged to CSV only)
        target.mkdir()
    elif kind != "dangling":
        (shutil.copytree if where.is_dir() else shutil.copy2)(where, target)
    shutil.rmtree(where) if where.is_dir() and not where.is_symlink() else where.unlink(missing_ok=True)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(target)
    return target


@pytest.fixture(scope="module")
def composed():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*EPOCH, "hydra.run.dir=RUN"], return_hydra_config=True)


@pytest.mark.parametrize(("entry", "kind"), CASES, ids=[f"{e}-{k}" for e, k in CASES])
def test_resume_of_a_run_folder_holding_a_link_is_refused_before_anything_is_written(entry, kind, composed, finished,
                                                                                       tmp_path, caplog):
    run, outside = copy_of(finished, tmp_path / "run"), tmp_path / "outside"
    outside.mkdir()
    plant_link(run, entry, kind, outside)
    before_run, before_outside = snapshot(run), snapshot(outside)
    cfg = composed.copy()
    OmegaConf.update(cfg, "hydra.run.dir", str(run))
    OmegaConf.update(cfg, "resume", str(run), force_add=True)
    with pytest.raises(SystemExit) as stop:  # through Hydra's wrapper, as train.py starts it
        try:
            Callbacks(cfg).on_run_start(config=cfg, config_name="train")
        finally:
            run_folder._release_all()
    assert stop.value.code == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"{run / entry} is a link" in line, line
    assert snapshot(run) == before_run and snapshot(outside) == before_outside


def test_wandb_keeps_links_of_its_own_inside_its_folder(finished):
    """W&B's own links (latest-run, debug.log, one into its cache) are below wandb/, where the check does not look."""
    from attnlab.files.folder_paths import links_in

    run = finished
    assert list(links_in(run)) == []
    assert [p for p in (run / "wandb").rglob("*") if p.is_symlink()] or not (run / "wandb").exists()


@pytest.mark.parametrize(("entry", "kind"), [("config_tree.log", "to a file"), ("checkpoints", "to a folder"),
                                             ("train.log", "dangling")])
def test_train_py_resume_refuses_a_link_in_one_line(entry, kind, finished, cache_dir, tmp_path):
    run, outside = copy_of(finished, tmp_path / "run"), tmp_path / "outside"
    outside.mkdir()
    target = plant_link(run, entry, kind, outside)
    before = snapshot(outside)
    out = run_cli([*EPOCH, f"resume={run}", "trainer.max_epochs=2"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "is a link")
    assert f"{run / entry} is a link (to {target})" in line
    assert snapshot(outside) == before and not (kind == "dangling" and target.exists())


# ----------------------------------------------------------------------------------------------------------------
# the one writer: never through a link at the target or at its temporary name
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["target", "temporary name"])
@pytest.mark.parametrize("kind", ["to a file", "to a folder", "dangling"])
def test_write_atomic_replaces_a_link_and_never_writes_where_it_points(where, kind, tmp_path):
    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    path = folder / "metrics.json"
    link = path if where == "target" else temporary_name(path)
    target = outside / "victim"
    if kind == "to a file":
        target.write_text("keep\n")
    elif kind == "to a folder":
        target.mkdir()
    link.symlink_to(target)
    before = snapshot(outside)
    write_atomic(path, "{}\n")
    assert path.read_text() == "{}\n" and not path.is_symlink()
    assert not temporary_name(path).exists() and not temporary_name(path).is_symlink()
    assert snapshot(outside) == before and (target.exists() or kind == "dangling") and not (
        kind == "dangling" and target.exists())


# ----------------------------------------------------------------------------------------------------------------
# paths inside a checkpoint: plain names of its own folder, or refused
# ----------------------------------------------------------------------------------------------------------------
FIELDS = ["best_model_path", "last_model_path", "kth_best_model_path", "best_k_models", "pending.copies",
          "pending.delete"]


def hostile_values(folder: str, victim: str) -> dict[str, object]:
    return {"absolute elsewhere": victim, "dot-dot": f"{folder}/../../{Path(victim).name}",
            "url": f"file://{victim}", "relative": "epoch_000.ckpt", "not a checkpoint": f"{folder}/notes.txt",
            "a folder": f"{folder}/", "doubled separator": f"{folder}//epoch_000.ckpt", "not a string": 7}


def with_field(state: dict, field: str, value: object) -> dict:
    state = {**state, "pending": dict(state.get("pending") or {})}
    if field == "best_k_models":
        state["best_k_models"] = {value: torch.tensor(1.0)}
    elif field.startswith("pending."):
        state["pending"][field.split(".")[1]] = [value]
    else:
        state[field] = value
    return state


@pytest.mark.parametrize("field", FIELDS)
def test_every_path_field_of_a_checkpoint_is_a_name_in_its_own_folder(field, finished):
    ckpt = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=True)
    state = checkpoint_state(ckpt)
    folder = state["dirpath"]
    check_callback_paths(ckpt, "last.ckpt")  # as written: accepted
    assert state["best_model_path"] == f"{folder}/epoch_000.ckpt"
    for what, value in hostile_values(folder, "/etc/passwd").items():
        bad = {**ckpt, "callbacks": {state_key(ckpt): with_field(state, field, value)}}
        with pytest.raises(CheckpointError, match=f"names {field.split('.')[0]}"):
            check_callback_paths(bad, "last.ckpt")
        # and the callback itself, had the check been passed by: the value is dropped, never moved or acted on
        kept = _in_this_folder(with_field(state, field, value), folder, "/new/checkpoints")
        named = [kept.get(f) for f in ("best_model_path", "last_model_path", "kth_best_model_path")]
        named += list(kept.get("best_k_models", {})) + kept.get("copies", []) + kept.get("delete", [])
        assert all(not v or (v.startswith("/new/checkpoints/") and v.count("/") == 3) for v in named), (what, kept)


@pytest.mark.parametrize(("field", "option"), [("pending.delete", "resume"), ("pending.copies", "resume"),
                                               ("best_model_path", "ckpt_path"), ("best_k_models", "resume")])
def test_train_py_refuses_a_checkpoint_naming_a_file_elsewhere(field, option, finished, cache_dir, tmp_path):
    run, outside = copy_of(finished, tmp_path / "run"), tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.ckpt"
    victim.write_text("a file of someone else's\n")
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    ckpt["callbacks"][state_key(ckpt)] = with_field(checkpoint_state(ckpt), field, str(victim))
    torch.save(ckpt, last)
    before = snapshot(outside)
    args = [f"resume={run}"] if option == "resume" else [f"ckpt_path={last}", f"hydra.run.dir={tmp_path / 'new'}"]
    out = run_cli([*EPOCH, *args, "trainer.max_epochs=2"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "its checkpoint callback state names")
    assert f"{field}={victim}" in line
    assert snapshot(outside) == before and list(outside.iterdir()) == [victim]
    assert not (tmp_path / "new").exists()


def test_a_copied_run_resumed_keeps_its_checkpoints_in_its_own_folder(finished, cache_dir, tmp_path):
    """The checkpoint names the folder it was written in; resumed from a copy, its top-k files are the copy's and
    the original folder is left byte for byte as it was."""
    before = snapshot(finished)
    run = copy_of(finished, tmp_path / "moved")
    out = run_cli([*EPOCH, f"resume={run}", "trainer.max_epochs=2", "test=true"], cache_dir, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:]
    assert snapshot(finished) == before
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    state = checkpoint_state(ckpt)
    assert state["dirpath"] == str((run / "checkpoints").resolve())
    assert Path(state["best_model_path"]).parent == Path(state["dirpath"]) and Path(state["best_model_path"]).is_file()
    assert str(finished) not in out.stdout  # not tested, copied, removed, nor warned about


def test_ckpt_path_of_another_run_tests_its_own_checkpoint(finished, cache_dir, tmp_path):
    before = snapshot(finished)
    new = tmp_path / "new"
    out = run_cli([*EPOCH, f"ckpt_path={finished / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=2", "test=true",
                   f"hydra.run.dir={new}"], cache_dir, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:]
    assert snapshot(finished) == before
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == ["epoch_001.ckpt", "last.ckpt"]
    tested = [line for line in out.stdout.splitlines() if "Restoring states from the checkpoint path at" in line]
    assert tested and str(new / "checkpoints" / "epoch_001.ckpt") in tested[-1], tested


def test_ckpt_path_of_a_finished_run_with_nothing_left_to_train_is_one_line(finished, cache_dir, tmp_path):
    new = tmp_path / "new"
    out = run_cli([*EPOCH, f"ckpt_path={finished / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={new}"], cache_dir,
                  timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "this run would train no step")
    assert "trained 1 epoch(s), trainer.max_epochs=1" in line and "train=false" in line
    assert not new.exists()


# ----------------------------------------------------------------------------------------------------------------
# the epoch checkpoint is a copy of last.ckpt, not a second name of the same bytes
# ----------------------------------------------------------------------------------------------------------------
def test_damage_to_last_ckpt_in_place_leaves_the_epoch_checkpoint_intact(finished, cache_dir, tmp_path):
    run = copy_of(finished, tmp_path / "run")
    f = os.stat(finished / "checkpoints" / "last.ckpt"), os.stat(finished / "checkpoints" / "epoch_000.ckpt")
    assert f[0].st_ino != f[1].st_ino and f[0].st_nlink == f[1].st_nlink == 1
    with open(run / "checkpoints" / "last.ckpt", "r+b") as fh:  # in place, as a bad disk or a tool would
        fh.seek(f[0].st_size // 2)
        fh.write(b"\0" * 64)
    out = run_cli([*EPOCH, f"resume={run}"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "is damaged")
    assert f"continue from the intact epoch_000.ckpt with resume={run / 'checkpoints' / 'epoch_000.ckpt'}" in line


# ----------------------------------------------------------------------------------------------------------------
# an explorer page hands on only inlined media
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["https://example.com/track.png", "file:///etc/passwd", "/etc/passwd",
                                   "javascript:alert(1)", "data:text/html,<script>1</script>", 7])
def test_a_page_read_back_keeps_no_url(value, tmp_path):
    page = tmp_path / "explorer.html"
    good_image, good_audio = "data:image/png;base64,AAAA", "data:audio/wav;base64,AAAA"
    payload = {"title": "t", "view": {"family": "image", "image": value, "grid": 2},
               "modules": [{"name": "m"}],
               "epochs": [{"epoch": 0, "audio": value}, {"epoch": 1, "audio": good_audio}]}
    write_page(payload, page)
    record = ExplorerRecord.from_page(page, before_epoch=5)
    assert "image" not in record.view and record.view["grid"] == 2
    assert "audio" not in record.epochs[0] and record.epochs[1]["audio"] == good_audio
    payload["view"]["image"] = good_image
    write_page(payload, page)
    assert ExplorerRecord.from_page(page, before_epoch=5).view["image"] == good_image


def test_the_page_refuses_every_request_by_its_policy():
    html = page_html({"title": "t", "view": {}, "modules": [], "epochs": []})
    assert "Content-Security-Policy" in html and "default-src 'none'" in html and "img-src data:" in html


# ----------------------------------------------------------------------------------------------------------------
# a checkpoint's sizes are checked before anything is allocated
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["d_model", "n_layers", "vocab_size"])
def test_a_checkpoint_whose_model_would_not_fit_in_memory_is_one_line(key, finished, cache_dir, tmp_path):
    ckpt = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["net"][key] = {"d_model": 4_000_000, "n_layers": 100_000_000,
                                            "vocab_size": 10_000_000_000}[key]
    path = tmp_path / "huge.ckpt"
    torch.save(ckpt, path)
    out = run_cli([f"ckpt={path}", "prompt=the", "max_new_tokens=2"], cache_dir, timeout=120, script="generate.py")
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "parameters: its float32 weights need")
    assert str(path) in line and "more than the" in line


# ----------------------------------------------------------------------------------------------------------------
# a corpus list names files of its own folder
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("uid", ["../../outside", "/etc/passwd", "sub/u1", "..", "file:///etc/passwd"])
def test_an_ljspeech_id_that_is_a_path_is_one_line(uid, tmp_path):
    from attnlab.data.ljspeech import read_metadata

    (tmp_path / "wavs").mkdir()
    (tmp_path / "metadata.csv").write_text(f"u0|fine|fine\n{uid}|text|text\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"metadata.csv:2: the id .* is not a plain file name"):
        read_metadata(tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# a checkpoint's tokenizer cannot make a text grow without bound
# ----------------------------------------------------------------------------------------------------------------
def _doubling_rules(n: int, kind: str) -> dict:
    pattern = {"String": "a"} if kind == "String" else {"Regex": "a*"}
    return {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": pattern, "content": "aa"}] * n}


@pytest.mark.parametrize("kind", ["String", "Regex"])
def test_a_tokenizer_whose_rules_would_grow_text_without_bound_is_one_line(kind, cache_dir, tmp_path):
    """40 rules "a" -> "aa" make one "a" 2**40 characters: refused before any text is normalized."""
    import json

    ckpt = torch.load(FIXTURES / "legacy_transformer_mt.ckpt", weights_only=True)
    spec = json.loads(ckpt["tokenizer"])
    spec["normalizer"] = _doubling_rules(40, kind)
    ckpt["tokenizer"] = json.dumps(spec)
    path = tmp_path / "hostile.ckpt"
    torch.save(ckpt, path)
    (tmp_path / "in.txt").write_text("a\n")
    out = run_cli([f"ckpt={path}", "beam_size=1", f"input={tmp_path / 'in.txt'}", f"hydra.run.dir={tmp_path / 'run'}"],
                  cache_dir, timeout=120, script="translate.py")
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "its normalizer could make a text up to")
    assert str(path) in line and "times longer" in line


def test_every_committed_tokenizer_and_every_normalize_option_is_within_the_bound():
    import json

    from attnlab.data.normalization import MAX_GROWTH, TextNormalization, growth, normalizer_json

    for f in sorted(FIXTURES.glob("*.ckpt")):
        text = torch.load(f, weights_only=True).get("tokenizer")
        assert text is None or growth(json.loads(text).get("normalizer")) <= MAX_GROWTH, f
    every = TextNormalization.from_config({"unicode": "NFKC", "case": "corpus_words", "whitespace": True,
                                           "remove": ",.;", "replace": {"&": " and ", r"\b\d+\b": "<num>"}})
    spec = json.loads(normalizer_json(every.normalizer(["Hello world and one", "two Three"])))
    assert growth(spec) <= MAX_GROWTH and growth(_doubling_rules(40, "String")) > MAX_GROWTH
