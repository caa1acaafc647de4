"""Stop (or skip the batch) when the training loss or the gradient norm is not finite; stop when an update made
the parameters non-finite.

:class:`NonFiniteGuard` checks, before each optimizer step, the loss that was backpropagated (every micro-batch
under gradient accumulation) and the total gradient norm of the optimizer's parameters; and after that step
(``check_weights=True``) that the parameters themselves are still finite.

``max_skips=0`` (default)
    The first non-finite step raises :class:`NonFiniteLossError` from ``on_before_optimizer_step``, i.e. *before*
    the optimizer updates anything, with a one-line message naming the step and which logged terms are not finite::

        non-finite loss at step 41 (epoch 0, batch 41): loss=nan; non-finite logged terms: train/loss=nan,
        train/ppl=nan; grad norm=nan; the optimizer step was not applied (1 non-finite step, max_skips=0);
        last good state: step 41, not saved; newest checkpoint: .../checkpoints/last.ckpt (step 32)

    (one line in reality; "non-finite gradient norm at ..." when the loss itself is finite). "Step" is ``trainer.global_step``: optimizer steps finished before this one, so a
    checkpoint of the last good state has ``global_step`` equal to it. The exception ends ``fit`` through
    Lightning's exception path: ``ModelCheckpoint`` saves nothing after the bad step (its ``save_last`` runs at
    batch/epoch/validation end, none of which is reached), so ``last.ckpt`` on disk stays the last good one. (Only a
    ``ModelCheckpoint(save_on_exception=True)`` writes on exceptions — and it would save the parameters of the last
    good step too, since nothing was updated.)

``max_skips=N > 0``
    Up to N non-finite steps are skipped, the (N+1)-th raises. Skipping sets every gradient of the optimizer's
    parameters to ``None``: torch optimizers (AdamW, Adam, SGD, ... foreach and fused alike) leave parameters
    without a gradient untouched — no momentum update, no weight decay, no step count — so the step is a true no-op
    (zeroing the gradients would not be: AdamW would still move the weights by momentum and decay). Gradient
    clipping then sees no gradients and does nothing. Lightning still counts the step (``global_step`` advances) and
    steps the LR schedule, as it does for steps a ``GradScaler`` skips. The count is logged as
    ``train/skipped_batches`` and saved in checkpoints (callback state), so ``max_skips`` is a budget for the
    whole run, resumes included.

After the step (``check_weights=True``, default)
    A finite loss with finite gradients can still produce a non-finite update: a learning rate of ``inf`` (or one
    so large that ``lr * update`` overflows float32) writes NaN/inf into the weights with the very first step, and
    the pre-step check only sees it one step later (the RNN translation model with ``model.optimizer.lr=inf``). So
    at ``on_train_batch_end`` of a checked step that was applied (under gradient accumulation: only the micro-batch
    that ended with the optimizer step) the guard checks that every parameter of the optimizer(s) is finite and
    otherwise raises :class:`NonFiniteLossError` naming the step and the first non-finite parameter::

        non-finite parameters after the optimizer step at step 0 (epoch 0, batch 0): the loss and gradient norm
        were finite, the update itself overflowed (learning rate too large?); first non-finite parameter:
        net.encoder.embedding.weight (34 of 34 parameter tensors); last good state: step 0, not saved (no
        checkpoint was written)

    This one is never skipped (``max_skips`` does not apply): the weights have already changed. Lightning runs
    ``ModelCheckpoint`` callbacks after all other callbacks of a hook, so the exception comes before its
    ``on_train_batch_end`` and ``last.ckpt`` on disk stays the last good one (none, if the very first step went
    bad). "The last good state" is the step after which the parameters were last checked finite (the run's start
    for the first check): with ``every_n_steps=1`` the step right before the bad update.

Loss terms: the message lists the scalars the ``training_step`` logged for this step (``self.log(...)``, e.g.
``train/loss``, ``moe/loss``, ``moe/z_loss``) that are not finite. They are read from Lightning's result
collection for the current step (an internal structure; if it is unavailable only the total loss is named).

Cost: one device->host synchronization per checked step (the ``.item()`` of one boolean, computed on the device
from the losses and ``torch.nn.utils.get_total_norm`` over the gradients — one extra read of the gradients). On CPU
that is negligible (microseconds, nothing to wait for); on a GPU it makes the host wait for the step's kernels,
typically a few percent of step time for small models: raise ``every_n_steps`` there. A step that is not checked
is applied even if it is non-finite (the next checked step then catches the damage, but cannot undo it).
``check_weights`` adds, per checked step, one more read of the parameters (their total 2-norm, one foreach pass;
only when it is not finite are the parameters checked element-wise, since it also overflows on huge finite weights)
and a second device->host sync, after the optimizer step: measured on CPU (1 thread) about 0.5 ms per million
parameters, 0.4% of a training step of the RNN translation model (1.1M parameters), 0.1% of the causal LM's.
Under DDP/FSDP each decision is all-reduced (one tiny collective per checked step, two with ``check_weights``) so
that every rank skips or stops together. Under fp16 mixed precision (``GradScaler``) overflowing gradients are
routine and the scaler already skips those steps: only the loss is checked there (and the weights after the step).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from ..core.errors import NonFiniteLossError, at_least

__all__ = ["NonFiniteGuard", "NonFiniteLossError"]

log = logging.getLogger(__name__)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


class NonFiniteGuard(L.Callback):
    """Raise :class:`NonFiniteLossError` on a non-finite loss / gradient norm, or skip up to ``max_skips`` steps.

    Args:
        max_skips: non-finite optimizer steps to skip (parameters and optimizer state untouched) before raising.
        every_n_steps: check every N optimizer steps (each check costs one device->host sync; see module doc).
        check_grad_norm: also check the total gradient norm (not only the loss).
        check_weights: after each checked optimizer step, check that the parameters are finite (raises; never
            skipped, since the update is already applied).
    """

    def __init__(self, max_skips: int = 0, every_n_steps: int = 1, check_grad_norm: bool = True,
                 check_weights: bool = True):
        super().__init__()
        at_least("max_skips", max_skips, 0)
        at_least("every_n_steps", every_n_steps, 1)
        self.max_skips = max_skips
        self.every_n_steps = every_n_steps
        self.check_grad_norm = check_grad_norm
        self.check_weights = check_weights
        self.skipped = 0
        self._losses: list[Tensor] = []
        self._seen: dict[str, Any] = {}
        # A checked optimizer step is about to be applied: (step, epoch, batch, grad norm checked), and the optimizers
        # whose parameters on_train_batch_end then checks. Set in on_before_optimizer_step, so gradient accumulation's
        # micro-batches without a step are not checked.
        self._pending: tuple[int, int, int, bool] | None = None
        self._pending_optimizers: list[torch.optim.Optimizer] = []
        self._good_step = 0  # global_step after which the parameters were last seen finite

    # ------------------------------------------------------------------ state (the skip budget spans resumes)
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._losses = []
        self._pending, self._pending_optimizers = None, []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._good_step = trainer.global_step  # after a resume: the loaded checkpoint's step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._losses:  # first micro-batch of an optimizer step: remember the logged values of the last one
            self._seen = {k: getattr(m, "_forward_cache", None) for k, m in _results(trainer).items()}

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self._losses.append(loss.detach())  # no sync: checked together with the gradients before the step

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        losses, self._losses = self._losses, []
        step = trainer.global_step
        if step % self.every_n_steps:
            return
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        loss_ok = torch.stack([torch.isfinite(x).all() for x in losses]).all() if losses else None
        grad_norm = None
        if self.check_grad_norm and scaler is None and grads:
            grad_norm = torch.nn.utils.get_total_norm(grads, foreach=None)
        ok = loss_ok
        if grad_norm is not None:
            finite_norm = torch.isfinite(grad_norm).to(device=ok.device if ok is not None else grad_norm.device)
            ok = finite_norm if ok is None else ok & finite_norm
        bad = ok is not None and not bool(ok)  # the one device->host sync of a checked step
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            self._handle_bad_step(trainer, optimizer, losses, grad_norm)
        elif self.check_weights:  # a skipped step changes nothing; an applied one is checked once it is done
            if self._pending is None:
                self._pending = (step, trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_idx,
                                 grad_norm is not None)
            self._pending_optimizers.append(optimizer)
        if self.max_skips:
            pl_module.log("train/skipped_batches", float(self.skipped), on_step=True, on_epoch=False)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Runs after the optimizer step, and before ModelCheckpoint's on_train_batch_end (Lightning moves checkpoint
        # callbacks last): raising here keeps non-finite weights out of last.ckpt.
        pending, optimizers = self._pending, self._pending_optimizers
        self._pending, self._pending_optimizers = None, []
        if pending is None:
            return
        params = list({id(p): p for opt in optimizers for g in opt.param_groups for p in g["params"]}.values())
        # One foreach pass: a NaN/inf anywhere makes the 2-norm non-finite (the order-inf norm would need no
        # confirmation, but is ~10x slower on CPU). The 2-norm also overflows on huge finite weights (|w| ~ 1e19):
        # confirm element-wise, which only a non-finite norm pays for.
        norm = torch.nn.utils.get_total_norm(params, 2.0)
        bad = not bool(torch.isfinite(norm)) and not all(bool(torch.isfinite(p).all()) for p in params)
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            self._raise_nonfinite_weights(pl_module, params, *pending)
        self._good_step = trainer.global_step

    # ------------------------------------------------------------------ work
    def _handle_bad_step(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, losses: list[Tensor],
                         grad_norm: Tensor | None) -> None:
        self.skipped += 1
        loop = trainer.fit_loop.epoch_loop
        loss = float(sum(x.float().sum() for x in losses)) if losses else None
        kind = "gradient norm" if loss is not None and math.isfinite(loss) else "loss"
        what = [f"loss={_fmt(loss)}" if loss is not None else "loss=<none>"]
        terms = self._nonfinite_logged_terms(trainer)
        if terms:
            what.append("non-finite logged terms: " + ", ".join(f"{k}={_fmt(v)}" for k, v in terms.items()))
        if grad_norm is not None:
            what.append(f"grad norm={_fmt(float(grad_norm))}")
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch}, batch {loop.batch_idx})"
        if self.skipped > self.max_skips:
            msg = (f"non-finite {kind} at {where}: {'; '.join(what)}; the optimizer step was not applied "
                   f"({self.skipped} non-finite step{'s' if self.skipped > 1 else ''}, max_skips={self.max_skips});"
                   f" {_last_good_state(trainer, trainer.global_step)}")
            raise NonFiniteLossError(msg)  # printed once, by whoever catches it (train.py: one line, exit 1)
        for group in optimizer.param_groups:  # no gradient: the optimizer leaves the parameter (and its state) alone
            for p in group["params"]:
                p.grad = None
        log.warning(f"non-finite {kind} at {where}: {'; '.join(what)}; batch skipped "
                    f"({self.skipped}/{self.max_skips} skips used)")

    def _raise_nonfinite_weights(self, pl_module: L.LightningModule, params: list[Tensor], step: int, epoch: int,
                                 batch_idx: int, grads_checked: bool) -> None:
        # Named in the module's order (the optimizer's param groups may be in another, e.g. decay / no decay).
        order = {id(p): (i, n) for i, (n, p) in enumerate(pl_module.named_parameters())}
        bad = [n for _, n in sorted(order.get(id(p), (len(order), "<unnamed>")) for p in params
                                    if not bool(torch.isfinite(p).all()))]
        why = ("the loss and gradient norm were finite, the update itself overflowed (learning rate too large?)"
               if grads_checked else "the loss was finite (gradient norm not checked), the update made them non-finite")
        first = f"{bad[0]} ({len(bad)} of {len(params)} parameter tensors)" if bad else "none here (another rank)"
        msg = (f"non-finite parameters after the optimizer step at step {step} (epoch {epoch}, batch {batch_idx}): "
               f"{why}; first non-finite parameter: {first}; {_last_good_state(pl_module.trainer, self._good_step)}")
        raise NonFiniteLossError(msg)  # printed once, by whoever catches it (train.py: one line, exit 1)

    def _nonfinite_logged_terms(self, trainer: L.Trainer) -> dict[str, float]:
        """Scalars logged by this step's ``training_step`` that are not finite (best effort, Lightning internals)."""
        out: dict[str, float] = {}
        try:
            for key, metric in _results(trainer).items():
                meta = getattr(metric, "meta", None)
                value = getattr(metric, "_forward_cache", None)  # the value logged on this step (on_step metrics)
                if meta is None or meta.fx != "training_step" or not isinstance(value, Tensor):
                    continue
                if value is self._seen.get(key):
                    continue  # not logged on this step: a stale value from an earlier one
                if value.numel() == 1 and not bool(torch.isfinite(value)):
                    out[meta.name] = float(value)
        except Exception:  # noqa: BLE001 - diagnostics only
            return {}
        return out


