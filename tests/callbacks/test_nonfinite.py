"""NonFiniteGuard: a real non-finite loss (an inf input at batch k, or a huge learning rate in the real LM) stops
the run before the bad step is applied, naming the step and the term; with max_skips the bad batch is a no-op. An
update that overflows from a finite loss and finite gradients (lr=inf) stops the run right after that step, before
last.ckpt can take the non-finite weights."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import compose_train
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from attnlab.core.errors import NonFiniteLossError
from attnlab.callbacks.nonfinite import NonFiniteGuard
from attnlab.cli.train import run

N_BATCHES = 8


class PoisonedRegression(Dataset):
    """y = x·w* + noise; samples listed in ``bad`` have an inf input (one sample per batch: index == step)."""

    def __init__(self, n: int = N_BATCHES, bad: tuple[int, ...] = ()):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=g)
        self.bad = set(bad)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = torch.full((4,), float("inf")) if i in self.bad else self.x[i]
        return x, self.y[i]


class Regression(L.LightningModule):
    """Logs two loss terms: the data term goes non-finite on an inf input, the L2 term stays finite."""

    def __init__(self, bad: tuple[int, ...] = ()):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.bad = bad

    def training_step(self, batch, batch_idx):
        x, y = batch
        mse = F.mse_loss(self.layer(x).squeeze(-1), y)
        l2 = 1e-3 * sum((p**2).sum() for p in self.parameters())
        self.log("train/mse", mse)
        self.log("train/l2", l2)
        return mse + l2

    def train_dataloader(self):
        return DataLoader(PoisonedRegression(bad=self.bad), batch_size=1, shuffle=False)

    def configure_optimizers(self):
        # weight decay and momentum: zeroed gradients would still move the weights; a skipped step must not
        return torch.optim.AdamW(self.parameters(), lr=0.05, weight_decay=0.1)


class OverflowingRegression(Regression):
    """Plain SGD whose learning rate becomes inf at optimizer step ``k``: that step's loss and gradients are finite,
    its update is not."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: float("inf") if step >= self.k else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class HugeButFinite(Regression):
    """A parameter the loss does not use holds 1e30: finite, but the 2-norm of the parameters overflows float32."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.full((4,), 1e30))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x).squeeze(-1), y)


class StepProbe(L.Callback):
    """Parameters and AdamW state just before and just after the optimizer step of batch ``k``."""

    def __init__(self, k: int):
        self.k = k
        self.before: dict | None = None
        self.after: dict | None = None

    @staticmethod
    def _snapshot(pl_module, trainer) -> dict:
        opt = trainer.optimizers[0]
        state = {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
                 for name, p in pl_module.named_parameters()}
        return {"params": {k: v.detach().clone() for k, v in pl_module.state_dict().items()}, "opt": state}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.k:
            self.before = self._snapshot(pl_module, trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == self.k:
            self.after = self._snapshot(pl_module, trainer)


def _trainer(tmp_path, *callbacks, **kwargs) -> tuple[L.Trainer, ModelCheckpoint]:
    # last.ckpt after every step, so that "the last good checkpoint" is the step right before the bad one
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0, every_n_train_steps=1)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, callbacks=[*callbacks, ckpt], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        log_every_n_steps=1, default_root_dir=tmp_path, **kwargs)
    return trainer, ckpt


def _all_finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if torch.is_tensor(v) and v.is_floating_point())


def test_stops_before_the_bad_step_naming_step_and_term(tmp_path):
    k = 5
    model = Regression(bad=(k,))
    trainer, _ = _trainer(tmp_path, NonFiniteGuard())
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit(model)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"at step {k} (epoch 0, batch {k})" in msg
    assert "train/mse=" in msg and "train/l2" not in msg  # the non-finite term is named, the finite one is not
    assert f"last good state: step {k}, saved as " in msg
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == k  # last good: written after step k-1, never after the bad one
    assert _all_finite(last["state_dict"])
    # the bad step was not applied: the weights in memory are still those of the last good checkpoint
    for name, value in model.state_dict().items():
        assert torch.equal(value, last["state_dict"][name]), name


def test_skips_one_bad_batch_without_touching_weights_or_optimizer_state(tmp_path):
    k = 3
    model = Regression(bad=(k,))
    guard, probe = NonFiniteGuard(max_skips=2), StepProbe(k)
    trainer, _ = _trainer(tmp_path, guard, probe)
    trainer.fit(model)
    assert trainer.global_step == N_BATCHES  # the run finished
    assert guard.skipped == 1
    assert trainer.callback_metrics["train/skipped_batches"] == 1
    assert _all_finite(model.state_dict())
    # the skipped step is a no-op for AdamW: same weights, same moments, same step count (no decay, no momentum)
    for name, value in probe.before["params"].items():
        assert torch.equal(value, probe.after["params"][name]), name
    for name, state in probe.before["opt"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(probe.after["opt"][name][key])), (name, key)
    opt = trainer.optimizers[0]
    assert all(int(opt.state[p]["step"]) == N_BATCHES - 1 for p in model.parameters())
    # the budget is saved with the checkpoint
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["callbacks"]["NonFiniteGuard"] == {"skipped": 1}


def test_raises_once_the_skip_budget_is_spent(tmp_path):
    model = Regression(bad=(2, 5))
    trainer, _ = _trainer(tmp_path, NonFiniteGuard(max_skips=1))
    with pytest.raises(NonFiniteLossError, match=r"at step 5 .*2 non-finite steps, max_skips=1"):
        trainer.fit(model)
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 5 and _all_finite(last["state_dict"])


def test_every_n_steps_leaves_unchecked_steps_alone(tmp_path):
    # step 3 is not checked: its NaN update is applied, and the next checked step (4) catches the damage
    model = Regression(bad=(3,))
    trainer, _ = _trainer(tmp_path, NonFiniteGuard(every_n_steps=2))
    with pytest.raises(NonFiniteLossError, match=r"at step 4 "):
        trainer.fit(model)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_stops_after_an_overflowing_update_before_last_ckpt_takes_it(tmp_path, accumulate):
    k = 2
    model = OverflowingRegression(k)
    trainer, _ = _trainer(tmp_path, NonFiniteGuard(), accumulate_grad_batches=accumulate)
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit(model)
    msg = str(err.value)
    batch = (k + 1) * accumulate - 1  # the micro-batch that ended with the optimizer step
    assert "\n" not in msg
    assert msg.startswith(f"non-finite parameters after the optimizer step at step {k} (epoch 0, batch {batch}): "
                          "the loss and gradient norm were finite")
    assert "first non-finite parameter: layer.weight (2 of 2 parameter tensors)" in msg
    assert f"last good state: step {k}, saved as " in msg
    assert not _all_finite(model.state_dict())  # the update was applied: the check runs after it
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == k and _all_finite(last["state_dict"])  # written after step k-1, not after k


def test_check_weights_false_lets_the_overflowed_weights_into_last_ckpt(tmp_path):
    # the old behaviour: the next step's loss is non-finite and stops the run, but last.ckpt has the bad weights
    k = 2
    trainer, _ = _trainer(tmp_path, NonFiniteGuard(check_weights=False))
    with pytest.raises(NonFiniteLossError, match=rf"^non-finite loss at step {k + 1} "):
        trainer.fit(OverflowingRegression(k))
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == k + 1 and not _all_finite(last["state_dict"])


def test_huge_finite_weights_are_not_taken_for_non_finite_ones(tmp_path):
    trainer, _ = _trainer(tmp_path, NonFiniteGuard())
    trainer.fit(HugeButFinite())
    assert trainer.global_step == N_BATCHES  # the run finished


def _real_cfg(model: str, lr: str, tmp_path, cache_dir, *overrides: str):
    """train.py's config of one family, with last.ckpt written after every optimizer step."""
    return compose_train([f"model={model}", "debug=fast", "logger=csv", "callbacks.rich_progress_bar=null",
                          "trainer.enable_progress_bar=false", "test=false", f"model.optimizer.lr={lr}",
                          "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=0",
                          "+callbacks.model_checkpoint.every_n_train_steps=1", *overrides], tmp_path, cache_dir)


