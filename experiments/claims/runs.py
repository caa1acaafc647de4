"""What a finished job trained, rebuilt for an analysis: its net at initialization, its checkpoint, its data.

The measurements themselves are generic and live in the package (:mod:`attnlab.probes.language_model`,
:mod:`attnlab.probes.translation`); these loaders only know where a claim's :class:`~.base.Job` keeps things.
"""

from __future__ import annotations

import os

import torch
from omegaconf import OmegaConf

from attnlab.core.paths import ROOT  # also sets ATTNLAB_ROOT, which a run's saved config resolves its cache dir against

from .base import Job


def built_net(job: Job) -> torch.nn.Module:
    """A fresh net from the job's own model config (at the current torch seed)."""
    from attnlab.tasks.base import build_net

    return build_net(OmegaConf.to_container(job.config.model.net, resolve=True))


def load_run(job: Job):
    """(task in eval mode on CPU, data module set up for testing) of one translation job."""
    import hydra

    data = job.config.data  # read first: a saved config naming foreign code is refused before anything is built

    from attnlab.runs.load import load_task
    from attnlab.tasks.translation import TranslationTask

    task, _ = load_task(job.checkpoint, TranslationTask, "translation")
    dm = hydra.utils.instantiate(data)
    dm.prepare_data()
    dm.setup("test")
    return task, dm


def datamodule(job: Job):
    """The LM job's data, tokenizer and splits from the shared cache (nothing is retrained once cached)."""
    from attnlab.data.lm_datamodule import LMDataModule

    d = job.config.data
    dm = LMDataModule(source=d.source, path=d.path, vocab_size=d.vocab_size, seq_len=d.seq_len,
                      batch_size=d.batch_size, cache_dir=os.environ.get("ATTNLAB_CACHE") or str(ROOT / ".cache"),
                      val_fraction=d.val_fraction, test_fraction=d.test_fraction, seed=job.config.seed)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def task_at_init(job: Job):
    """The LM job's task as train.py built it before the first step (same config, same seed), in eval mode."""
    import lightning as L

    from attnlab.runs.build import build_model

    L.seed_everything(int(job.config.seed), verbose=False)
    return build_model(job.config.model).eval()


def trained_task(job: Job):
    """The LM job's task from its best checkpoint, in eval mode."""
    from attnlab.runs.load import load_task
    from attnlab.tasks.causal_lm import CausalLMTask

    task, _ = load_task(job.checkpoint, CausalLMTask, "language-model")
    return task.eval()
