import csv
import math
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from attnlab.callbacks.throughput import ThroughputMonitor, _batch_shape, measure_matmul_peak, precision_dtype
from attnlab.models.causal_lm import CausalLM

VOCAB, SEQ, BATCH = 50, 17, 4


def _loader(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = [{"input_ids": torch.randint(1, VOCAB, (SEQ,), generator=g)} for _ in range(n)]
    return DataLoader(data, batch_size=BATCH)


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = CausalLM(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, max_len=32, dropout=0.0)

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        logits = self.model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)

    def flops_per_token(self, seq_len):
        return self.model.flops_per_token(seq_len)


class CountingLM(TinyLM):
    """Counts tokens itself (a 0-d tensor, as a mask sum would be) and has no FLOPs estimate: no MFU."""

    flops_per_token = None

    def __init__(self):
        super().__init__()
        self.counted = 0

    def tokens_in_batch(self, batch):
        self.counted += 1
        return (batch["input_ids"][:, :-1] > 0).sum()


def _fit(tmp_path, module, monitor, batches=6):
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=batches, limit_val_batches=0, log_every_n_steps=2,
        accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, logger=CSVLogger(tmp_path, name="csv"), default_root_dir=tmp_path,
        callbacks=[monitor],
    )
    trainer.fit(module, _loader())
    return trainer


def _csv_rows(trainer):
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        return list(csv.DictReader(f))


def test_logs_throughput_and_mfu_with_measured_peak(tmp_path):
    monitor = ThroughputMonitor(log_every_n_steps=2)
    trainer = _fit(tmp_path, TinyLM(), monitor)
    m = trainer.callback_metrics
    assert float(m["perf/tokens_per_sec"]) > 0
    assert float(m["perf/samples_per_sec"]) > 0
    assert float(m["perf/step_time_ms"]) > 0
    assert 0 < float(m["perf/mfu"]) < 1
    # Default count: B × T of input_ids; world size 1.
    ratio = float(m["perf/tokens_per_sec"]) / float(m["perf/samples_per_sec"])
    assert ratio == pytest.approx(SEQ)
    assert monitor.measured_peak_flops is not None and monitor.measured_peak_flops > 0

    rows = [r for r in _csv_rows(trainer) if r.get("perf/tokens_per_sec")]
    assert len(rows) == 3  # 6 batches, a window every 2, aligned with the trainer's log_every_n_steps=2
    assert all(float(r["perf/tokens_per_sec"]) > 0 and 0 < float(r["perf/mfu"]) < 1 for r in rows)


def test_given_peak_and_token_protocol_without_flops(tmp_path):
    monitor = ThroughputMonitor(log_every_n_steps=3, peak_flops=1e12)
    module = CountingLM()
    trainer = _fit(tmp_path, module, monitor)
    m = trainer.callback_metrics
    assert module.counted == 6
    assert monitor.measured_peak_flops is None  # nothing measured when a peak is given (or no MFU possible)
    assert float(m["perf/tokens_per_sec"]) > 0
    assert float(m["perf/tokens_per_sec"]) / float(m["perf/samples_per_sec"]) == pytest.approx(SEQ - 1)
    assert "perf/mfu" not in m


class NoArgFlopsLM(TinyLM):
    """The other accepted form: ``flops_per_token()`` without a sequence length."""

    def flops_per_token(self):
        return self.model.flops_per_token(SEQ)


def test_mfu_against_given_peak(tmp_path):
    monitor = ThroughputMonitor(log_every_n_steps=2, peak_flops=1e15)
    trainer = _fit(tmp_path, NoArgFlopsLM(), monitor, batches=4)
    m = trainer.callback_metrics
    fpt = TinyLM().model.flops_per_token(SEQ)
    expected = float(m["perf/tokens_per_sec"]) * fpt / 1e15
    assert float(m["perf/mfu"]) == pytest.approx(expected, rel=1e-4)


def test_measure_matmul_peak_cpu():
    t0 = time.perf_counter()
    peak = measure_matmul_peak(torch.float32, "cpu")
    assert time.perf_counter() - t0 < 3.0
    assert math.isfinite(peak) and peak > 0
    small = measure_matmul_peak(torch.bfloat16, "cpu", n=128, repeats=2)
    assert math.isfinite(small) and small > 0


def test_helpers():
    assert precision_dtype("bf16-mixed") is torch.bfloat16
    assert precision_dtype("16-mixed") is torch.float16
    assert precision_dtype("32-true") is torch.float32
    assert _batch_shape({"input_ids": torch.zeros(3, 7)}) == (3, 7)
    assert _batch_shape((torch.zeros(5, 2), torch.zeros(5))) == (5, 2)
    assert _batch_shape(torch.zeros(4)) == (4, 1)
    assert _batch_shape({"x": 1}) is None