# lr=1e10 makes step 1's loss (or gradient norm) non-finite in every family but the RNN: there it leaves the saturating
# GRU's loss finite (huge). The RNN's divergence is lr=inf, caught after the update (next test).
@pytest.mark.parametrize("model, message", [
    ("causal_lm", r"non-finite loss at step 1 \(epoch 0, batch 1\).*train/loss=nan"),
    pytest.param("transformer_mt", r"non-finite loss at step 1 \(epoch 0, batch 1\).*train/loss=nan",
                 marks=pytest.mark.slow),  # the 10-minute budget: the guard is the task base's, shared
    ("vit", r"non-finite (loss|gradient norm) at step 1 \(epoch 0, batch 1\)"),
    pytest.param("tts", r"non-finite loss at step 1 \(epoch 0, batch 1\).*train/mel_l1=nan", marks=pytest.mark.slow),
])
def test_real_model_with_a_huge_learning_rate_stops_at_the_first_non_finite_step(tmp_path, cache_dir, model, message):
    """train.py's config of each family: the diverging step is named and never applied; last.ckpt stays at step 1."""
    with pytest.raises(NonFiniteLossError, match=message):
        run(_real_cfg(model, "1e10", tmp_path, cache_dir))
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 1 and _all_finite(last["state_dict"])


def test_real_rnn_with_an_infinite_learning_rate_stops_after_the_first_update(tmp_path, cache_dir):
    """The RNN translation model with lr=inf: step 0's loss and gradients are finite, its update writes NaN into
    every weight. The run stops right after it, naming a parameter; no checkpoint with NaN is written."""
    with pytest.raises(NonFiniteLossError) as err:
        run(_real_cfg("seq2seq_attention", "inf", tmp_path, cache_dir))
    msg = str(err.value)
    assert msg.startswith("non-finite parameters after the optimizer step at step 0 (epoch 0, batch 0): the loss "
                          "and gradient norm were finite, the update itself overflowed")
    assert "first non-finite parameter: net." in msg
    assert "last good state: step 0, not saved (no checkpoint was written)" in msg
    # callbacks=default lists model_checkpoint first; Lightning still runs it after the guard, so it saved nothing
    ckpts = list((tmp_path / "checkpoints").glob("*.ckpt"))
    assert all(_all_finite(torch.load(f, weights_only=True)["state_dict"]) for f in ckpts)
    assert not ckpts  # the very first update went bad: nothing was worth saving


def test_real_rnn_without_the_weight_check_saves_nan_weights(tmp_path, cache_dir):
    """callbacks.nonfinite.check_weights=false: the old hole, the NaN weights reach last.ckpt before step 1 stops."""
    with pytest.raises(NonFiniteLossError, match=r"^non-finite loss at step 1 \(epoch 0, batch 1\)"):
        run(_real_cfg("seq2seq_attention", "inf", tmp_path, cache_dir, "callbacks.nonfinite.check_weights=false"))
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 1 and not _all_finite(last["state_dict"])


def test_arguments_are_checked():
    with pytest.raises(ValueError):
        NonFiniteGuard(max_skips=-1)
    with pytest.raises(ValueError):
        NonFiniteGuard(every_n_steps=0)
