"""Read checkpoints written by train.py without ever running code from them, and load a task from one, refusing a
file of another model family with one line.

A ``.ckpt`` is a pickle: read with ``weights_only=False``, a file whose unpickling calls ``os.system`` runs its
command the moment it is loaded, before any check of what it holds. Every path that reads a checkpoint (the
``generate``/``translate``/``synthesize`` entry points, ``train.py`` test/``ckpt_path``/``resume``, the claims, the
notebooks) therefore goes through :func:`read_checkpoint` or :func:`checked_contents` here, which load with
``weights_only=True``: PyTorch's restricted unpickler accepts tensors and plain containers only and refuses any
other global *before* calling it. Each reads the file once: an entry point's :func:`load_task` builds the task
from the dict it read; train.py's checks of ``ckpt_path=`` / ``resume=`` share one read (:func:`checked_contents`).

What train.py writes is plain already: the task's hyper-parameters are plain dicts (``train.build_model`` converts
the config), the tokenizer is a JSON string, the random state is tensors and tuples, callback and data-module states
are dicts of numbers. :data:`SAFE_GLOBALS` is the one place to allow-list a type should a checkpoint ever need one
(``tests/test_safe_checkpoints.py`` loads every family's checkpoint through here, so such a need shows up there).

Every checkpoint carries ``task_class`` (the LightningModule's import path, see ``Task.on_save_checkpoint``) and
its hyper-parameters, so the entry points need nothing but the file. Both are import paths that would be imported
and called (``_target_``), so an unpickled file is still not data until they are checked: :func:`load_task` refuses
a ``task_class`` or a ``_target_`` outside :mod:`attnlab.allowed_targets` before anything is imported or built, then
builds the task from the dict it checked (:func:`build_task`; Lightning's ``load_from_checkpoint`` would read the
file a second time, and what was checked need not be what is built). A file that loads but does not fit (other
sizes, no tokenizer, no hyper-parameters) is one line naming it and what is wrong (:func:`check_fits`).

Weights stay in the ``.ckpt`` (no safetensors file beside it): what ran code was the config, not the tensors, and
``weights_only=True`` already reads tensors and plain containers only; a second file would be one more thing to keep
in step with the first (atomic writes, ``resume=``) and Lightning's ``trainer.fit(ckpt_path=...)`` reads the
``.ckpt`` anyway. The parts are stored as their ``_target_`` import paths, as Hydra composed them, not as group
option names: the allow-list is computed from the same conf/ tables an option name would be looked up in, so the
two are equally restricted, and every checkpoint ever written keeps loading without a second format.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import torch

from .allowed_targets import check_targets, check_task_class
from .errors import CheckpointError, UnsafeCheckpointError, UserError
from .state_fit import check_fits

# Types the safe unpickler may build beyond tensors and plain containers. Empty: attnlab's checkpoints need none.
# Add a class here (never a function: a callable global is how a pickle runs code) only if train.py starts saving it.
SAFE_GLOBALS: list[type] = []
# Registered for the whole process, so Lightning's own loads (trainer.fit/test(ckpt_path=..., weights_only=True) in
# train.py, which imports this module) accept the same types as read_checkpoint.
torch.serialization.add_safe_globals(SAFE_GLOBALS)

# Lightning's own names for a checkpoint (trainer.fit/test(ckpt_path="last"|"best"|...)): not files to check here
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc")


def _load(path: Path, map_location: Any) -> Any:
    return torch.load(path, map_location=map_location, weights_only=True)


def _refusal(path: Path, error: Exception) -> CheckpointError:
    """The one-line CheckpointError for a file torch.load(weights_only=True) could not read."""
    text = str(error)
    # torch names the refused global as "Unsupported global: GLOBAL builtins.getattr" or, for a blocked module,
    # "unsupported GLOBAL posix.system whose module posix is blocked"
    refused = re.search(r"unsupported (?:global: )?GLOBAL (\S+)", text, flags=re.IGNORECASE)
    if refused:
        return UnsafeCheckpointError(
            f"{path} is not a safe attnlab checkpoint: loading it with weights_only=True refused "
            f"{refused.group(1)} (its unpickling would call code); nothing from it was run")
    if isinstance(error, pickle.UnpicklingError) or "WeightsUnpickler" in text:
        return CheckpointError(f"cannot read checkpoint {path}: not a PyTorch checkpoint file")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return CheckpointError(f"cannot read checkpoint {path} (truncated, or not a PyTorch checkpoint): "
                           f"{type(error).__name__}: {first}")


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict:
    """The checkpoint's contents, loaded with ``weights_only=True`` (never runs code from the file); a missing,
    unreadable or unsafe file is a one-line :class:`CheckpointError`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    try:
        ckpt = _load(path, map_location)
    except Exception as e:  # refused global, truncated file, not a torch file
        raise _refusal(path, e) from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by attnlab's train.py (it holds a "
                              f"{type(ckpt).__name__}, not a dict)")
    return ckpt


