"""Attention maps of one fixed validation sample, drawn every N validation epochs.

Protocol with the LightningModule
---------------------------------
The module provides two methods:

``attention_sample(self) -> tuple[dict, list[str], list[str]]``
    ``(batch_kwargs, query_labels, key_labels)`` for ONE fixed validation sample (batch size 1). It should return
    the same sample every time (pick it once, e.g. the first validation example, and cache it) so that the maps
    are comparable across epochs. Tensors in ``batch_kwargs`` may be on any device; the callback moves them to
    the module's device. ``query_labels`` name the rows of each map (the tokens that attend), ``key_labels``
    the columns (the tokens attended to).

    For models whose attention modules do not all share the same queries/keys (an encoder-decoder's encoder
    self-attention, decoder self-attention and cross-attention), it may instead return a dict::

        {"inputs": batch_kwargs, "y_labels": query_labels, "x_labels": key_labels,
         "labels": {"encoder.": (src_tokens, src_tokens), "decoder.": (tgt_tokens, tgt_tokens),
                    "decoder.layers.0.cross_attn": (tgt_tokens, src_tokens), ...}}

    where ``labels`` maps a prefix of the attention module's name (as in ``pl_module.named_modules()``) to
    ``(query_labels, key_labels)``; the longest matching prefix wins, ``y_labels``/``x_labels`` are the default.
    Labels whose count does not match a map's size are left out of that map.

    It may return ``None``: this module has no attention to draw (a model family whose RNN or CNN variant shares
    the attention variant's task); the callback then draws nothing, silently.

``attention_forward(self, **batch_kwargs)``
    Runs the model's forward pass on the sample (the result is ignored). Optional: without it the callback
    calls ``pl_module(**batch_kwargs)``.

``render_attention(self, maps: dict[str, Tensor], out_dir: Path) -> list[tuple[str, Path]]``
    Optional: draws the maps itself instead of the token heatmaps (images: attention over the picture, rollout).
    It receives every captured map (module name -> weights (B, H, Tq, Tk), batch of the sample; ``max_layers``,
    ``max_heads`` and ``max_tokens`` are not applied) and the folder to write into, and returns ``(key, png path)``
    pairs; the callback logs each PNG to W&B under ``attention/<key>`` and returns the paths.

What the callback does
----------------------
In ``on_validation_epoch_end``, on global rank zero only, never during the sanity check, and only every
``every_n_epochs`` epochs, it puts the module in eval mode and runs ``attention_forward`` under ``torch.no_grad``
(and the trainer's precision context) inside :func:`attnlab.modules.attention.capture_attention`, which turns on
the explicit path of every :class:`~attnlab.modules.attention.MultiHeadAttention` for that one pass and restores
``return_weights`` afterwards, so training steps keep the fused SDPA path. For each captured module (sorted by
name, at most ``max_layers``) it draws the first sample's heads (at most ``max_heads``, at most ``max_tokens``
queries and keys) with :func:`attnlab.utils.plotting.attention_heatmap_figure`, writes

    ``<dirpath or trainer.default_root_dir/dirname>/epoch{E:03d}-step{S:06d}/<module_name>.png``

and logs it to every :class:`~lightning.pytorch.loggers.WandbLogger` of the trainer under
``attention/<module_name>`` at ``trainer.global_step``. The train/eval mode of every submodule is restored.
``last_paths`` holds the files written by the last call.

The extra forward runs on rank zero only, on the unwrapped LightningModule, so it works with DDP but not with
strategies that shard parameters across ranks (FSDP, DeepSpeed stage 3: the other ranks would not join the
gathers). Cost: one batch-1 forward plus roughly 0.2–1.5 s of matplotlib per layer (more heads/tokens: slower).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import move_data_to_device, rank_zero_warn

from ..modules.attention import capture_attention
from ..utils.plotting import attention_heatmap_figure, save_figure

__all__ = ["AttentionMapCallback"]


class AttentionMapCallback(L.Callback):
    """Draw and log the attention maps of a fixed validation sample (see the module docstring for the protocol).

    Args:
        every_n_epochs: draw after the validation of every N-th epoch (epochs 0-based: N-1, 2N-1, ...).
        max_tokens: keep the first ``max_tokens`` queries and keys of each map (and of the labels).
        max_layers: draw at most this many attention modules (sorted by name); None: all.
        max_heads: at most this many heads per figure.
        dirname: folder under ``trainer.default_root_dir`` (the Hydra run dir in this repo's train config).
        dirpath: write here instead of ``trainer.default_root_dir/dirname``.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        max_tokens: int = 48,
        max_layers: int | None = None,
        max_heads: int = 8,
        dirname: str = "attention_maps",
        dirpath: str | Path | None = None,
    ):
        super().__init__()
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.every_n_epochs = every_n_epochs
        self.max_tokens = max_tokens
        self.max_layers = max_layers
        self.max_heads = max_heads
        self.dirname = dirname
        self.dirpath = dirpath
        self.last_paths: list[Path] = []
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _should_run(self, trainer: L.Trainer) -> bool:
        return (
            trainer.is_global_zero
            and not trainer.sanity_checking
            and (trainer.current_epoch + 1) % self.every_n_epochs == 0
        )

    def _out_dir(self, trainer: L.Trainer) -> Path:
        root = Path(self.dirpath) if self.dirpath is not None else Path(trainer.default_root_dir) / self.dirname
        return root / f"epoch{trainer.current_epoch:03d}-step{trainer.global_step:06d}"

    @staticmethod
    def _parse_sample(sample: Any) -> tuple[dict, Sequence[str] | None, Sequence[str] | None, dict]:
        if isinstance(sample, dict) and "inputs" in sample:
            return sample["inputs"], sample.get("y_labels"), sample.get("x_labels"), dict(sample.get("labels") or {})
        if isinstance(sample, (tuple, list)) and len(sample) == 3:
            inputs, q_labels, k_labels = sample
            return inputs, q_labels, k_labels, {}
        raise TypeError(
            "attention_sample() must return (batch_kwargs, query_labels, key_labels) or a dict with 'inputs'; "
            f"got {type(sample).__name__}"
        )

    @staticmethod
    def _labels_for(name: str, default: tuple, per_prefix: dict) -> tuple:
        matches = [p for p in per_prefix if name.startswith(p)]
        return tuple(per_prefix[max(matches, key=len)]) if matches else default

    def _fit(self, labels: Sequence[str] | None, n: int) -> list[str] | None:
        if labels is None:
            return None
        labels = list(labels)[: self.max_tokens]
        return labels if len(labels) == n else None

    # ------------------------------------------------------------------ hook
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._should_run(trainer):
            return
        if not callable(getattr(pl_module, "attention_sample", None)):
            self._warn_once(
                "no_sample",
                f"AttentionMapCallback: {type(pl_module).__name__} has no `attention_sample()`; no attention maps "
                "will be drawn (see attnlab.callbacks.attention_maps for the protocol).",
            )
            return
        self.last_paths = self.render(trainer, pl_module)

    def render(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Path]:
        """Run the sample, draw, save and log the maps now; returns the written paths."""
        sample = pl_module.attention_sample()
        if sample is None:  # the module says it has no attention to draw
            return []
        inputs, q_labels, k_labels, per_prefix = self._parse_sample(sample)
        inputs = move_data_to_device(inputs, pl_module.device)
        forward = getattr(pl_module, "attention_forward", None) or pl_module

        modes = {m: m.training for m in pl_module.modules()}
        pl_module.eval()
        try:
            with torch.no_grad(), trainer.precision_plugin.forward_context(), capture_attention(pl_module) as maps:
                forward(**inputs)
        finally:
            for m, mode in modes.items():
                m.training = mode

        if not maps:
            self._warn_once(
                "no_maps",
                "AttentionMapCallback: the forward pass went through no attnlab MultiHeadAttention module; "
                "nothing to draw.",
            )
            return []

        out_dir = self._out_dir(trainer)
        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        custom = getattr(pl_module, "render_attention", None)
        if callable(custom):
            return self._log_custom(trainer, custom(dict(maps), out_dir), wandb_loggers)

        names = sorted(maps)
        if self.max_layers is not None:
            names = names[: self.max_layers]
        paths: list[Path] = []
        for name in names:
            w = maps[name][0, :, : self.max_tokens, : self.max_tokens]  # first sample: (H, Tq, Tk)
            yl, xl = self._labels_for(name, (q_labels, k_labels), per_prefix)
            fig = attention_heatmap_figure(
                w,
                x_labels=self._fit(xl, w.shape[-1]),
                y_labels=self._fit(yl, w.shape[-2]),
                title=f"{name} — epoch {trainer.current_epoch}, step {trainer.global_step}",
                max_heads=self.max_heads,
            )
            safe = re.sub(r"[^\w.\-]+", "_", name) or "attention"
            path = save_figure(fig, out_dir / f"{safe}.png")
            del fig
            paths.append(path)
            _log_image(trainer, wandb_loggers, f"attention/{name}", path)
        return paths

    @staticmethod
    def _log_custom(trainer: L.Trainer, rendered, wandb_loggers: list) -> list[Path]:
        """Log the ``(key, png path)`` pairs a module's ``render_attention`` returned; return the paths."""
        paths: list[Path] = []
        for key, path in rendered or []:
            path = Path(path)
            paths.append(path)
            _log_image(trainer, wandb_loggers, f"attention/{key}", path)
        return paths


def _log_image(trainer: L.Trainer, wandb_loggers: list, key: str, path: Path) -> None:
    for lg in wandb_loggers:
        lg.log_image(key=key, images=[str(path)], step=trainer.global_step,
                     caption=[f"epoch {trainer.current_epoch}, step {trainer.global_step}"])
