"""A run folder holds one run: a new run or sweep into a used folder is refused (or moves the old one aside, never
deletes it); no setting turns a refusal into a warning; ``resume=`` continues only a run of the same model and data,
and ``resume=auto`` only the newest run of this model. Through the real ``train.py`` where a user meets it, and
through Hydra's own callback wrapper (in-process, the same code path) for the whole space of folder contents.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import warnings
from pathlib import Path

import pytest
from cli_checks import EPOCH, TINY, copy_of, finished_run, snapshot
from helpers import compose_train, run_cli
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from attnlab.runs import resume, folder as run_folder
from attnlab.checkpoints.read import read_trusted
from attnlab.data.corpus import pydoc_text
from attnlab.core.paths import CONF_DIR



@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir) -> Path:
    return finished_run(tmp_path_factory, cache_dir)


def refusal(output: str, text: str, full_error: bool) -> str:
    """The one line containing ``text`` (a traceback may come with it under HYDRA_FULL_ERROR=1, never without)."""
    lines = [line for line in output.splitlines()  # (not the traceback's source lines and exception line)
             if text in line and not line.startswith((" ", "attnlab."))]
    assert len(lines) == 1, (text, output[-3000:])
    assert ("Traceback" in output) == full_error, output[-3000:]
    return lines[0]



# ----------------------------------------------------------------------------------------------------------------
# every kind of content a used folder holds x single run / sweep, through Hydra's callback wrapper
# ----------------------------------------------------------------------------------------------------------------
def _kinds() -> list[str]:
    """What a run or a sweep leaves in its folder: each entry of a real run (checkpoints, metrics, logs, configs),
    W&B's folder, a sweep's files and job folders, a lone file."""
    return ["checkpoints/last.ckpt", "checkpoints/epoch_000.ckpt", "metrics.json", "job_status.json",
            ".hydra/config.yaml", "csv/version_0/metrics.csv", "train.log", "config_tree.log",
            "wandb/offline-run-20260101_000000-abc123/run-abc123.wandb", "multirun.yaml", "sweep_summary.md",
            "0/.hydra/config.yaml", "notes.txt"]


def _fill(folder: Path, kind: str, finished: Path) -> None:
    """``folder`` holding only ``kind``: the real run's file where it has one, else a file of that name."""
    target = folder / kind
    target.parent.mkdir(parents=True, exist_ok=True)
    source = finished / kind
    if kind.startswith("0/"):
        source = finished / kind[2:]
    if source.is_file():
        shutil.copy2(source, target)
    else:
        target.write_text(f"{kind} of an earlier run\n")


