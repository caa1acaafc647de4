"""Read a checkpoint without ever running code from it: the one read (:func:`read_trusted`) every entry point
and train.py's plan use, and the checks of what a file may name.

A ``.ckpt`` is a pickle: read with ``weights_only=False``, a file whose unpickling calls ``os.system`` runs its
command the moment it is loaded, before any check of what it holds. Every path that reads a checkpoint (the
``generate``/``translate``/``synthesize`` entry points, ``train.py`` test/``ckpt_path``/``resume``, the claims, the
notebooks) therefore goes through :func:`read_trusted` (or :func:`read_checkpoint`) here, which load with
``weights_only=True``: PyTorch's restricted unpickler accepts tensors and plain containers only and refuses any
other global *before* calling it. Each reads the file once (:func:`read_trusted`): the :class:`TrustedCheckpoint` it
gives is what every later step uses (an entry point's :func:`load_task` builds the task from it; train.py's plan
carries the one of ``ckpt_path=`` / ``resume=`` through the run), so nothing reads or checks the file again.

What train.py writes is plain already: the task's hyper-parameters are plain dicts (``run_build.task_arguments`` converts
the config), the tokenizer is a JSON string, the random state is tensors and tuples, callback and data-module states
are dicts of numbers. :data:`SAFE_GLOBALS` is the one place to allow-list a type should a checkpoint ever need one
(``tests/test_safe_checkpoints.py`` loads every family's checkpoint through here, so such a need shows up there).

Every checkpoint carries ``task_class`` (the LightningModule's import path, see ``Task.on_save_checkpoint``) and
its hyper-parameters, so the entry points need nothing but the file. Both are import paths that would be imported
and called (``_target_``), so an unpickled file is still not data until they are checked: :func:`load_task` refuses
a ``task_class`` or a ``_target_`` outside :mod:`attnlab.checkpoints.allowed_targets` before anything is imported or built, then
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .allowed_targets import check_targets, check_task_class
from .exported import SETTINGS, is_exported, read_exported
from ..core.errors import CheckpointError, DamagedCheckpointError, UnsafeCheckpointError, UserError
from ..files.folder_paths import names_a_local_checkpoint
from .state_fit import check_fits

# Types the safe unpickler may build beyond tensors and plain containers. Empty: attnlab's checkpoints need none.
# Add a class here (never a function: a callable global is how a pickle runs code) only if train.py starts saving it.
SAFE_GLOBALS: list[type] = []
# Registered for the whole process, so Lightning's own loads (trainer.fit/test(ckpt_path=..., weights_only=True) in
# train.py, which imports this module) accept the same types as read_checkpoint.
torch.serialization.add_safe_globals(SAFE_GLOBALS)



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


def archive_damage(path: str | Path, handle=None) -> str | None:
    """Why the zip archive of a torch checkpoint is damaged (its directory, every member's CRC), or None."""
    try:
        with zipfile.ZipFile(handle if handle is not None else Path(path)) as archive:
            bad = archive.testzip()
        return None if bad is None else f"member {bad} fails its CRC check"
    except zipfile.BadZipFile as e:
        return f"not a complete checkpoint archive: {e}; truncated?"
    except (OSError, EOFError) as e:
        return str(e)


def _damaged(path: Path, reason: str, option: str) -> DamagedCheckpointError:
    """A truncated or corrupted checkpoint, in one line naming an intact one next to it to continue from (the damaged
    file is left as it is)."""
    from ..core.quoting import shell_override

    intact = [q for q in sorted(path.parent.glob("*.ckpt"), key=lambda q: q.stat().st_mtime, reverse=True)
              if q != path and archive_damage(q) is None]
    epochs = [q for q in intact if q.name.startswith("epoch_")]
    use = (epochs or intact or [None])[0]
    hint = (f"continue from the intact {use.name} with {shell_override(option, use)}" if use is not None
            else "no intact checkpoint next to it: start the run anew")
    return DamagedCheckpointError(f"checkpoint {path} is damaged ({reason}); it is left as it is; {hint}")


@dataclass(frozen=True)
class TrustedCheckpoint:
    """A checkpoint file read once and checked as data: loaded with ``weights_only=True`` from one open of the file
    (its archive's CRCs checked on the same handle), its ``task_class`` and every ``_target_`` of its
    hyper-parameters among the project's own (:mod:`attnlab.checkpoints.allowed_targets`). What later steps need from the file
    is read from here, never from the file again."""

    path: Path
    contents: dict

    @property
    def exported(self) -> bool:
        """An exported model's folder (:mod:`.exported`): weights and settings, no training state."""
        return is_exported(self.path)

    @property
    def task_class(self) -> str | None:
        name = self.contents.get("task_class")
        return name if isinstance(name, str) else None

    @property
    def hyper_parameters(self) -> dict | None:
        hparams = self.contents.get("hyper_parameters")
        return hparams if isinstance(hparams, dict) else None

    @property
    def tokenizer(self) -> Any:
        return self.contents.get("tokenizer")

    @property
    def data_settings(self) -> Any:
        """The data module's hyper-parameters it was trained with (they decide its tokenizer and ids)."""
        return self.contents.get("datamodule_hyper_parameters")

    def loop_position(self):
        from .loop_position import from_checkpoint

        return from_checkpoint(self.contents)

    def check_fits(self, model: torch.nn.Module) -> None:
        """Its weights fit ``model`` (built from this run's config), renamed from an earlier layout in a copy: one
        line naming the first difference, before any logger or trainer exists (Lightning would find out only once
        it restores the file)."""
        from .upgrade import upgrade_state_dict

        state = self.contents.get("state_dict")
        if isinstance(state, dict):
            net = (self.hyper_parameters or {}).get("net")
            state = dict(state)
            upgrade_state_dict(state, net.get("_target_") if isinstance(net, dict) else None)
        check_fits(model, state, self.path)

    def drop_tensors(self) -> None:
        """Forget the weights and optimizer state read (train.py, before Lightning restores the file itself: its
        tensors need not stay in memory twice); the rest stays readable."""
        for key in ("state_dict", "optimizer_states"):
            self.contents.pop(key, None)


def checkpoint_file(path: str | Path) -> Path:
    """``path`` as a checkpoint file (or an exported model's folder) that exists, or the one line saying it does not
    (an entry point asks first when it would otherwise wait on its input before reading the checkpoint)."""
    path = Path(path).expanduser()
    if not path.is_file() and not is_exported(path):
        if path.is_dir():
            raise CheckpointError(f"{path.resolve()} is a folder, not a checkpoint (an exported model's folder holds "
                                  f"{SETTINGS})")
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    return path


def read_trusted(path: str | Path, option: str | None = None) -> TrustedCheckpoint:
    """The one read of a checkpoint (a ``.ckpt`` file, or an exported model's folder: :mod:`.exported`): a missing,
    unreadable, unsafe or damaged file, or one naming code outside the allow-list, is a one-line
    :class:`CheckpointError` before anything named in it is imported. ``option``
    (``resume``, ``ckpt_path``): a damaged file is then refused first, naming an intact checkpoint next to it to
    continue from with that option; the inference entry points (no option) name what torch could not read."""
    path = checkpoint_file(path)
    if is_exported(path):  # a folder of JSON and safetensors: no unpickler, the same checks below
        return _trusted(path, read_exported(path))
    with open(path, "rb") as f:
        damage = archive_damage(path, f)
        f.seek(0)
        try:
            contents: Any = _load(f, "cpu")
        except Exception as e:  # noqa: BLE001 - refused global, truncated file, not a torch file: named below
            contents = e
    if damage and option:
        raise _damaged(path, damage, option)
    if isinstance(contents, Exception):
        raise _refusal(path, contents)
    if damage:
        raise _damaged(path, damage, "ckpt")
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by attnlab's train.py (it holds a "
                              f"{type(contents).__name__}, not a dict)")
    return _trusted(path, contents)


