"""What every task (LightningModule) shares: building its net from config, the optimizer and LR schedule its
``optimizer`` / ``scheduler`` configs name (conf/optim, conf/sched; :mod:`attnlab.optim`), the schedule stepped per
optimizer step, and one template step that adds the MoE auxiliary losses.

A task implements :meth:`Task.step` (one batch -> :class:`~attnlab.tasks.protocols.StepOutput`: its loss and
metrics) and, where val/test also decode, :meth:`Task.generate_step`; the base task's training/validation/test
steps call them, add the MoE terms to the training loss and log everything under the same names for every family.

Tasks receive *configs* (plain dicts with ``_target_``), not built modules, and call ``save_hyperparameters()``:
a checkpoint then rebuilds its own model (``Task.load_from_checkpoint(path)``) with no Hydra run around it.

A task trusts the config it is given: the classes a file names are checked where the file is read
(:func:`attnlab.checkpoints.read.read_trusted`, which :meth:`Task.load_from_checkpoint` goes through too), the
classes a run's config names where the run is planned (:mod:`attnlab.runs.plan`); a config written in Python is
the caller's own code.
"""

from __future__ import annotations

import inspect
import json
import random
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from ..checkpoints.read import model_config, read_trusted
from ..checkpoints.upgrade import (
    upgrade_net_config,
    upgrade_optimizer_config,
    upgrade_scheduler_config,
    upgrade_state_dict,
)
from ..checkpoints.state_fit import check_fits
from ..modules.moe import expert_fractions, moe_losses
from ..optim import build_lr_schedule, build_optimizer
from ..data.normalization import growth_problem
from ..data.tokenizer import BPETokenizer
from ..core.errors import CheckpointError
from .protocols import StepOutput


def to_container(cfg: Any) -> Any:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def build_net(cfg: Any) -> nn.Module:
    """Instantiate a plain nn.Module from a config with ``_target_`` (or pass a built module through)."""
    if isinstance(cfg, nn.Module):
        return cfg
    # a config of an earlier layout (an old checkpoint's or run's) in today's form first
    return _instantiate_net(upgrade_net_config(to_container(cfg)))


def _instantiate_net(cfg: dict) -> nn.Module:
    """The net of a config already in today's form (its classes checked where it was read: see the module's doc)."""
    return hydra.utils.instantiate(cfg, _convert_="all")


def saved_tokenizer(checkpoint: dict, where: str | Path = "the checkpoint") -> BPETokenizer | None:
    """The tokenizer a checkpoint carries (the JSON text train.py saves), or None without one: the one place it is
    read back. A task restores it when loaded (:meth:`Task.on_load_checkpoint`); the entry points read
    ``task.tokenizer``. ``where``: the checkpoint's name in the one-line refusal of a damaged one."""
    from tokenizers import Tokenizer

    text = checkpoint.get("tokenizer")
    if not isinstance(text, str) or not text:
        return None
    try:  # the normalizer's bound before the tokenizer normalizes anything
        spec = json.loads(text)
        too_long = growth_problem(spec.get("normalizer")) if isinstance(spec, dict) else None
    except ValueError:
        too_long = None  # not JSON: the tokenizers library says what is wrong below
    if too_long:
        raise CheckpointError(f"{where}: its tokenizer cannot be used: {too_long}")
    try:
        raw = Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a damaged file
        raise CheckpointError(f"{where}: its tokenizer cannot be read (damaged): "
                              f"{str(e).strip().splitlines()[0]}") from None
    try:
        return BPETokenizer(raw)
    except ValueError as e:  # (no end-of-text token: it checks its special tokens)
        raise CheckpointError(f"{where}: its tokenizer cannot be read (damaged): {e}") from None