def _hydra_config(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


@pytest.fixture(scope="module")
def composed():
    """train.yaml composed with the run and sweep folders as placeholders (set per test)."""
    return _hydra_config([*TINY, "hydra.run.dir=RUN", "hydra.sweep.dir=SWEEP"])


def _start(cfg, folder: Path, mode: str, **keys) -> None:
    """Hydra's callbacks (conf/train.yaml's and conf/hydra's) started as `python train.py` / `-m` starts them."""
    cfg = cfg.copy()
    OmegaConf.update(cfg, "hydra.run.dir" if mode == "run" else "hydra.sweep.dir", str(folder))
    for k, v in keys.items():
        OmegaConf.update(cfg, k, v, force_add=True)
    callbacks = Callbacks(cfg)
    try:
        if mode == "run":
            callbacks.on_run_start(config=cfg, config_name="train")
        else:
            callbacks.on_multirun_start(config=cfg, config_name="train")
    finally:
        run_folder._release_all()


@pytest.mark.parametrize("mode", ["run", "sweep"])
@pytest.mark.parametrize("kind", _kinds())
def test_a_used_folder_is_refused_whatever_it_holds(kind, mode, composed, finished, tmp_path, caplog):
    folder = tmp_path / "used"
    _fill(folder, kind, finished)
    before = snapshot(folder)
    with pytest.raises(SystemExit) as stop:  # through Hydra's wrapper, which turns exceptions into warnings
        _start(composed, folder, mode)
    assert stop.value.code == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    top = kind.split("/")[0]
    assert line.startswith(f"{mode} folder {folder} already holds ") and top in line, line
    assert f"existing_run=move_aside to move it to {folder}.old-<time>" in line
    if mode == "run" and kind == "checkpoints/last.ckpt":
        assert f"continue it with resume={folder}" in line
    assert snapshot(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["used"]


@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_move_aside_renames_the_old_run_and_deletes_nothing(mode, composed, finished, tmp_path, caplog):
    folder = copy_of(finished, tmp_path / "used")
    before = snapshot(folder)
    _start(composed, folder, mode, existing_run="move_aside")
    (aside,) = tmp_path.glob("used.old-*")
    assert snapshot(aside) == before and not list(folder.iterdir())  # moved as it was; a new, empty folder
    assert any(f"moved what {folder} held (checkpoints/" in r.getMessage() and str(aside) in r.getMessage()
               for r in caplog.records)
    with pytest.raises(SystemExit):  # anything else is refused in one line
        _start(composed, folder, mode, existing_run="delete")
    assert "existing_run=delete is not one of refuse, move_aside" in caplog.records[-1].getMessage()


def _scenario(guard: str, finished: Path, tmp_path: Path) -> tuple[Path, dict, str]:
    """(run folder, config keys, the refusal's text) for each guard of RunFolderGuard."""
    used = copy_of(finished, tmp_path / "used")
    if guard == "used folder":
        return used, {}, f"run folder {used} already holds a run"
    if guard == "used sweep folder":
        return used, {"mode": "sweep"}, f"sweep folder {used} already holds a sweep"
    if guard == "uncreatable folder":
        (tmp_path / "file").write_text("not a folder")
        return tmp_path / "file" / "run", {}, "cannot create or write the run folder"
    if guard == "resume of another model":
        return used, {"resume": str(used), "model.net.d_model": 64}, "is a run of another model"
    if guard == "resume with other data":
        return used, {"resume": str(used), "data.val_fraction": 0.2}, "was trained on other data"
    if guard == "resume of a damaged checkpoint":
        last = used / resume.LAST
        last.write_bytes(last.read_bytes()[:1000])
        return used, {"resume": str(used)}, f"checkpoint {last} is damaged"
    if guard == "resume=auto, newest run without a checkpoint":
        shutil.rmtree(used / "checkpoints")
        return used, {"resume": "auto"}, "has no checkpoints/last.ckpt (stopped before its first checkpoint)"
    if guard == "resume=auto, no run":
        return tmp_path / "runs" / "new", {"resume": "auto"}, "resume=auto: no run with checkpoints/last.ckpt"
    if guard == "unknown existing_run":
        return used, {"existing_run": "delete"}, "existing_run=delete is not one of refuse, move_aside"
    raise AssertionError(guard)


GUARDS = ["used folder", "used sweep folder", "uncreatable folder", "resume of another model", "resume with other data",
          "resume of a damaged checkpoint", "resume=auto, newest run without a checkpoint", "resume=auto, no run",
          "unknown existing_run"]


@pytest.mark.parametrize("full_error", ["", "1"])
@pytest.mark.parametrize("guard", GUARDS)
def test_no_setting_turns_a_refusal_into_a_warning(guard, full_error, composed, finished, tmp_path, caplog,
                                                   monkeypatch):
    """Every refusal of RunFolderGuard exits through Hydra's callback wrapper (which turns exceptions into
    warnings): status 2, its one line, nothing written, with HYDRA_FULL_ERROR unset and 1."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", full_error)
    folder, keys, text = _scenario(guard, finished, tmp_path)
    before = snapshot(tmp_path)
    with _no_warning(), pytest.raises(SystemExit) as stop:
        _start(composed, folder, keys.pop("mode", "run"), **keys)
    assert stop.value.code == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert text in line, line
    assert snapshot(tmp_path) == before  # (the blocker file included)


@pytest.mark.parametrize("full_error", ["", "1"])
def test_a_live_run_is_named_as_busy_whatever_the_settings(full_error, composed, finished, tmp_path, caplog,
                                                           monkeypatch):
    """move_aside never moves a folder a live run writes into; the lock here is held by this test process."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", full_error)
    folder = copy_of(finished, tmp_path / "live")
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        before = snapshot(folder)
        for keys in ({}, {"existing_run": "move_aside"}, {"resume": str(folder)}):
            with _no_warning(), pytest.raises(SystemExit) as stop:
                _start(composed, folder, "run", **keys)
            assert stop.value.code == 2
            assert f"is in use by another run (pid {os.getpid()}" in caplog.records[-1].getMessage()
        assert snapshot(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["live"]
    finally:
        os.close(fd)


@contextlib.contextmanager
def _no_warning():
    """Hydra's wrapper reports a callback's exception as a UserWarning "Callback ... raised": none may appear."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert not [w for w in caught if "Callback" in str(w.message)], [str(w.message) for w in caught]


# ----------------------------------------------------------------------------------------------------------------
# the same through train.py: one line, the first run byte-identical, with and without HYDRA_FULL_ERROR=1
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "full_error"), [("run", "1"), ("sweep", "")])
def test_train_py_refuses_a_used_folder(mode, full_error, finished, cache_dir, tmp_path):
    folder = copy_of(finished, tmp_path / "used")
    before = snapshot(folder)
    where = [f"hydra.run.dir={folder}", "seed=2"] if mode == "run" else [f"hydra.sweep.dir={folder}", "seed=1,2"]
    out = run_cli([*(["-m"] if mode == "sweep" else []), *TINY, *where], cache_dir, timeout=120,
                  env={"HYDRA_FULL_ERROR": full_error})
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "already holds", full_error == "1")
    assert f"{mode} folder {folder} already holds" in line and "checkpoints/ (epoch_000.ckpt, last.ckpt)" in line
    assert snapshot(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["used"]


@pytest.mark.parametrize("full_error", ["", "1"])
def test_resume_of_another_models_run_writes_nothing_into_it(full_error, finished, cache_dir, tmp_path):
    """The default model (transformer_mt) resuming a causal_lm run: refused before Hydra writes its config,
    overrides and log there."""
    run = copy_of(finished, tmp_path / "lm")
    before = snapshot(run)
    out = run_cli(["debug=fast", f"resume={run}"], cache_dir, timeout=120, env={"HYDRA_FULL_ERROR": full_error})
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "is a run of another model", full_error == "1")
    assert "model=causal_lm there, model=transformer_mt here" in line
    assert snapshot(run) == before


# ----------------------------------------------------------------------------------------------------------------
# resume= and the data: every data key of every data option, changed, is named (the loading-only ones pass)
# ----------------------------------------------------------------------------------------------------------------
def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, value[-1] if value else 1]
    if value is None:
        return 1
    return f"{value}x"


def _data_keys(option: str) -> list[str]:
    """Every key the data option's YAML sets to a value (interpolated ones follow the key they name)."""
    flat = resume._flatten(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / f"{option}.yaml")), "data")
    return [k for k, v in flat.items() if k != "data._target_" and "${" not in str(v)]


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml")))
def test_resume_names_every_data_key_that_changed(option, finished):
    """For each data option, each of its keys changed alone is a difference named by that key (a key the model is
    sized from also changes the model, which is refused first), except the keys of how data are loaded
    (resume.LOADING_ONLY). check_resume refuses exactly when data_differences is not empty (the test below and
    test_train_py_resume_with_other_data...). The same for ``ckpt_path=``, whose side of the comparison is the data
    module's arguments saved in the checkpoint (test_train_py_ckpt_path_with_other_data_is_refused)."""
    root = OmegaConf.load(finished / resume.SAVED_CONFIG)
    root.data = OmegaConf.load(CONF_DIR / "data" / f"{option}.yaml")
    saved_args = {k: v for k, v in OmegaConf.to_container(root.data, resolve=True).items() if k != "_target_"}
    keys, wrong = _data_keys(option), []
    for key in keys:
        current = root.copy()
        OmegaConf.update(current, key, _changed(OmegaConf.select(root, key)), merge=False)
        expected = [] if key.split(".")[1] in resume.LOADING_ONLY else [key]
        for found in (resume.data_differences(root.data, current.data),
                      resume.checkpoint_data_differences(saved_args, current.data)):
            if [d.split("=")[0] for d in found] != expected:
                wrong.append((key, found))
    assert keys and not wrong, wrong


