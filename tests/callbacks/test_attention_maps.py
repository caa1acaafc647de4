import glob
import os
import warnings

import lightning as L
import matplotlib.image as mpimg
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from attnlab.callbacks.attention_maps import AttentionMapCallback
from attnlab.models.causal_lm import CausalLM
from attnlab.modules.attention import MultiHeadAttention
from attnlab.tasks.protocols import AttentionSample

VOCAB, SEQ = 50, 17


def _loader(n=8, seed=0, batch_size=4):
    g = torch.Generator().manual_seed(seed)
    data = [{"input_ids": torch.randint(0, VOCAB, (SEQ,), generator=g)} for _ in range(n)]
    return DataLoader(data, batch_size=batch_size)


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = CausalLM(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, max_len=32, dropout=0.1)
        self.slow_path_in_training: list[str] = []
        self.training_steps = 0
        g = torch.Generator().manual_seed(123)
        self.sample_ids = torch.randint(0, VOCAB, (1, SEQ - 1), generator=g)

    def _attn(self):
        return {n: m for n, m in self.named_modules() if isinstance(m, MultiHeadAttention)}

    def _loss(self, ids):
        logits = self.model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch["input_ids"])
        self.training_steps += 1
        # Fast path: no module asked for weights, and none were computed (the explicit path stores them).
        for name, m in self._attn().items():
            if m.return_weights or m.weights is not None:
                self.slow_path_in_training.append(name)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch["input_ids"]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    # --- attention-map protocol
    def attention_sample(self, max_tokens):
        labels = [f"t{int(i)}" for i in self.sample_ids[0]]
        return AttentionSample({"ids": self.sample_ids}, labels, labels)

    def attention_forward(self, ids):
        return self.model(ids)


def _trainer(tmp_path, callbacks, max_epochs=2, logger=None, **kw):
    return L.Trainer(
        max_epochs=max_epochs, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1, log_every_n_steps=1,
        accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, logger=logger if logger is not None else CSVLogger(tmp_path),
        default_root_dir=tmp_path, callbacks=callbacks, **kw,
    )


def _dirs(root):
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_maps_per_module_every_n_epochs_and_fast_path_kept(tmp_path):
    every1 = AttentionMapCallback(every_n_epochs=1, dirname="maps1")
    every2 = AttentionMapCallback(every_n_epochs=2, dirname="maps2", max_layers=1, max_tokens=8)
    module = TinyLM()
    trainer = _trainer(tmp_path, [every1, every2])
    trainer.fit(module, _loader(), _loader(seed=1))

    # After validation epochs 0 and 1 (2 batches each); none for the sanity check (which would be step 0).
    assert _dirs(tmp_path / "maps1") == ["epoch000-step000002", "epoch001-step000004"]
    assert _dirs(tmp_path / "maps2") == ["epoch001-step000004"]
    both = ["model.decoder.layers.0.self_attn.png", "model.decoder.layers.1.self_attn.png"]
    for epoch_dir in _dirs(tmp_path / "maps1"):
        assert _dirs(tmp_path / "maps1" / epoch_dir) == both
    assert [p.name for p in every1.last_paths] == both
    assert [p.name for p in every2.last_paths] == ["model.decoder.layers.0.self_attn.png"]
    assert all(p.exists() for p in every1.last_paths + every2.last_paths)
    assert mpimg.imread(every2.last_paths[0]).ndim == 3

    # The training steps kept the fused path; weights are off again after the callback's passes.
    assert module.training_steps == 4
    assert module.slow_path_in_training == []
    assert all(not m.return_weights and m.weights is None for m in module._attn().values())

    # Rendering directly restores each submodule's mode (training here, one submodule deliberately in eval).
    module.train()
    module.model.decoder.layers[1].eval()
    paths = every1.render(trainer, module)
    assert len(paths) == 2
    assert module.training and module.model.decoder.layers[0].training and not module.model.decoder.layers[1].training
    assert all(not m.return_weights for m in module._attn().values())


class NoProtocolLM(TinyLM):
    attention_sample = None


def test_warns_once_without_protocol(tmp_path):
    cb = AttentionMapCallback(dirname="maps")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, [cb]).fit(NoProtocolLM(), _loader(), _loader(seed=1))
    ours = [w for w in caught if "attention_sample" in str(w.message)]
    assert len(ours) == 1
    assert not (tmp_path / "maps").exists() and cb.last_paths == []


class PerModuleLabelsLM(TinyLM):
    def attention_sample(self, max_tokens):
        labels = [f"t{int(i)}" for i in self.sample_ids[0]]
        return AttentionSample({"ids": self.sample_ids}, labels, labels,
                               labels={"model.decoder.layers.1.": ([f"q{i}" for i in range(len(labels))], labels)})


def test_labels_per_module_prefix_longest_match_wins():
    sample = AttentionSample({}, ["q"], ["k"], labels={"enc": (["e"], ["e"]), "enc.layers.1": (["x"], ["y"])})
    assert sample.labels_for("dec.layers.0") == (["q"], ["k"])
    assert sample.labels_for("enc.layers.0") == (["e"], ["e"])
    assert sample.labels_for("enc.layers.1.self_attn") == (["x"], ["y"])


class TupleSampleLM(TinyLM):
    def attention_sample(self, max_tokens):
        return {"ids": self.sample_ids}, None, None


def test_an_untyped_sample_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="must return an AttentionSample or None, got tuple"):
        _trainer(tmp_path, [AttentionMapCallback(dirname="maps")], max_epochs=1).fit(
            TupleSampleLM(), _loader(), _loader(seed=1))


def test_logs_images_to_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    cb = AttentionMapCallback(max_tokens=12)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="attnlab-tests")
    try:
        _trainer(tmp_path, [cb], max_epochs=1, logger=logger).fit(PerModuleLabelsLM(), _loader(), _loader(seed=1))
    finally:
        wandb.finish()
    assert len(cb.last_paths) == 2
    pngs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "images" / "**" / "*.png"),
                     recursive=True)
    assert len(pngs) == 2, pngs
    assert any("layers.0" in p for p in pngs) and any("layers.1" in p for p in pngs)