# train.py's checks of the checkpoint it continues from (its archive, its family, its sizes, its tokenizer) run in
# the run-folder callback, the job and the run: they share one read of the file, kept while the file is unchanged
# (same inode, size and mtime) until :func:`release` (before training starts). Lightning's restore reads it again.
_last_read: tuple[tuple, tuple[str | None, Any]] | None = None


def _archive_damage(f) -> str | None:
    """Why the zip archive of a torch checkpoint is damaged (its directory, every member's CRC), or None."""
    try:
        with zipfile.ZipFile(f) as archive:
            bad = archive.testzip()
        return None if bad is None else f"member {bad} fails its CRC check"
    except zipfile.BadZipFile as e:
        return f"not a complete checkpoint archive: {e}; truncated?"
    except (OSError, EOFError) as e:
        return str(e)


def _read_once(path: Path) -> tuple[str | None, Any]:
    """(archive damage or None, the contents or the exception loading them raised): one open of the file, the
    integrity check and ``torch.load(weights_only=True)`` on the same handle; again only if the file changed."""
    global _last_read
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if _last_read is not None and _last_read[0] == key:
        return _last_read[1]
    with open(path, "rb") as f:
        damage = _archive_damage(f)
        f.seek(0)
        try:
            contents: Any = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - named by _refusal where the contents are needed
            contents = e
    _last_read = (key, (damage, contents))
    return _last_read[1]


def release() -> None:
    """Drop the shared read (train.py: before training, so its tensors do not stay in memory)."""
    global _last_read
    _last_read = None


def archive_damage(path: str | Path) -> str | None:
    """Why a checkpoint file is damaged (truncated, a member failing its CRC), or None: from the shared read."""
    try:
        return _read_once(Path(path))[0]
    except OSError as e:
        return str(e)