class Task(L.LightningModule):
    # what an entry point needs from the checkpoint besides the model ("tokenizer": restored as ``tokenizer``)
    checkpoint_keys: tuple[str, ...] = ()
    tokenizer: BPETokenizer | None = None

    def __init__(
        self,
        net: Any,
        optimizer: dict | None = None,
        scheduler: dict | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters(logger=False)
        if isinstance(net, nn.Module):
            self.net = net
        else:  # a checkpoint of an earlier layout: its config in today's form, saved and built as such
            self.hparams["net"] = net = upgrade_net_config(to_container(net))
            self.net = _instantiate_net(net)
        # what to build (a _target_ and its arguments); bare values are AdamW's and warm-up + cosine's
        self.optimizer_cfg = upgrade_optimizer_config(to_container(optimizer))
        self.scheduler_cfg = upgrade_scheduler_config(to_container(scheduler))
        self.compile_net = compile
        self._compiled: nn.Module | None = None

    @classmethod
    def arguments_from(cls, hparams: dict) -> dict:
        """``hparams`` without the arguments this task no longer takes (as Lightning drops them)."""
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return dict(hparams)
        return {k: v for k, v in hparams.items() if k in params}

    @classmethod
    def from_checkpoint(cls, ckpt: dict, path: str | Path = "the checkpoint", **overrides: Any) -> Task:
        """The task a checkpoint read by :func:`read_trusted` holds, its weights loaded strictly: built from its
        ``hyper_parameters`` (and ``overrides``; arguments the task no longer takes are dropped, as Lightning does),
        an earlier layout's keys renamed and the tokenizer restored by :meth:`on_load_checkpoint`."""
        task = cls(**cls.arguments_from({**model_config(ckpt, path), **overrides}))
        task.restore(ckpt, path)
        return task

    def restore(self, ckpt: dict, path: str | Path = "the checkpoint") -> None:
        """This task's weights (and tokenizer) from checkpoint contents read by :func:`read_trusted`, strictly."""
        self._checkpoint_path = path  # named by on_load_checkpoint's refusals
        self.on_load_checkpoint(ckpt)  # renames an earlier layout's keys, checks the weights fit, the tokenizer
        self.load_state_dict(ckpt["state_dict"], strict=True)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, **kwargs: Any) -> Task:
        """Lightning's ``load_from_checkpoint`` through the one trusted read (``weights_only=True``, the classes
        named in the file checked before anything is built) and :meth:`from_checkpoint`: always strict, from the
        file's own hyper-parameters (``kwargs`` override them; ``weights_only`` is accepted and always true)."""
        if hparams_file is not None or strict is False:
            raise ValueError("attnlab tasks load strictly from the checkpoint's own hyper-parameters")
        kwargs.pop("weights_only", None)
        trusted = read_trusted(checkpoint_path)
        task = cls.from_checkpoint(trusted.contents, trusted.path, **kwargs)
        return task.to(map_location) if map_location is not None else task

    def __setattr__(self, name, value):
        # Keep the compiled wrapper out of the module registry: it would duplicate every key of the state dict.
        if name == "_compiled":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def _forward(self) -> nn.Module:
        """The net as training calls it: torch.compile'd when ``compile=true``, else the net itself."""
        return self.net if self._compiled is None else self._compiled

    def setup(self, stage: str) -> None:
        if self.compile_net and self._compiled is None:
            self._compiled = torch.compile(self.net)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Lets entry points (generate, evaluate) rebuild the right task from the file alone.
        checkpoint["task_class"] = f"{type(self).__module__}.{type(self).__qualname__}"
        # Random state at this step boundary (dropout masks, sampling), so that a resumed run draws what the
        # uninterrupted run drew. Plain tensors and tuples: the file still loads with weights_only=True.
        checkpoint["rng_states"] = {"torch": torch.get_rng_state(), "python": random.getstate()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Lightning calls this before loading the weights: old key names are moved to today's here
        net = (checkpoint.get("hyper_parameters") or {}).get("net")
        if "state_dict" in checkpoint and isinstance(net, dict):
            upgrade_state_dict(checkpoint["state_dict"], net.get("_target_"))
        # another size or other parts: one line naming the first difference, not load_state_dict's traceback
        path = getattr(self._trainer, "ckpt_path", None) or getattr(self, "_checkpoint_path", None)
        check_fits(self, checkpoint.get("state_dict"), path or "the checkpoint")
        self._pending_rng = checkpoint.get("rng_states")
        if "tokenizer" in self.checkpoint_keys and "tokenizer" in checkpoint:
            self.tokenizer = saved_tokenizer(checkpoint, path or "the checkpoint")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Restored here, not at load time: building the resumed epoch's dataloader iterator draws a seed from the
        # global generator, which the uninterrupted run did at its epoch start, before this step boundary.
        rng = getattr(self, "_pending_rng", None)
        if rng:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            self._pending_rng = None

    def configure_optimizers(self):
        opt = build_optimizer(self.net, self.optimizer_cfg, getattr(self.trainer, "precision", None))
        total = self.scheduler_cfg.get("total_steps") or int(self.trainer.estimated_stepping_batches)
        schedule = build_lr_schedule(opt, self.scheduler_cfg, total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # --- the template step -------------------------------------------------------------------------------------
    # Stages whose MoE terms are logged (copy_test, the translation's second test set, is not: same weights).
    MOE_STAGES = ("train", "val", "test")

    def step(self, batch: Any, stage: str) -> StepOutput:
        """The task's loss and metrics of one batch; ``stage`` is train, val, test (or a task's own test stage).
        Called once per batch, right after which the base reads the MoE layers' auxiliary losses, so a val/test
        pass that runs the net again (decoding) belongs in :meth:`generate_step`."""
        raise NotImplementedError

    def generate_step(self, batch: Any, batch_idx: int, stage: str) -> None:
        """Val/test work after :meth:`step`: metrics of generated outputs (translation, free-running speech)."""

    def test_stage(self, dataloader_idx: int) -> str:
        """The stage name of a test dataloader (a task with several test sets names them)."""
        return "test"

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        out = self._run_step(batch, "train")
        aux = self._moe_terms("train")
        return out.loss + aux if aux is not None else out.loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, batch_idx, self.test_stage(dataloader_idx))

    def _eval_step(self, batch: Any, batch_idx: int, stage: str) -> None:
        self._run_step(batch, stage)
        if stage in self.MOE_STAGES:
            self._moe_terms(stage)
        self.generate_step(batch, batch_idx, stage)

    def _run_step(self, batch: Any, stage: str) -> StepOutput:
        out = self.step(batch, stage)
        train = stage == "train"
        for name, value in out.metrics.items():
            self.log(f"{stage}/{name}", value, on_step=train, on_epoch=not train, prog_bar=name in out.prog_bar,
                     batch_size=out.batch_size, add_dataloader_idx=False)
        return out

    def _moe_terms(self, stage: str) -> Tensor | None:
        """The MoE layers' weighted auxiliary loss of the last forward (None for a dense net), logged with its
        parts (``<stage>/moe/loss``, ``load_balance``, ``z_loss``) and, in training, each expert's share."""
        aux = moe_losses(self.net)
        if not aux:
            return None
        for k, v in aux.items():
            self.log(f"{stage}/{k}", v, on_step=stage == "train", on_epoch=stage != "train")
        if stage == "train":
            fractions = expert_fractions(self.net).mean(dim=0)  # (E,) averaged over layers
            for e, f in enumerate(fractions):
                self.log(f"moe/expert_{e}_fraction", f, on_step=True, on_epoch=False)
        return aux["moe/loss"]
