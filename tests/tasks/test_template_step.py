"""The base task's one template step: every family's step() returns its loss and metrics; the base adds the MoE
terms to the training loss, logs them under the names the docs and the claims read, and nothing else does."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch
from helpers import compose_train
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from attnlab.modules.moe import moe_losses
from attnlab.tasks import base
from attnlab.tasks.causal_lm import CausalLMTask
from attnlab.tasks.classification import ClassificationTask
from attnlab.tasks.sequence_classification import SequenceClassificationTask
from attnlab.tasks.translation import TranslationTask
from attnlab.tasks.translation_nat import NATTranslationTask
from attnlab.tasks.tts import TTSTask
from attnlab.tasks.vit import ImageClassificationTask
from attnlab.runs.build import build_model

TASKS = [CausalLMTask, ClassificationTask, ImageClassificationTask, SequenceClassificationTask, TranslationTask,
         NATTranslationTask, TTSTask]


@pytest.mark.parametrize("task_cls", TASKS, ids=lambda c: c.__name__)
def test_only_the_base_task_steps_and_adds_moe_terms(task_cls):
    for hook in ("training_step", "validation_step", "test_step", "_moe_terms"):
        assert getattr(task_cls, hook) is getattr(base.Task, hook), (task_cls.__name__, hook)
    source = inspect.getsource(inspect.getmodule(task_cls))
    assert "moe_losses" not in source and "return_weights" not in source
    assert "attention_tokens" not in inspect.signature(task_cls.__init__).parameters


class LMBatches(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq: int, n: int = 8):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq + 1), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:]}


class LossSpy(L.Callback):
    """The loss the training step returned next to the task loss it logged and the MoE layers' term."""

    def __init__(self):
        self.seen: list[tuple[float, float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        aux = moe_losses(pl_module.net)["moe/loss"].detach()  # the state of this step's forward
        self.seen.append((float(outputs["loss"].detach()), float(trainer.callback_metrics["train/loss"]), float(aux)))


def test_training_loss_is_the_task_loss_plus_the_moe_term_logged_once(tmp_path):
    cfg = compose_train(["model=causal_lm", "debug=fast", "moe=on", "moe.num_experts=4"], tmp_path)
    task = build_model(cfg.model)
    data = LMBatches(cfg.data.vocab_size, cfg.data.seq_len)
    spy = LossSpy()
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0, log_every_n_steps=1,
                        accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, logger=CSVLogger(tmp_path), callbacks=[spy])
    trainer.fit(task, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    assert len(spy.seen) == 2
    for returned, logged, aux in spy.seen:
        assert aux > 0 and returned == pytest.approx(logged + aux, rel=1e-5)
    keys = set(trainer.logged_metrics)
    assert {"train/loss", "train/ppl", "train/moe/loss", "train/moe/load_balance", "train/moe/z_loss",
            "moe/expert_0_fraction", "moe/expert_3_fraction", "val/loss", "val/ppl", "val/moe/loss"} <= keys, keys