def checked_contents(path: str | Path) -> dict:
    """What ``train.py ckpt_path=`` / ``resume=`` checks: the file's contents from the shared read
    (``weights_only=True``), a dict, or a one-line :class:`CheckpointError`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    contents = _read_once(path)[1]
    if isinstance(contents, Exception):
        raise _refusal(path, contents)
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by attnlab's train.py")
    return contents


def verified(ckpt_path: str | Path | None) -> str | Path | None:
    """``ckpt_path`` unchanged once it is known to load with ``weights_only=True``; for ``trainer.fit/test(
    ckpt_path=verified(...), weights_only=True)``, so that an unsafe or broken file is one line, not Lightning's
    traceback."""
    if ckpt_path is None or str(ckpt_path) in LIGHTNING_CKPT_NAMES or "://" in str(ckpt_path):
        return ckpt_path
    checked_contents(ckpt_path)
    return ckpt_path


def _family(task_class: str, default_entry: str = "") -> tuple[str, str]:
    """(what the user calls the family of ``task_class``, the entry point that serves it), from the registry."""
    from .families import for_task

    family = for_task(task_class)
    return (family.what, family.serves) if family else (task_class.rsplit(".", 1)[-1], default_entry)


def _task_class(ckpt: dict, path: Path, expected: type | str, what: str) -> type:
    """The checkpoint's task class: one of the project's own (checked before it is imported), of the family this
    entry point serves."""
    name = ckpt.get("task_class")
    if not name or not isinstance(name, str):
        raise CheckpointError(f"{path} is not a {what} checkpoint written by attnlab's train.py")
    check_task_class(name, str(path))
    task_cls = hydra.utils.get_class(name)
    if isinstance(expected, str):
        expected = hydra.utils.get_class(expected)
    if not issubclass(task_cls, expected):
        family, entry = _family(name, "its own entry point")
        raise CheckpointError(f"{path} is {family} checkpoint, not a {what} checkpoint; use {entry}")
    return task_cls


def hyper_parameters(ckpt: dict, path: str | Path) -> dict:
    """The checkpoint's model config, checked: every ``_target_`` in it is one of the project's own
    (:mod:`attnlab.allowed_targets`); a missing or hostile one is one line naming the file."""
    hparams = ckpt.get("hyper_parameters")
    if isinstance(hparams, dict):
        check_targets(hparams, f"{path}: hyper_parameters")
    if not isinstance(hparams, dict) or not isinstance(hparams.get("net"), dict):
        raise CheckpointError(f"{path} has no hyper_parameters with the model's net config (damaged, or not written "
                              f"by attnlab's train.py): the model cannot be rebuilt from it")
    return hparams


def build_task(task_cls: type, ckpt: dict, path: str | Path, device: str = "cpu"):
    """The task rebuilt from the checkpoint already read (never from the file again: what was checked is what is
    built), its weights loaded strictly.

    What ``LightningModule.load_from_checkpoint`` does, minus reading the file a second time and minus Lightning's
    older hyper-parameter keys: the task is built from the checked ``hyper_parameters`` (arguments the task no
    longer takes are dropped, as Lightning does), ``on_load_checkpoint`` renames an earlier layout's keys and
    reads the tokenizer, and the state dict must fit (:func:`check_fits`) before it is loaded."""
    import inspect

    from .utils.model_memory import net_memory_problem
    from .utils.validate import model_value_problems

    hparams = hyper_parameters(ckpt, path)
    # the sizes are the file's: a model too big for this machine is one line, not an allocation failure
    too_big = net_memory_problem(hparams["net"], "gpu" if str(device).startswith("cuda") else "cpu",
                                 bytes_per_parameter=4, what="its float32 weights need",
                                 to_fix="a damaged checkpoint, or one for a bigger machine")
    if too_big:
        raise CheckpointError(f"{path}: {too_big}")
    params = inspect.signature(task_cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        hparams = {k: v for k, v in hparams.items() if k in params}
    # what a damaged file can get wrong is checked before the build, which then has nothing to guard: an error
    # from inside it is a bug (it keeps its traceback), or a part's own one-line refusal of its value
    problems = model_value_problems(hparams)
    try:
        inspect.signature(task_cls).bind(**hparams)
    except TypeError as e:  # a required argument missing
        problems.append(str(e))
    if problems:
        raise CheckpointError(f"{path}: cannot build {task_cls.__name__} from its hyper_parameters (damaged?): "
                              f"{problems[0]}")
    task = task_cls(**hparams)
    task._checkpoint_path = path  # named by on_load_checkpoint's refusals
    task.on_load_checkpoint(ckpt)  # renames an earlier layout's keys, checks the weights fit, restores the tokenizer
    task.load_state_dict(ckpt["state_dict"], strict=True)
    return task.to(device)


def load_task(path: str | Path, expected: type | str, what: str, device: str = "cpu") -> tuple[object, dict]:
    """``(task in eval mode, raw checkpoint dict)``; ``expected`` is the task base class this entry point serves
    (or its import path: imported only once the file has been read, so a bad file is refused before Lightning is
    imported, seconds sooner), ``what`` names it in errors ("language-model", "translation").

    Nothing named in the file is imported before it is checked: ``task_class`` must be one of the project's tasks,
    every ``_target_`` of its hyper-parameters in :mod:`attnlab.allowed_targets`; a tokenizer the task needs must
    be there and readable; the weights must fit the model. Each refusal is one line naming the file."""
    path = Path(path).expanduser()
    ckpt = read_checkpoint(path, device)
    if isinstance(ckpt.get("task_class"), str):
        check_task_class(ckpt["task_class"], str(path))
    if isinstance(ckpt.get("hyper_parameters"), dict):  # before any task class is imported (seconds of Lightning)
        check_targets(ckpt["hyper_parameters"], f"{path}: hyper_parameters")
    task_cls = _task_class(ckpt, path, expected, what)
    hyper_parameters(ckpt, path)
    for key in getattr(task_cls, "checkpoint_keys", ()):
        check_tokenizer(ckpt.get(key), path, key)
    task = build_task(task_cls, ckpt, path, device)
    return task.eval(), ckpt


def check_tokenizer(text: Any, path: str | Path, key: str = "tokenizer") -> None:
    """A checkpoint's tokenizer (the JSON text train.py stores) must be there; one line otherwise. It is read back
    once, by the task (:func:`attnlab.tasks.base.saved_tokenizer`)."""
    if not isinstance(text, str) or not text:
        raise CheckpointError(f"{path} has no {key} (the model's vocabulary; damaged, or saved without its data "
                              f"module): its output could not be decoded")


def check_for_model(path: str | Path, model_cfg: Any) -> dict | None:
    """``train.py ckpt_path=`` / ``resume=``: the checkpoint Lightning will restore is data (every ``_target_`` and
    its ``task_class`` allowed) and of the family ``model_cfg`` builds; one line otherwise. Needs no model, so it
    runs before Lightning is imported; whether the weights fit is checked once the model is built
    (:func:`check_fits`, from ``Task.on_load_checkpoint``). Returns the checkpoint read (memory-mapped), None for
    a name Lightning resolves itself (``last``, a URL)."""
    if path is None or str(path) in LIGHTNING_CKPT_NAMES or "://" in str(path):
        return None
    path = Path(str(path)).expanduser()
    ckpt = checked_contents(path)
    name = ckpt.get("task_class")
    if not isinstance(name, str):
        raise CheckpointError(f"{path} names no task_class: not a checkpoint written by attnlab's train.py")
    check_task_class(name, str(path))
    hyper_parameters(ckpt, path)
    check_callback_paths(ckpt, path)
    want = model_cfg.get("_target_") if isinstance(model_cfg, Mapping) else None
    if want and name != want:
        family, mine = _family(name)[0], _family(str(want))[0]
        raise CheckpointError(f"{path} is {family} checkpoint ({name.rsplit('.', 1)[-1]}), but this run builds "
                              f"{mine} ({str(want).rsplit('.', 1)[-1]}): choose its model= (see its run's "
                              f".hydra/overrides.yaml)")
    return ckpt


def _callback_paths(state: dict) -> list[tuple[str, Any]]:
    """(field, value) for every file path a ``ModelCheckpoint`` state names."""
    from .folder_paths import CHECKPOINT_PATH_FIELDS

    out = [(k, state[k]) for k in CHECKPOINT_PATH_FIELDS if state.get(k)]
    if isinstance(state.get("best_k_models"), dict):
        out += [("best_k_models", k) for k in state["best_k_models"]]
    pending = state.get("pending")
    if isinstance(pending, dict):
        out += [(f"pending.{k}", v) for k in ("copies", "delete") for v in (pending.get(k) or [])]
    return out


def check_callback_paths(ckpt: dict, path: str | Path) -> None:
    """Every file a checkpoint's callback state names (its best and top-k files, the journal of copies to make and
    files to remove) is a ``.ckpt`` name inside the folder that state was saved in; an absolute path elsewhere, a
    ``..`` or a URL is refused in one line before anything acts on it (the run's checkpoint callback would copy to
    it, remove it or test it)."""
    from .folder_paths import name_in

    for key, state in (ckpt.get("callbacks") or {}).items():
        if not isinstance(state, dict) or "dirpath" not in state:
            continue
        folder = state["dirpath"]
        for field, value in _callback_paths(state):
            name = name_in(folder, value) if isinstance(folder, str) and ".." not in Path(folder).parts else None
            if name is None or not name.endswith(".ckpt"):
                shown = repr(value) if not isinstance(value, str) else value
                raise CheckpointError(f"{path}: its checkpoint callback state names {field}={shown[:200]}, not a "
                                      f".ckpt file of its own folder {folder!s:.200}: damaged or hand-made; nothing "
                                      f"was read from that path")


def check_file_fits(model: torch.nn.Module, path: str | Path | None) -> None:
    """:func:`check_fits` for the checkpoint ``train.py ckpt_path=`` restores, right after the model is built and
    before any logger or trainer exists (Lightning itself would find out only once it restores the file)."""
    if path is None or str(path) in LIGHTNING_CKPT_NAMES or "://" in str(path) or not Path(str(path)).is_file():
        return
    from .checkpoint_upgrade import upgrade_state_dict

    ckpt = checked_contents(path)
    state = ckpt.get("state_dict")
    if isinstance(state, dict):  # renamed in a copy: the shared read stays as the file holds it
        net = (ckpt.get("hyper_parameters") or {}).get("net")
        state = dict(state)
        upgrade_state_dict(state, net.get("_target_") if isinstance(net, dict) else None)
    check_fits(model, state, path)


def check_run_config(saved: Any, where: str | Path) -> None:
    """``resume=<run>``: the run's saved config (read once, by the caller) names no code outside the allow-list;
    checked before Hydra writes anything there. Resume builds nothing from it: it resolves its model and data to
    compare them, so the callbacks and loggers a run added (a user's own ``+callbacks.x._target_=...``) are not
    read, and not refused."""
    from omegaconf import DictConfig, open_dict

    from .allowed_targets import check_targets

    if not isinstance(saved, DictConfig):
        return
    cfg = saved.copy()
    try:
        with open_dict(cfg):
            for group in ("callbacks", "logger"):
                if group in cfg:
                    cfg[group] = {}
        check_targets(cfg, str(where), "run")
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a config that does not resolve: not ours to judge here (resume compares
        pass  # what it can)
