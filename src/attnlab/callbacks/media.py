"""What the callbacks that write files and W&B media share: when to write, where, and logging to W&B."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger


def writes_now(trainer: L.Trainer) -> bool:
    """Write on global rank zero only, and never for the sanity check's validation (step 0, untrained)."""
    return trainer.is_global_zero and not trainer.sanity_checking


def run_dir(trainer: L.Trainer) -> Path:
    """The run's folder (``trainer.default_root_dir``: the Hydra run dir in this repo's train config)."""
    return Path(trainer.default_root_dir)


def wandb_loggers(trainer: L.Trainer) -> list[WandbLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]


def step_caption(trainer: L.Trainer) -> str:
    return f"epoch {trainer.current_epoch}, step {trainer.global_step}"


def log_image(trainer: L.Trainer, key: str, path: Path, caption: str | None = None) -> None:
    """Log a PNG to every W&B logger of the trainer under ``key`` at ``trainer.global_step``."""
    for lg in wandb_loggers(trainer):
        lg.log_image(key=key, images=[str(path)], step=trainer.global_step,
                     caption=[caption if caption is not None else step_caption(trainer)])
