"""``resume=``: continue a run in its own directory, from its last checkpoint, under the same W&B run id.

    python train.py <same overrides> resume=auto                      # the newest run of this model with a last.ckpt
    python train.py <same overrides> resume=outputs/train/runs/<run>  # that run (or a path to one of its .ckpt)

The Hydra run directory itself is chosen by the ``resume_dir`` resolver (conf/hydra/default.yaml), so the resumed
run writes its checkpoints, attention maps and logs next to the first part's instead of starting a new folder.

"This model" is the model name and its resolved ``model.net`` (sizes, blocks, vocabulary): ``resume=auto`` compares
them with each run's saved ``.hydra/config.yaml``, newest run first, and skips runs of other models, whose weights
would not load. It takes the newest run of this model and no other: if that run stopped before its first
checkpoint, it is refused, naming that run and the older one that ``resume=<dir>`` would continue. Before Hydra
writes anything into the chosen folder, ``run_folder.RunFolderGuard`` refuses in one line a run of another model
(``resume=<run>``) or of other data (every ``data.*`` key but how it is loaded, see :func:`data_differences`: the
data decide the tokenizer, and a new one would give the checkpoint's embeddings other ids), ``resume=auto`` with no
run of this model, and a damaged checkpoint. Once the data are set up, :func:`check_tokenizer` compares the
tokenizer itself with the one saved in the checkpoint (a text file edited between the parts).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from ..checkpoints.upgrade import upgrade_net_config, upgrade_targets
from ..core.errors import ResumeError

if TYPE_CHECKING:
    from ..checkpoints.read import TrustedCheckpoint

log = logging.getLogger(__name__)

LAST = Path("checkpoints") / "last.ckpt"
SAVED_CONFIG = Path(".hydra") / "config.yaml"


# ----------------------------------------------------------------------------------------------------------------
# which model a run trained
# ----------------------------------------------------------------------------------------------------------------
def model_identity(model: Any) -> tuple[str | None, dict | None]:
    """``(model.name, resolved model.net)`` of a composed config's ``model`` node, the net in today's form (a run
    saved before a part's form changed is the same model); the net is None when it does not resolve (then only the
    names are compared)."""
    if not isinstance(model, DictConfig):
        return None, None
    name = model.get("name")
    try:
        net = upgrade_net_config(OmegaConf.to_container(model.net, resolve=True)) if "net" in model else None
    except Exception:  # noqa: BLE001 - an interpolation that needs the run's own context (e.g. ${hydra:...})
        net = None
    return (None if name is None else str(name)), net


def saved_model(run_dir: str | Path) -> tuple[str | None, dict | None] | None:
    """The model of a run as its saved ``.hydra/config.yaml`` says; None if there is no readable one."""
    try:
        saved = OmegaConf.load(Path(run_dir) / SAVED_CONFIG)
    except Exception:  # noqa: BLE001 - missing or unreadable: unknown
        return None
    return model_identity(saved.get("model")) if isinstance(saved, DictConfig) else None


def model_differences(there: tuple[str | None, dict | None], here: tuple[str | None, dict | None]) -> list[str]:
    """What differs between two models (empty: the same model), e.g. ``["model.net.d_model=32 there, 192 here"]``.
    An unknown side (None) matches anything."""
    (name_a, net_a), (name_b, net_b) = there, here
    if name_a is not None and name_b is not None and name_a != name_b:
        return [f"model={name_a} there, model={name_b} here"]
    if net_a is None or net_b is None:
        return []
    flat_a, flat_b = _flatten(net_a, "model.net"), _flatten(net_b, "model.net")
    missing = object()
    return [f"{k}={flat_a.get(k, '<unset>')} there, {flat_b.get(k, '<unset>')} here"
            for k in sorted(set(flat_a) | set(flat_b)) if flat_a.get(k, missing) != flat_b.get(k, missing)]


def describe(model: tuple[str | None, dict | None]) -> str:
    return f"model={model[0]}" if model[0] else "this model"


def _flatten(d: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}"))
    return out


# data keys that say how the data are loaded, not what they are: they may change between the parts
LOADING_ONLY = frozenset({"num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "cache_dir",
                          "datasets_cache"})


def data_differences(there: Any, here: Any) -> list[str]:
    """What differs between two ``data`` config nodes (empty: the same data), e.g. ``["data.max_digits=7 there, 3
    here"]``; keys in :data:`LOADING_ONLY` are left out. An unreadable side (None) matches anything."""
    if not isinstance(there, DictConfig) or not isinstance(here, DictConfig):
        return []
    try:
        a, b = (OmegaConf.to_container(n, resolve=True) for n in (there, here))
    except Exception:  # noqa: BLE001 - an interpolation that needs the run's own context: compare as written
        a, b = (OmegaConf.to_container(n, resolve=False) for n in (there, here))
    flat_a, flat_b = _flatten(a, "data"), _flatten(b, "data")
    return _data_changes(flat_a, flat_b, set(flat_a) | set(flat_b))


def checkpoint_data_differences(saved_args: Any, here: Any) -> list[str]:
    """What differs between the data a checkpoint was trained on and a resolved ``data`` config node, as
    :func:`data_differences` says it. The checkpoint's side is the data module's arguments, which Lightning saves as
    ``datamodule_hyper_parameters``; only the keys both name are compared (an argument the config leaves at its
    default, a key an older checkpoint lacks: unknown). No saved arguments (a data module that saves none): []."""
    if not isinstance(saved_args, dict) or not isinstance(here, DictConfig):
        return []
    flat_a = _flatten(saved_args, "data")
    flat_b = _flatten(OmegaConf.to_container(here, resolve=True), "data")
    return _data_changes(flat_a, flat_b, (set(flat_a) & set(flat_b)) - {"data._target_"})


def _data_changes(flat_a: dict[str, Any], flat_b: dict[str, Any], keys: set[str]) -> list[str]:
    missing = object()
    return [f"{k}={flat_a.get(k, '<unset>')} there, {flat_b.get(k, '<unset>')} here" for k in sorted(keys)
            if k.split(".")[1] not in LOADING_ONLY and flat_a.get(k, missing) != flat_b.get(k, missing)]


def optimizer_difference(there: DictConfig, here: DictConfig) -> str | None:
    """``"torch.optim.AdamW there, torch.optim.SGD here"`` when the two configs' ``optim`` options build different
    optimizers (a config without the group: AdamW, the only one there was); None when they agree."""
    a, b = (str((c.get("optim") or {}).get("_target_", "torch.optim.AdamW")) for c in (there, here))
    return None if a == b else f"optim._target_={a} there, {b} here"


def check_checkpoint_data(ckpt: Any, path: str | Path, data_cfg: Any) -> None:
    """``train.py ckpt_path=``: a new run from a checkpoint's full training state trains on the data it was trained
    on, as ``resume=`` does (:func:`data_differences`); ResumeError (one line naming the keys) otherwise. The data
    decide the tokenizer: other data would train the checkpoint's embeddings on another tokenizer's ids."""
    differences = checkpoint_data_differences((ckpt or {}).get("datamodule_hyper_parameters"), data_cfg)
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        overrides = Path(path).parent.parent / ".hydra" / "overrides.yaml"
        see = f" (see {overrides})" if overrides.is_file() else ""
        raise ResumeError(f"ckpt_path={path} was trained on other data ({shown}): its weights are indexed by the "
                          f"tokenizer and ids of those; give its run's data overrides{see}")


def check_left_to_train(ckpt: Any, path: str | Path, trainer_cfg: Any) -> None:
    """``train.py ckpt_path=`` (training): the checkpoint has training left under this run's ``trainer.max_epochs``
    / ``max_steps``. One that already reached them would train no step, then test and be marked completed as if it
    had; ResumeError (one line with the ways on) instead."""
    from ..checkpoints.loop_position import from_checkpoint

    pos = from_checkpoint(ckpt) if isinstance(ckpt, dict) else None
    if pos is None or pos.batches_done:
        return
    max_epochs = (trainer_cfg or {}).get("max_epochs")
    max_steps = (trainer_cfg or {}).get("max_steps")
    done = []
    if isinstance(max_epochs, int) and max_epochs >= 0 and pos.epoch >= max_epochs:
        done.append(f"it has trained {pos.epoch} epoch(s), trainer.max_epochs={max_epochs}")
    if isinstance(max_steps, int) and max_steps > 0 and pos.global_step >= max_steps:
        done.append(f"it is at step {pos.global_step}, trainer.max_steps={max_steps}")
    if done:
        raise ResumeError(f"ckpt_path={path}: this run would train no step ({'; '.join(done)}); give a larger "
                          f"trainer.max_epochs (or max_steps) to train on from there, or train=false to test it")


def saved_config(run_dir: str | Path) -> DictConfig | None:
    try:
        saved = OmegaConf.load(Path(run_dir) / SAVED_CONFIG)
    except Exception:  # noqa: BLE001 - missing or unreadable: unknown
        return None
    return upgrade_targets(saved) if isinstance(saved, DictConfig) else None


def check_tokenizer(checkpoint: TrustedCheckpoint, datamodule: Any, option: str = "resume") -> None:
    """The datamodule's tokenizer (after ``setup``) must be the one saved in the checkpoint that ``option``
    (``resume=`` or ``ckpt_path=``) continues from: the checkpoint's embeddings and output layer are indexed by its
    ids. ResumeError (one line) otherwise."""
    tok = getattr(datamodule, "tokenizer", None)
    if tok is None or not hasattr(tok, "to_str"):
        return
    saved, path = checkpoint.tokenizer, checkpoint.path
    if saved is not None and saved != tok.to_str():
        since = "since the first part" if option == "resume" else "since that run"
        hparams = getattr(datamodule, "hparams", None) or {}
        why = (f"the corpus changed {since}; restore it, or start a new run" if hparams.get("source") != "numbers" else
               "this version generates the numbers data differently (zero is always in the training split): a run "
               "of the earlier data cannot be continued; start a new run")
        raise ResumeError(f"{option}: the tokenizer these data give is not the one saved in {path} (its ids "
                          f"would not match the checkpoint's embeddings): {why}")


def has_checkpoint(run: Path) -> bool:
    return (run / LAST).is_file() or any((run / LAST).parent.glob("last-v*.ckpt"))


def runs_newest_first(runs_root: str | Path) -> list[Path]:
    """Run folders under ``runs_root`` (a saved config or a ``last.ckpt``), the most recently written first (its
    ``last.ckpt`` or, for a run killed before its first checkpoint, its config)."""
    def written(run: Path) -> float:
        return max((p.stat().st_mtime for p in (run / LAST, run / SAVED_CONFIG) if p.is_file()), default=0.0)

    runs = {p.parent.parent for p in Path(runs_root).glob(f"*/{LAST}")}
    runs |= {p.parent.parent for p in Path(runs_root).glob(f"*/{SAVED_CONFIG}")}
    return sorted(runs, key=lambda r: (written(r), r.name), reverse=True)


def find_auto(runs_root: str | Path, model: tuple[str | None, dict | None],
              with_checkpoint: bool = False) -> tuple[Path | None, Path | None]:
    """``(newest run of this model, newest run of another model seen before it or instead of it)``. The newest run
    of this model is returned whether or not it has a checkpoint (``with_checkpoint``: only runs that have one)."""
    skipped = None
    for run in runs_newest_first(runs_root):
        if with_checkpoint and not has_checkpoint(run):
            continue
        there = saved_model(run)
        if there is None or not model_differences(there, model):
            return run, skipped
        skipped = skipped or run
    return None, skipped


def resolve_resume_dir(resume, runs_root: str, stamp: str, _root_: DictConfig | None = None) -> str:
    """The run directory: ``runs_root/stamp`` for a new run, the run to continue when ``resume`` is set.

    Never raises (Hydra would bury the message in a traceback): when there is nothing to resume it returns the new
    folder, and ``RunFolderGuard`` / train.py report the problem in one line before anything is written there.
    """
    if resume in (None, False, "", "null", "false"):
        return str(Path(runs_root) / stamp)
    if str(resume) == "auto":
        model = model_identity(_root_.get("model") if isinstance(_root_, DictConfig) else None)
        run, _ = find_auto(runs_root, model)
        return str(run) if run is not None else str(Path(runs_root) / stamp)
    path = Path(str(resume)).expanduser().resolve()
    if path.is_file() and path.suffix == ".ckpt":
        path = path.parent.parent
    return str(path) if (path / LAST).is_file() or (path / "checkpoints").is_dir() else str(Path(runs_root) / stamp)


def register_resolvers() -> None:
    """``resume_dir`` (hydra.run.dir); ``resume_sweep_dir`` (hydra.sweep.dir, resolved by ``-m`` only) is
    registered by :mod:`attnlab.runs.sweep_continue`, which train.py's run folder guard imports."""
    OmegaConf.register_new_resolver("resume_dir", resolve_resume_dir, replace=True)


# ----------------------------------------------------------------------------------------------------------------
# the checkpoint to continue from
# ----------------------------------------------------------------------------------------------------------------
def last_checkpoint(run_dir: str | Path, resume) -> Path:
    """The checkpoint ``resume=`` continues from: a ``.ckpt`` it names, else the run's ``checkpoints/last.ckpt`` —
    or a newer ``last-vN.ckpt`` next to it (left by two writers of one folder), said in a warning."""
    named = Path(str(resume)).expanduser()
    if named.suffix == ".ckpt" and named.is_file():
        return named.resolve()
    ckpt = Path(run_dir) / LAST
    versions = sorted(ckpt.parent.glob("last-v*.ckpt"), key=lambda p: p.stat().st_mtime)
    if versions and (not ckpt.is_file() or versions[-1].stat().st_mtime > ckpt.stat().st_mtime):
        log.warning(f"resuming from {versions[-1]}: it is newer than {ckpt.name}"
                    + (" (which is older: left by an earlier writer of this folder)" if ckpt.is_file() else ""))
        return versions[-1]
    if ckpt.is_file():
        return ckpt
    if str(resume) == "auto":
        raise ResumeError(f"resume=auto: no run with {LAST} under {Path(run_dir).parent}")
    raise ResumeError(f"resume={resume}: no {LAST} there")


def check_intact(path: str | Path, option: str = "resume") -> None:
    """Refuse a truncated or corrupted checkpoint in one line, naming an intact one next to it (the damaged file
    is left as it is). A torch checkpoint is a zip archive: its directory and every member's CRC are checked.
    (:func:`attnlab.checkpoints.read.read_trusted` does this in its one read; this is for a file not to be read.)"""
    from ..checkpoints.read import _damaged, archive_damage

    reason = archive_damage(path)
    if reason is not None:
        raise _damaged(Path(path), reason, option)


# ----------------------------------------------------------------------------------------------------------------
# overrides the restored state ignores
# ----------------------------------------------------------------------------------------------------------------
def overridden_by_checkpoint(previous: DictConfig | None, current: DictConfig) -> list[str]:
    """Warnings for ``model.optimizer.*`` / ``model.scheduler.*`` values, and the ``optim`` / ``sched`` options'
    own values, that differ from the first part's (another optimizer class is refused: run_folder.check_resume).

    The checkpoint restores the optimizer's param groups (lr, betas, weight decay, ...) and the LR scheduler's
    ``base_lrs`` and step: a changed optimizer value is not applied. The schedule's shape (warmup, decay length,
    floor) is rebuilt from the config — a lambda is not saved — so changed scheduler values apply from the resumed
    step on, scaled by the restored base learning rate."""
    if previous is None or "model" not in previous or "model" not in current:
        return []
    out = []
    not_applied = ("NOT applied: the optimizer state restored from the checkpoint keeps the first part's value (start "
                   "a new run to change it)")
    applied = ("applied from the resumed step on (the schedule is rebuilt from the config; its base learning rate "
               "comes from the checkpoint)")
    # the model's tuned values, then the optim / sched options' own (a saved config without them: nothing to say)
    for key, verdict in (("model.optimizer", not_applied), ("model.scheduler", applied), ("optim", not_applied),
                         ("sched", applied)):
        try:
            if OmegaConf.select(previous, key) is None:
                continue
            before = OmegaConf.to_container(OmegaConf.select(previous, key) or {}, resolve=True)
            now = OmegaConf.to_container(OmegaConf.select(current, key) or {}, resolve=True)
        except Exception:  # noqa: BLE001
            continue
        if key in ("optim", "sched"):  # the values read from the model's are named there
            before, now = ({k: v for k, v in d.items() if not _reads_model(OmegaConf.select(c, key), k)}
                           for d, c in ((before, previous), (now, current)))
        a, b = _flatten(before, key), _flatten(now, key)
        changed = [f"{k}={b.get(k)} (first part: {a.get(k)})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        if changed:
            out.append(f"resume: {', '.join(changed)}: {verdict}")
    return out


def _reads_model(node: Any, key: str) -> bool:
    return isinstance(node, DictConfig) and key in node and OmegaConf.is_interpolation(node, key)


def previous_wandb_id(run_dir: str | Path) -> str | None:
    """The id of the newest W&B run logged in this directory (``wandb/offline-run-<date>_<time>-<id>``)."""
    runs = sorted((Path(run_dir) / "wandb").glob("*run-*-*"), key=lambda p: p.name.split("-", 2)[-1])
    runs = [r for r in runs if r.is_dir() and not r.is_symlink()]
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


register_resolvers()
