"""Training throughput and model FLOPs utilization (MFU).

Every ``log_every_n_steps`` training batches :class:`ThroughputMonitor` logs, measured over the window of batches
since its last log point:

* ``perf/tokens_per_sec``  global tokens/s: this process's tokens/s × ``trainer.world_size`` (progress bar);
* ``perf/samples_per_sec`` global samples/s, likewise;
* ``perf/step_time_ms``    wall time per training batch (a batch, not an optimizer step, under accumulation);
* ``perf/mfu``             achieved FLOPs/s ÷ peak FLOPs/s, achieved = global tokens/s × FLOPs per token,
  peak = per-device peak × world_size (so, per process: its own FLOPs/s ÷ its device's peak).

Protocol with the LightningModule (both optional)
-------------------------------------------------
``tokens_in_batch(self, batch) -> int``
    Tokens in a training batch (e.g. non-padding tokens). Without it: ``B × T`` of ``batch["input_ids"]`` for a
    dict batch, else of the first tensor of a tuple/list batch, else of the batch tensor itself (a 1-D tensor
    counts as B sequences of one token). It may also return a 0-d tensor (e.g. ``mask.sum()``): it is summed on
    its device and read only at a log point, so it adds no synchronization.
``flops_per_token(self, seq_len) -> float``
    Training FLOPs (forward + backward) per token at sequence length ``seq_len`` — the signature of
    :meth:`attnlab.models.causal_lm.CausalLM.flops_per_token`; a method without parameters is also accepted.
    Called once per distinct sequence length (cached). Without it, no MFU is logged.

Peak FLOPs/s: the ``peak_flops`` argument (per device), or else measured once at fit start by
:func:`measure_matmul_peak` in the trainer's precision (bf16 for ``bf16-*``, fp16 for ``16-*``, else fp32) on
the module's device, and cached per (device, dtype) for the process.

Timing and synchronization: the hot path (``on_train_batch_start``/``on_train_batch_end``) only reads
``time.perf_counter`` and tensor shapes: no ``.item()``, no ``torch.cuda.synchronize``. On CUDA the host runs
ahead of the GPU, so the time between two arbitrary points would be wrong, but over a window of many steps the
host cannot run ahead by more than the few steps the caching allocator/launch queue allow, and at every log
point the trainer reads the loss (``.item()`` for the progress bar/loggers), which synchronizes anyway; the error
is at most about one step per window. Validation runs (and the gap between epochs) are excluded from the window.

Loggers: values go through ``pl_module.log(on_step=True)``; the trainer writes step metrics to its loggers only
every ``Trainer(log_every_n_steps=...)`` steps, so choose this callback's ``log_every_n_steps`` as a multiple of
the trainer's to see every window (``trainer.callback_metrics`` always has the latest values).
"""

from __future__ import annotations

import inspect
import math
import time
from typing import Any, Callable

import lightning as L
import torch
import torch.nn.functional as F
from ..core.errors import at_least

__all__ = ["ThroughputMonitor", "measure_matmul_peak", "precision_dtype"]