def test_resume_refuses_other_data_and_lets_loading_keys_change(finished, tmp_path):
    run = copy_of(finished, tmp_path / "run")
    saved = OmegaConf.load(run / resume.SAVED_CONFIG)
    OmegaConf.update(saved, "resume", str(run))
    for key, value, refused in (("data.num_workers", 2, False), ("data.tokenizer_sample_mb", 1, True),
                                ("data.vocab_size", 300, True)):
        current = saved.copy()
        OmegaConf.update(current, key, value)
        if not refused:
            run_folder.check_resume(current, run.absolute())
            continue
        with pytest.raises(resume.ResumeError, match=rf"\.{key.split('.')[-1]}=\S+ there, {value} here") as e:
            run_folder.check_resume(current, run.absolute())
        # the model, sized from the data, is compared first; data keys the model does not read are data's
        assert ("is a run of another model" in str(e.value)) == (key == "data.vocab_size")


@pytest.mark.parametrize("full_error", [""])  # "1": test_no_setting_turns_a_refusal_into_a_warning
def test_train_py_resume_with_other_data_is_refused_before_anything_is_written(full_error, finished, cache_dir,
                                                                               tmp_path):
    run = copy_of(finished, tmp_path / "lm")
    before = snapshot(run)
    out = run_cli([*EPOCH, f"resume={run}", "data.val_fraction=0.2"], cache_dir, timeout=120,
                  env={"HYDRA_FULL_ERROR": full_error})
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "was trained on other data", full_error == "1")
    assert "(data.val_fraction=0.05 there, 0.2 here)" in line
    assert snapshot(run) == before


