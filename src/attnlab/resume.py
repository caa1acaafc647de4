"""``resume=``: continue a run in its own directory, from its last checkpoint, under the same W&B run id.

    python train.py <same overrides> resume=auto                      # the newest run of this task with a last.ckpt
    python train.py <same overrides> resume=outputs/train/runs/<run>  # that run (or a path to its .ckpt)

The Hydra run directory itself is chosen by the ``resume_dir`` resolver (conf/hydra/default.yaml), so the resumed
run writes its checkpoints, attention maps and logs next to the first part's instead of starting a new folder.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from .errors import UserError

LAST = Path("checkpoints") / "last.ckpt"


class ResumeError(UserError, ValueError):
    pass


def resolve_resume_dir(resume, runs_root: str, stamp: str) -> str:
    """The run directory: ``runs_root/stamp`` for a new run, the run to continue when ``resume`` is set.

    Never raises (Hydra would bury the message in a traceback): when there is nothing to resume it returns the new
    folder, and train.py reports the problem in one line (:func:`last_checkpoint`).
    """
    if resume in (None, False, "", "null", "false"):
        return str(Path(runs_root) / stamp)
    if str(resume) == "auto":
        runs = sorted(Path(runs_root).glob(f"*/{LAST}"), key=lambda p: p.stat().st_mtime)
        return str(runs[-1].parent.parent) if runs else str(Path(runs_root) / stamp)
    path = Path(str(resume)).expanduser().resolve()
    if path.is_file() and path.suffix == ".ckpt":
        path = path.parent.parent
    return str(path) if (path / LAST).is_file() else str(Path(runs_root) / stamp)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("resume_dir", resolve_resume_dir, replace=True)


def last_checkpoint(run_dir: str | Path, resume) -> Path:
    ckpt = Path(run_dir) / LAST
    if ckpt.is_file():
        return ckpt
    if str(resume) == "auto":
        raise ResumeError(f"resume=auto: no run with {LAST} under {Path(run_dir).parent}")
    raise ResumeError(f"resume={resume}: no {LAST} there")


def previous_wandb_id(run_dir: str | Path) -> str | None:
    """The id of the newest W&B run logged in this directory (``wandb/offline-run-<date>_<time>-<id>``)."""
    runs = sorted((Path(run_dir) / "wandb").glob("*run-*-*"), key=lambda p: p.name.split("-", 2)[-1])
    runs = [r for r in runs if r.is_dir() and not r.is_symlink()]
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


register_resolvers()