def _last_good_state(trainer: L.Trainer, step: int) -> str:
    """Where the last good state is: ``saved as <file>`` when a checkpoint of that step was written, else which
    checkpoint exists (with the default callbacks ``last.ckpt`` is written at validation/epoch end, so a stop in
    the middle of an epoch usually has none of the good step itself)."""
    saved: dict[str, int | None] = {}
    for mc in trainer.checkpoint_callbacks:
        for path in (getattr(mc, "last_model_path", ""), getattr(mc, "best_model_path", "")):
            if path and Path(path).is_file():
                # the step is known for the file this ModelCheckpoint wrote last in this process
                known = getattr(mc, "_last_checkpoint_saved", None) == path
                saved[path] = getattr(mc, "_last_global_step_saved", None) if known else saved.get(path)
    if not saved:
        return f"last good state: step {step}, not saved (no checkpoint was written)"
    newest = max(saved, key=lambda p: Path(p).stat().st_mtime)
    if saved[newest] == step:
        return f"last good state: step {step}, saved as {newest}"
    at = f" (step {saved[newest]})" if saved[newest] is not None else ""
    return f"last good state: step {step}, not saved; newest checkpoint: {newest}{at}"


def _results(trainer: L.Trainer) -> dict:
    """Lightning's result collection of the running training epoch (``{}`` if it has none)."""
    try:
        results = trainer.fit_loop.epoch_loop._results
    except Exception:  # noqa: BLE001
        return {}
    return results if isinstance(results, dict) else {}