def test_train_py_ckpt_path_with_other_data_is_refused(finished, cache_dir, tmp_path):
    """A new run from a checkpoint's training state (ckpt_path=) is compared with the checkpoint's data as resume=
    is: one line naming the key, before Lightning is imported; no run folder left, the checkpoint's run untouched."""
    run = copy_of(finished, tmp_path / "lm")
    before = snapshot(run)
    new = tmp_path / "new"
    out = run_cli([*EPOCH, f"ckpt_path={run / resume.LAST}", "data.val_fraction=0.2", f"hydra.run.dir={new}"],
                  cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "was trained on other data", False)
    assert f"ckpt_path={run / resume.LAST}" in line and "(data.val_fraction=0.05 there, 0.2 here)" in line, line
    assert snapshot(run) == before and not new.exists()


def test_ckpt_path_compares_the_tokenizer_itself_with_the_checkpoints(finished, cache_dir, edited_book, tmp_path):
    """The same data settings can give another tokenizer (a text file edited since): train.py's run compares the
    data's tokenizer with the checkpoint's before any logger or trainer exists, for ckpt_path= as for resume=."""
    from attnlab.cli.train import run

    cfg = compose_train([*EPOCH, f"ckpt_path={finished / resume.LAST}", "data.source=text_file",
                         f"data.path={edited_book}"], tmp_path / "new", cache_dir)
    with pytest.raises(resume.ResumeError, match=r"^ckpt_path: the tokenizer these data give is not the one saved"):
        run(cfg)
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------------------------------------------
# resume=auto: the newest run of this model or a refusal saying which and why
# ----------------------------------------------------------------------------------------------------------------
def test_resume_auto_never_falls_back_to_an_older_run(finished, cache_dir, tmp_path):
    """The newest run of this model was killed before its first checkpoint (its config and log, no checkpoint):
    resume=auto names it and the older finished run, and touches neither."""
    runs = tmp_path / "debug" / "runs"
    older = copy_of(finished, runs / "2026-01-01_00-00-00-000000")
    killed = runs / "2026-01-02_00-00-00-000000"
    (killed / ".hydra").mkdir(parents=True)
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "train.log"):
        shutil.copy(finished / name, killed / name)
    for name in (resume.LAST, resume.SAVED_CONFIG):
        os.utime(older / name, (1e9, 1e9))
    before = snapshot(runs)
    out = run_cli([*EPOCH, f"paths.log_dir={tmp_path}", "resume=auto"], cache_dir, timeout=120,
                  env={"HYDRA_FULL_ERROR": "1"})
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "resume=auto: the newest run of model=causal_lm", True)
    assert f"{killed}, has no checkpoints/last.ckpt (stopped before its first checkpoint)" in line
    assert f"to continue the older run {older}, give resume={older}" in line
    assert snapshot(runs) == before and sorted(runs.iterdir()) == [older, killed]


