"""Read checkpoints written by train.py without ever running code from them, and load a task from one, refusing a
file of another model family with one line.

A ``.ckpt`` is a pickle: read with ``weights_only=False``, a file whose unpickling calls ``os.system`` runs its
command the moment it is loaded, before any check of what it holds. Every path that reads a checkpoint (the
``generate``/``translate``/``synthesize`` entry points, ``train.py`` test/``ckpt_path``/``resume``, the claims, the
notebooks) therefore goes through :func:`read_checkpoint` or :func:`verified` here, which load with
``weights_only=True``: PyTorch's restricted unpickler accepts tensors and plain containers only and refuses any
other global *before* calling it.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import torch

from .allowed_targets import check_targets, check_task_class
from .errors import CheckpointError, UnsafeCheckpointError, UserError, find_user_error, one_line_message

# Types the safe unpickler may build beyond tensors and plain containers. Empty: attnlab's checkpoints need none.
# Add a class here (never a function: a callable global is how a pickle runs code) only if train.py starts saving it.
SAFE_GLOBALS: list[type] = []
# Registered for the whole process, so Lightning's own loads (trainer.fit/test(ckpt_path=..., weights_only=True) in
# train.py, which imports this module) accept the same types as read_checkpoint.
torch.serialization.add_safe_globals(SAFE_GLOBALS)

# task class -> what the user would call it, and the entry point that serves it
FAMILIES = {
    "CausalLMTask": ("a language model", "generate.py"),
    "TranslationTask": ("a translation model", "translate.py"),
    "NATTranslationTask": ("a translation model", "translate.py"),
    "ImageClassificationTask": ("an image classifier", "train.py ckpt_path=... train=false"),
    "TTSTask": ("a text-to-speech model", "synthesize.py"),
    "SequenceClassificationTask": ("a sequence classifier", "train.py ckpt_path=... train=false"),
}

# Lightning's own names for a checkpoint (trainer.fit/test(ckpt_path="last"|"best"|...)): not files to check here
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc")


def _load(path: Path, map_location: Any, mmap: bool = False) -> Any:
    return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


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


def _read_mapped(path: Path) -> Any:
    """The file loaded with ``weights_only=True``, memory-mapped where the file allows it (checking a large
    checkpoint reads little of it); a legacy (non-zip) torch file is read whole."""
    try:
        return _load(path, "cpu", mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise _refusal(path, e) from None
        return read_checkpoint(path)
    except Exception as e:
        raise _refusal(path, e) from None


def verified(ckpt_path: str | Path | None) -> str | Path | None:
    """``ckpt_path`` unchanged once it is known to load with ``weights_only=True``; for ``trainer.fit/test(
    ckpt_path=verified(...), weights_only=True)``, so that an unsafe or broken file is one line, not Lightning's
    traceback."""
    if ckpt_path is None or str(ckpt_path) in LIGHTNING_CKPT_NAMES or "://" in str(ckpt_path):
        return ckpt_path
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    _read_mapped(path)
    return ckpt_path


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
        family, entry = FAMILIES.get(task_cls.__name__, (task_cls.__name__, "its own entry point"))
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


def _shape(t: Any) -> str:
    shape = tuple(getattr(t, "shape", ()))
    return "x".join(map(str, shape)) or "a scalar"


def check_fits(model: torch.nn.Module, state_dict: Any, path: str | Path) -> None:
    """Refuse in one line a state dict that does not fit ``model`` (another size, other parts, keys missing or
    extra), as the strict ``load_state_dict`` would, naming the file and the first difference; keys of an earlier
    layout are expected renamed already (``Task.on_load_checkpoint``)."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{path} holds no state_dict (the weights): damaged, or not written by train.py")
    own = model.state_dict()
    hint = ("; it was trained with other model settings: give the overrides of its run "
            "(<run>/.hydra/overrides.yaml), or a checkpoint of this model")
    for key, value in own.items():
        if key in state_dict and tuple(getattr(state_dict[key], "shape", ())) != tuple(getattr(value, "shape", ())):
            raise CheckpointError(f"{path} does not fit this model: size mismatch for {key}: checkpoint "
                                  f"{_shape(state_dict[key])}, this model {_shape(value)}{hint}")
    missing = [k for k in own if k not in state_dict]
    extra = [k for k in state_dict if k not in own]
    for keys, verdict in ((missing, "this model has {} that the checkpoint lacks"),
                          (extra, "the checkpoint has {} that this model lacks")):
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise CheckpointError(f"{path} does not fit this model: {verdict.format(keys[0] + more)}{hint}")