def _trusted(path: Path, contents: dict) -> TrustedCheckpoint:
    """``contents`` checked: the task class and every ``_target_`` of its hyper-parameters are the project's own."""
    if isinstance(contents.get("task_class"), str):
        check_task_class(contents["task_class"], str(path))
    if isinstance(contents.get("hyper_parameters"), dict):  # before any task class is imported (seconds of Lightning)
        check_targets(contents["hyper_parameters"], f"{path}: hyper_parameters")
    return TrustedCheckpoint(path, contents)


def verified(ckpt_path: str | Path | None) -> str | Path | None:
    """``ckpt_path`` unchanged once it is known to load with ``weights_only=True``; for ``trainer.test(
    ckpt_path=verified(...), weights_only=True)`` of a checkpoint the run wrote itself, so that an unsafe or broken
    file is one line, not Lightning's traceback."""
    if not names_a_local_checkpoint(ckpt_path):
        return ckpt_path
    read_trusted(ckpt_path)
    return ckpt_path


def hyper_parameters(ckpt: dict, path: str | Path) -> dict:
    """The model config of a checkpoint read by other means (a notebook's ``torch.load``), checked: every
    ``_target_`` in it is one of the project's own (:mod:`attnlab.checkpoints.allowed_targets`); a missing or hostile one is
    one line naming the file. (:func:`read_trusted` checks them in its read.)"""
    hparams = ckpt.get("hyper_parameters")
    if isinstance(hparams, dict):
        check_targets(hparams, f"{path}: hyper_parameters")
    return model_config(ckpt, path)


def model_config(ckpt: dict, path: str | Path) -> dict:
    """The hyper-parameters of a trusted checkpoint, which must hold the net's config to rebuild the model."""
    hparams = ckpt.get("hyper_parameters")
    if not isinstance(hparams, dict) or not isinstance(hparams.get("net"), dict):
        raise CheckpointError(f"{path} has no hyper_parameters with the model's net config (damaged, or not written "
                              f"by attnlab's train.py): the model cannot be rebuilt from it")
    return hparams


def _callback_paths(state: dict) -> list[tuple[str, Any]]:
    """(field, value) for every file path a ``ModelCheckpoint`` state names."""
    from ..files.folder_paths import CHECKPOINT_PATH_FIELDS

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
    from ..files.folder_paths import name_in

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