@pytest.fixture(scope="module")
def edited_book(tmp_path_factory) -> Path:
    """A text file of other text than the finished run's corpus (its tokenizer is trained once, then cached)."""
    edited = tmp_path_factory.mktemp("edited") / "book.txt"
    edited.write_text(pydoc_text()[:30_000], encoding="utf-8")
    return edited


def test_resume_compares_the_tokenizer_itself_with_the_checkpoints(finished, cache_dir, edited_book):
    """The same data config can give another tokenizer (a text file edited between the parts): train.py compares
    the data's tokenizer with the one the checkpoint holds before training (real datamodules, real checkpoint)."""
    import hydra

    saved = OmegaConf.load(finished / resume.SAVED_CONFIG)
    OmegaConf.update(saved, "data.cache_dir", cache_dir)
    same = hydra.utils.instantiate(saved.data)
    same.setup("fit")
    resume.check_tokenizer(read_trusted(finished / resume.LAST), same)  # the first part's data: its tokenizer

    other = hydra.utils.instantiate(saved.data, source="text_file", path=str(edited_book))
    other.setup("fit")
    with pytest.raises(resume.ResumeError, match="the tokenizer these data give is not the one saved in"):
        resume.check_tokenizer(read_trusted(finished / resume.LAST), other)


@pytest.mark.parametrize("full_error", ["1"])  # unset: test_train_py_resume_with_other_data_is_refused...
def test_the_default_translation_job_resumed_with_other_numbers_is_refused(full_error, finished, cache_dir,
                                                                          tmp_path):
    """The issue's case: the default job resumed with data.max_digits / data.target_lang changed trained on a new
    tokenizer's ids (German: an IndexError) and overwrote the run's config. The run here is the default job's saved
    config beside an intact checkpoint: the refusal comes before either is read further."""
    run = tmp_path / "mt"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(finished / resume.LAST, run / resume.LAST)
    (run / ".hydra").mkdir()
    OmegaConf.save(compose_train(["debug=fast"], run), run / resume.SAVED_CONFIG)
    before = snapshot(run)
    out = run_cli(["debug=fast", f"resume={run}", "data.max_digits=3", "data.target_lang=de"], cache_dir,
                  timeout=120, env={"HYDRA_FULL_ERROR": full_error})
    assert out.returncode == 2, out.stdout[-3000:]
    line = refusal(out.stdout, "was trained on other data", full_error == "1")
    assert "(data.max_digits=7 there, 3 here; data.target_lang=fr there, de here)" in line
    assert snapshot(run) == before
