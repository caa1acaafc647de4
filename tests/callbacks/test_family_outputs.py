"""The callbacks that write a family's own outputs (translation table, TTS samples, confusion matrix, accuracy by
distance) act on the tasks that provide what they write and leave every other task alone, so all of them can be on
by default (conf/callbacks/default.yaml). A real Trainer and W&B offline; the translating module is a small
LightningModule that provides the table protocol (the translation families are run end to end in
tests/test_train_translation.py and tests/test_train_seq2seq_rnn.py)."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from attnlab.callbacks.accuracy_by_distance import AccuracyByDistanceCallback
from attnlab.callbacks.confusion_matrix import ConfusionMatrixCallback
from attnlab.callbacks.translation_table import TranslationTableCallback
from attnlab.callbacks.tts_samples import TTSSamplesCallback
from attnlab.tasks.protocols import TranslationRow


class Regression(L.LightningModule):
    """Provides none of the protocols."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self.layer(batch).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Translator(Regression):
    """The table protocol: the rows name the step, so each table shows which weights translated it."""

    def translation_table(self, size: int) -> list[TranslationRow]:
        return [TranslationRow(f"src {i}", f"ref {i}", f"hyp {i} at {self.global_step}") for i in range(size)]


def trainer(tmp_path, callbacks, logger=None):
    return L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1,
                     num_sanity_val_steps=1, accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                     logger=logger if logger is not None else CSVLogger(tmp_path), callbacks=callbacks)


def loader():
    return DataLoader(torch.randn(8, 2), batch_size=4)


def family_callbacks():
    return [TranslationTableCallback(size=3), TTSSamplesCallback(), ConfusionMatrixCallback(),
            AccuracyByDistanceCallback()]


def test_a_task_without_the_protocols_gets_no_files(tmp_path):
    callbacks = family_callbacks()
    t = trainer(tmp_path, callbacks)
    t.fit(Regression(), loader(), loader())
    t.test(Regression(), loader())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning_logs"]  # the CSV logger's folder only
    table, tts, confusion, distance = callbacks
    assert table.last_rows == [] and tts.last_paths == [] and confusion.paths == [] and distance.path is None


def test_translation_table_per_validation_in_files_and_wandb(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    for k, v in {"WANDB_SILENT": "true", "WANDB_MODE": "offline", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="attnlab-tests")
    try:
        trainer(tmp_path, family_callbacks(), logger).fit(Translator(), loader(), loader())
    finally:
        wandb.finish()
    # one table per validation epoch, none for the sanity check (step 0, untrained weights)
    tables = sorted((tmp_path / "translations").glob("*.tsv"))
    assert [p.name for p in tables] == ["epoch000-step000002.tsv", "epoch001-step000004.tsv"]
    assert tables[1].read_text().splitlines() == ["source\treference\thypothesis", "src 0\tref 0\thyp 0 at 4",
                                                  "src 1\tref 1\thyp 1 at 4", "src 2\tref 2\thyp 2 at 4"]
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    logged = sorted(run.glob("files/media/table/val/translations_*.table.json"))
    assert len(logged) == 2, list(run.rglob("*.json"))
    content = json.loads(logged[-1].read_text())
    assert content["columns"] == ["source", "reference", "hypothesis"]
    assert content["data"][2] == ["src 2", "ref 2", "hyp 2 at 4"]