_PEAK_CACHE: dict[tuple[str, torch.dtype], float] = {}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type not in ("cpu", "meta") and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def measure_matmul_peak(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    n: int | None = None,
    repeats: int = 10,
    max_seconds: float | None = None,
) -> float:
    """Dense (n × n) @ (n × n)ᵀ matmul throughput in FLOPs/s: a practical peak for MFU.

    Timed through ``F.linear``, the kernel every ``nn.Linear`` of the models runs: on a CPU without native bf16,
    ``torch.mm`` in bf16 takes a generic path ~7x slower than linear's oneDNN one (measured 0.3 vs 2.0 GFLOP/s),
    which made bf16 MFU read above 100%. Same FLOPs (2·n³) either way.

    Args:
        dtype: matmul dtype (use the training precision: bf16, fp16 or fp32).
        device: where to measure.
        n: matrix size; default 8192 on accelerators (2048 measured 364 TFLOP/s on an H200 whose 8192 products
            run at ~790, which read MFU 2x too high), 1024 on CPU (shrunk on a slow CPU so one matmul fits the
            time budget).
        repeats: timed matmuls at most (after a warm-up).
        max_seconds: time budget for the timed part; default 1.0 s on CPU, 2.0 s elsewhere (the whole call stays
            well under ~2 s on CPU).

    Returns the best single-matmul rate, 2·n³ / seconds (a positive finite float).
    """
    device = torch.device(device)
    cpu = device.type == "cpu"
    budget = (1.0 if cpu else 2.0) if max_seconds is None else max_seconds
    if n is None:
        n = 1024 if cpu else 8192
    gen = torch.Generator(device=device).manual_seed(0)  # (made where they are used: 8192² on the host is slow)

    def make(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randn(size, size, generator=gen, device=device).to(dtype)
        b = torch.randn(size, size, generator=gen, device=device).to(dtype)
        return a, b

    def timed(a: torch.Tensor, b: torch.Tensor) -> float:
        _synchronize(device)
        t0 = time.perf_counter()
        F.linear(a, b)
        _synchronize(device)
        return max(time.perf_counter() - t0, 1e-9)

    with torch.no_grad():
        if cpu:  # probe with a small matrix; shrink n so that one matmul takes at most ~1/4 of the budget
            a, b = make(256)
            timed(a, b)
            rate = 2 * 256**3 / timed(a, b)
            while n > 256 and 2 * n**3 / rate > budget / 4:
                n //= 2
        a, b = make(n)
        timed(a, b)  # warm-up (kernel selection, allocator, lazy init)
        best, spent = 0.0, 0.0
        for _ in range(max(1, repeats)):
            dt = timed(a, b)
            best = max(best, 2 * n**3 / dt)
            spent += dt
            if spent > budget:
                break
    return float(best)


def precision_dtype(precision: Any) -> torch.dtype:
    """The matmul dtype of a trainer precision setting ('bf16-mixed' -> bf16, '16-mixed' -> fp16, else fp32)."""
    p = str(precision)
    if "bf16" in p:
        return torch.bfloat16
    if p.startswith("16") or p == "half":
        return torch.float16
    return torch.float32


def _batch_shape(batch: Any) -> tuple[int, int] | None:
    """(samples, seq_len) of a batch from shapes only, or None."""
    t = None
    if isinstance(batch, dict):
        t = batch.get("input_ids")
        if t is None:
            t = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, (tuple, list)) and batch:
        t = next((v for v in batch if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, torch.Tensor):
        t = batch
    if not isinstance(t, torch.Tensor) or t.ndim == 0:
        return None
    return int(t.shape[0]), int(t.shape[1]) if t.ndim >= 2 else 1


class ThroughputMonitor(L.Callback):
    """Log tokens/s, samples/s, time per batch and MFU (see the module docstring for protocol and caveats).

    Args:
        log_every_n_steps: training batches per measurement window.
        peak_flops: peak FLOPs/s of one device; None: measured at fit start with :func:`measure_matmul_peak`.
        prog_bar: show ``perf/tokens_per_sec`` in the progress bar.
    """

    def __init__(self, log_every_n_steps: int = 10, peak_flops: float | None = None, prog_bar: bool = True):
        super().__init__()
        at_least("log_every_n_steps", log_every_n_steps, 1)
        self.log_every_n_steps = log_every_n_steps
        self.peak_flops = peak_flops
        self.prog_bar = prog_bar
        self.measured_peak_flops: float | None = None
        self._flops_fn: Callable[[int], float] | None = None
        self._flops_cache: dict[int, float] = {}
        self._reset_window()

    # ------------------------------------------------------------------ state
    def _reset_window(self) -> None:
        self._start: float | None = None  # perf_counter at the window's first batch start
        self._paused_at: float | None = None
        self._paused = 0.0
        self._batches = 0
        self._samples = 0
        self._tokens: int | torch.Tensor = 0
        self._flops: float | torch.Tensor = 0.0
        self._flops_ok = True

    @property
    def peak(self) -> float | None:
        """Peak FLOPs/s of one device in use (given or measured)."""
        return self.peak_flops if self.peak_flops is not None else self.measured_peak_flops

    # ------------------------------------------------------------------ setup
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset_window()
        self._flops_cache.clear()
        self._flops_fn = self._resolve_flops_fn(pl_module)
        if self.peak_flops is None and self._flops_fn is not None:
            dtype, device = precision_dtype(trainer.precision), pl_module.device
            key = (str(device), dtype)
            if key not in _PEAK_CACHE:
                _PEAK_CACHE[key] = measure_matmul_peak(dtype, device)
            self.measured_peak_flops = _PEAK_CACHE[key]

    @staticmethod
    def _resolve_flops_fn(pl_module: L.LightningModule) -> Callable[[int], float] | None:
        fn = getattr(pl_module, "flops_per_token", None)
        if not callable(fn):
            return None
        try:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        except (TypeError, ValueError):
            params = [None]
        if not params:
            return lambda seq_len: float(fn())
        return lambda seq_len: float(fn(seq_len))

    def _flops_per_token(self, seq_len: int) -> float | None:
        if self._flops_fn is None:
            return None
        if seq_len not in self._flops_cache:
            self._flops_cache[seq_len] = self._flops_fn(seq_len)
        return self._flops_cache[seq_len]

    # ------------------------------------------------------------------ pause around validation / between epochs
    def _pause(self) -> None:
        if self._start is not None and self._paused_at is None:
            self._paused_at = time.perf_counter()

    def _resume(self, now: float) -> None:
        if self._paused_at is not None:
            self._paused += now - self._paused_at
            self._paused_at = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()  # until the next training batch starts (covers checkpointing after validation too)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    # ------------------------------------------------------------------ hot path
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        else:
            self._resume(now)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        shape = _batch_shape(batch)
        counter = getattr(pl_module, "tokens_in_batch", None)
        if callable(counter):
            tokens = counter(batch)
        elif shape is not None:
            tokens = shape[0] * shape[1]
        else:
            tokens = 0
        self._tokens = self._tokens + tokens
        self._samples += shape[0] if shape is not None else 0
        self._batches += 1
        if self._flops_ok:
            fpt = self._flops_per_token(shape[1]) if shape is not None else None
            if fpt is None:
                self._flops_ok = False
            else:
                self._flops = self._flops + tokens * fpt
        if self._batches >= self.log_every_n_steps:
            self._log(trainer, pl_module)

    # ------------------------------------------------------------------ log point
    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now = time.perf_counter()
        assert self._start is not None
        elapsed = now - self._start - self._paused
        if elapsed <= 0:
            self._reset_window()
            return
        world = max(1, trainer.world_size)
        tokens = float(self._tokens)  # a tensor count is read here, once per window
        metrics = {
            "perf/tokens_per_sec": tokens / elapsed * world,
            "perf/samples_per_sec": self._samples / elapsed * world,
            "perf/step_time_ms": 1000.0 * elapsed / self._batches,
        }
        peak = self.peak
        if self._flops_ok and self._flops_fn is not None and peak and peak > 0:
            achieved = float(self._flops) / elapsed * world  # global FLOPs/s
            mfu = achieved / (peak * world)
            if math.isfinite(mfu):
                metrics["perf/mfu"] = mfu
        for name, value in metrics.items():
            pl_module.log(
                name, value, on_step=True, on_epoch=False, sync_dist=False, logger=True,
                prog_bar=self.prog_bar and name == "perf/tokens_per_sec", batch_size=1,
            )
        self._reset_window()
        self._start = time.perf_counter()