def build_task(task_cls: type, ckpt: dict, path: str | Path, device: str = "cpu"):
    """The task rebuilt from the checkpoint already read (never from the file again: what was checked is what is
    built), its weights loaded strictly.

    What ``LightningModule.load_from_checkpoint`` does, minus reading the file a second time and minus Lightning's
    older hyper-parameter keys: the task is built from the checked ``hyper_parameters`` (arguments the task no
    longer takes are dropped, as Lightning does), ``on_load_checkpoint`` renames an earlier layout's keys and
    reads the tokenizer, and the state dict must fit (:func:`check_fits`) before it is loaded."""
    import inspect

    hparams = hyper_parameters(ckpt, path)
    params = inspect.signature(task_cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        hparams = {k: v for k, v in hparams.items() if k in params}
    try:
        task = task_cls(**hparams)
    except Exception as e:
        if find_user_error(e) is not None:
            raise
        raise CheckpointError(f"{path}: cannot build {task_cls.__name__} from its hyper_parameters (damaged?): "
                              f"{one_line_message(e)}") from None
    task._checkpoint_path = path  # named by on_load_checkpoint's refusals
    task.on_load_checkpoint(ckpt)  # renames an earlier layout's keys, then checks the weights fit (check_fits)
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
    """A checkpoint's tokenizer (the JSON text train.py stores) must be there and parse; one line otherwise."""
    if not isinstance(text, str) or not text:
        raise CheckpointError(f"{path} has no {key} (the model's vocabulary; damaged, or saved without its data "
                              f"module): its output could not be decoded")
    from .data.tokenizer import BPETokenizer

    try:
        BPETokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception
        raise CheckpointError(f"{path}: its {key} cannot be read (damaged): {one_line_message(e)}") from None


def check_for_model(path: str | Path, model_cfg: Any) -> None:
    """``train.py ckpt_path=`` / ``resume=``: the checkpoint Lightning will restore is data (every ``_target_`` and
    its ``task_class`` allowed) and of the family ``model_cfg`` builds; one line otherwise. Needs no model, so it
    runs before Lightning is imported; whether the weights fit is checked once the model is built
    (:func:`check_fits`, from ``Task.on_load_checkpoint``)."""
    if path is None or str(path) in LIGHTNING_CKPT_NAMES or "://" in str(path):
        return
    path = Path(str(path)).expanduser()
    verified(path)
    ckpt = _read_mapped(path)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by attnlab's train.py")
    name = ckpt.get("task_class")
    if not isinstance(name, str):
        raise CheckpointError(f"{path} names no task_class: not a checkpoint written by attnlab's train.py")
    check_task_class(name, str(path))
    hyper_parameters(ckpt, path)
    want = model_cfg.get("_target_") if isinstance(model_cfg, Mapping) else None
    if want and name != want:
        family = FAMILIES.get(name.rsplit(".", 1)[-1], (name, ""))[0]
        mine = FAMILIES.get(str(want).rsplit(".", 1)[-1], (want, ""))[0]
        raise CheckpointError(f"{path} is {family} checkpoint ({name.rsplit('.', 1)[-1]}), but this run builds "
                              f"{mine} ({str(want).rsplit('.', 1)[-1]}): choose its model= (see its run's "
                              f".hydra/overrides.yaml)")


def check_file_fits(model: torch.nn.Module, path: str | Path | None) -> None:
    """:func:`check_fits` for the checkpoint ``train.py ckpt_path=`` restores, right after the model is built and
    before any logger or trainer exists (Lightning itself would find out only once it restores the file)."""
    if path is None or str(path) in LIGHTNING_CKPT_NAMES or "://" in str(path) or not Path(str(path)).is_file():
        return
    from .checkpoint_upgrade import upgrade_state_dict

    ckpt = _read_mapped(Path(str(path)).expanduser())
    state = ckpt.get("state_dict") if isinstance(ckpt, dict) else None
    if isinstance(state, dict):
        net = (ckpt.get("hyper_parameters") or {}).get("net")
        upgrade_state_dict(state, net.get("_target_") if isinstance(net, dict) else None)
    check_fits(model, state, path)


def check_resumed_run(run_dir: str | Path, ckpt: str | Path | None = None, model_cfg: Any = None) -> None:
    """``resume=<run>``: neither the run's saved config nor the checkpoint to continue from names code outside the
    allow-list, and the checkpoint is of this model's family; checked before Hydra writes anything there."""
    from omegaconf import OmegaConf, open_dict

    from .allowed_targets import check_targets

    saved = Path(run_dir) / ".hydra" / "config.yaml"
    if saved.is_file():
        try:
            cfg = OmegaConf.load(saved)
            # resume builds nothing from the saved config; it resolves its model and data to compare them. The
            # callbacks and loggers a run added (a user's own `+callbacks.x._target_=...`) are not read: not refused
            with open_dict(cfg):
                for group in ("callbacks", "logger"):
                    if group in cfg:
                        cfg[group] = {}
            check_targets(cfg, str(saved), "run")
        except UserError:
            raise
        except Exception:  # noqa: BLE001 - unreadable YAML: not ours to judge here (resume compares what it can)
            pass
    if ckpt is not None:
        check_for_model(ckpt, model_cfg)
