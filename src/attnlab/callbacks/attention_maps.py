"""Attention maps of one fixed validation sample, drawn every N validation epochs.

Protocol with the LightningModule
---------------------------------
The module provides (:class:`~attnlab.tasks.protocols.AttentionSource`):

``attention_sample(self, max_tokens: int) -> AttentionSample | None``
    ONE fixed sample (batch size 1) as an :class:`~attnlab.tasks.protocols.AttentionSample`: the keyword
    arguments of ``attention_forward``, the names of the rows (queries) and columns (keys) of a map, and, for
    models whose attention modules attend over different sequences (an encoder-decoder's encoder, decoder and
    cross-attention), names per module-name prefix. It should be the same sample every time (pick it once and
    cache it) so that maps compare across epochs; tensors may be on any device (the callback moves them). Names
    whose count does not match a map's size are left out of that map. ``max_tokens`` is this callback's crop; a
    task whose sample length is free (the language model's text) makes its sample that long. ``None``: this
    module has nothing to draw (an RNN or CNN variant of a family); the callback then draws nothing, silently.

``attention_forward(self, **inputs)``
    Runs the model's forward pass on the sample (the result is ignored).

``render_attention(self, maps: dict[str, Tensor], sample: AttentionSample) -> list[AttentionFigure]``
    Optional (:class:`~attnlab.tasks.protocols.RendersAttention`): draws the maps itself instead of the token
    heatmaps (images: attention over the picture, rollout). It receives every captured map (module name ->
    weights (B, H, Tq, Tk), batch of the sample; ``max_layers``, ``max_heads`` and ``max_tokens`` are not
    applied) and returns ``(key, figure)`` pairs; the callback saves each as ``<key>.png`` and logs it to W&B
    under ``attention/<key>``.

What the callback does
----------------------
In ``on_validation_epoch_end``, on global rank zero only, never during the sanity check, and only every
``every_n_epochs`` epochs, it puts the module in eval mode and runs ``attention_forward`` under ``torch.no_grad``
(and the trainer's precision context) inside :func:`attnlab.modules.attention.capture_attention`, which turns on
the explicit path of every :class:`~attnlab.modules.attention.MultiHeadAttention` for that one pass and restores
``return_weights`` afterwards, so training steps keep the fused SDPA path. For each captured module (sorted by
name, at most ``max_layers``) it draws the first sample's heads (at most ``max_heads``, at most ``max_tokens``
queries and keys) with :func:`attnlab.plots.figures.attention_heatmap_figure`, writes

    ``<dirpath or trainer.default_root_dir/dirname>/epoch{E:03d}-step{S:06d}/<module_name>.png``

and logs it to every :class:`~lightning.pytorch.loggers.WandbLogger` of the trainer under
``attention/<module_name>`` at ``trainer.global_step``. The train/eval mode of every submodule is restored.
``last_paths`` holds the files written by the last call.

The explorer
------------
With ``explorer`` on (the default), the same captured maps also go, 8-bit quantized, into an
:class:`~attnlab.explorer.ExplorerRecord` that holds every logged epoch (the last ``explorer_epochs``); after each
capture the callback rewrites ``<run dir>/attention/explorer.html`` (one self-contained page, docs/explorer.md),
and at the end of fit logs it to every W&B logger as ``attention/explorer`` (``wandb.Html(..., inject=False)``).
A task with ``explorer_view(maps, sample)`` (:class:`~attnlab.tasks.protocols.ExplorerViewSource`) adds its
family's view (the ViT's image and rollout, the TTS guide); a task with ``listening_sample()``
(:class:`~attnlab.tasks.protocols.ListeningSampleSource`, the TTS) adds each logged epoch's synthesized audio, 8-bit
mu-law at 16 kHz. Cost: quantizing a few maps and writing a file of tens to hundreds of kB at the interval, no
extra forward pass; for the TTS the listening sample, which the task computes once per step and shares with the
tts_samples callback (with that callback off, one free-running synthesis and Griffin-Lim here, unless
``explorer_audio_epochs=0``).

The extra forward runs on rank zero only, on the unwrapped LightningModule, so it works with DDP but not with
strategies that shard parameters across ranks (FSDP, DeepSpeed stage 3: the other ranks would not join the
gathers). Cost: one batch-1 forward plus roughly 0.2–1.5 s of matplotlib per layer (more heads/tokens: slower).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import lightning as L
import torch
from lightning.pytorch.utilities import move_data_to_device, rank_zero_warn

from ..modules.attention import capture_attention
from ..tasks.protocols import (AttentionSample, AttentionSource, ExplorerViewSource, ListeningSampleSource,
                               RendersAttention)
from ..core.errors import at_least
from ..plots.figures import attention_heatmap_figure, file_stem, save_figure
from .media import log_image, run_dir, wandb_loggers

__all__ = ["AttentionMapCallback"]


class AttentionMapCallback(L.Callback):
    """Draw and log the attention maps of a fixed validation sample (see the module docstring for the protocol).

    Args:
        every_n_epochs: draw after the validation of every N-th epoch (epochs 0-based: N-1, 2N-1, ...).
        max_tokens: keep the first ``max_tokens`` queries and keys of each map (and of the labels); the language
            model's sample is this long.
        max_layers: draw at most this many attention modules (sorted by name); None: all.
        max_heads: at most this many heads per figure.
        dirname: folder under ``trainer.default_root_dir`` (the Hydra run dir in this repo's train config).
        dirpath: write here instead of ``trainer.default_root_dir/dirname``.
        explorer: also keep the maps for the explorer page and write/log it (module docstring).
        explorer_epochs: the page keeps the last N logged epochs (None: all).
        explorer_audio_epochs: a speech page keeps the audio of the last N logged epochs (None: all): up to ~90 kB
            each, the page's largest part for a long run; older epochs keep their maps. 0: no audio (nothing
            synthesized for the page).
        explorer_path: the page's file (None: ``trainer.default_root_dir/attention/explorer.html``).
        health: log the attention-health scalars of the same maps (:mod:`attnlab.analysis.attention_health`).
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        max_tokens: int = 48,
        max_layers: int | None = None,
        max_heads: int = 8,
        dirname: str = "attention_maps",
        dirpath: str | Path | None = None,
        explorer: bool = True,
        explorer_epochs: int | None = None,
        explorer_audio_epochs: int | None = 8,
        explorer_path: str | Path | None = None,
        health: bool = True,
    ):
        super().__init__()
        at_least("every_n_epochs", every_n_epochs, 1)
        self.every_n_epochs = every_n_epochs
        self.max_tokens = max_tokens
        self.max_layers = max_layers
        self.max_heads = max_heads
        self.dirname = dirname
        self.dirpath = dirpath
        self.last_paths: list[Path] = []
        self._warned: set[str] = set()
        self.explorer = explorer
        self.explorer_epochs = explorer_epochs
        self.explorer_audio_epochs = explorer_audio_epochs
        self.explorer_path = explorer_path
        self.health = health
        self.last_health: dict[str, float] = {}
        self.record = None  # ExplorerRecord once the first maps are captured
        self.explorer_file: Path | None = None

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
        root = Path(self.dirpath) if self.dirpath is not None else run_dir(trainer) / self.dirname
        return root / f"epoch{trainer.current_epoch:03d}-step{trainer.global_step:06d}"

    def _fit(self, labels: Sequence[str] | None, n: int) -> list[str] | None:
        if labels is None:
            return None
        labels = list(labels)[: self.max_tokens]
        return labels if len(labels) == n else None

    # ------------------------------------------------------------------ hook
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._should_run(trainer):
            return
        if not isinstance(pl_module, AttentionSource):
            self._warn_once(
                "no_sample",
                f"AttentionMapCallback: {type(pl_module).__name__} has no `attention_sample()` and "
                "`attention_forward()`; no attention maps "
                "will be drawn (see attnlab.callbacks.attention_maps for the protocol).",
            )
            return
        self.last_paths = self.render(trainer, pl_module)

    def render(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Path]:
        """Run the sample, draw, save and log the maps now; returns the written paths."""
        sample = pl_module.attention_sample(self.max_tokens)
        if sample is None:  # the module says it has no attention to draw
            return []
        if not isinstance(sample, AttentionSample):
            raise TypeError(f"{type(pl_module).__name__}.attention_sample() must return an AttentionSample or None, "
                            f"got {type(sample).__name__}")
        inputs = move_data_to_device(sample.inputs, pl_module.device)

        modes = {m: m.training for m in pl_module.modules()}
        pl_module.eval()
        try:
            with torch.no_grad(), trainer.precision_plugin.forward_context(), capture_attention(pl_module) as maps:
                pl_module.attention_forward(**inputs)
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

        view = pl_module.explorer_view(dict(maps), sample) if (
            (self.explorer or self.health) and isinstance(pl_module, ExplorerViewSource)) else None
        if self.health:
            self._log_health(trainer, maps, view or {})
        if self.explorer:
            self._explore(trainer, maps, sample, view)
        out_dir = self._out_dir(trainer)
        if isinstance(pl_module, RendersAttention):
            paths = []
            for key, fig in pl_module.render_attention(dict(maps), sample):
                paths.append(save_figure(fig, out_dir / f"{file_stem(key)}.png"))
                del fig
                log_image(trainer, f"attention/{key}", paths[-1])
            return paths

        names = sorted(maps)
        if self.max_layers is not None:
            names = names[: self.max_layers]
        paths: list[Path] = []
        for name in names:
            w = maps[name][0, :, : self.max_tokens, : self.max_tokens]  # first sample: (H, Tq, Tk)
            yl, xl = sample.labels_for(name)
            fig = attention_heatmap_figure(
                w,
                x_labels=self._fit(xl, w.shape[-1]),
                y_labels=self._fit(yl, w.shape[-2]),
                title=f"{name} — epoch {trainer.current_epoch}, step {trainer.global_step}",
                max_heads=self.max_heads,
            )
            path = save_figure(fig, out_dir / f"{file_stem(name)}.png")
            del fig
            paths.append(path)
            log_image(trainer, f"attention/{name}", path)
        return paths

    # ------------------------------------------------------------------ explorer
    def _log_health(self, trainer: L.Trainer, maps, view: dict) -> None:
        """The attention-health scalars of this epoch's maps to every logger, at the trainer's step."""
        from ..analysis.attention_health import attention_health

        self.last_health = attention_health(maps, grid=view.get("grid"), prefix=view.get("prefix", 0),
                                            patch_px=view.get("patch_px", 1.0))
        for lg in trainer.loggers:
            lg.log_metrics(self.last_health, step=trainer.global_step)

    def _explore(self, trainer: L.Trainer, maps, sample: AttentionSample, view: dict | None) -> None:
        """Add this epoch's maps to the record and rewrite the page (the maps are already captured: no forward)."""
        from ..explorer import ExplorerRecord, write_page

        pl_module = trainer.lightning_module
        path = Path(self.explorer_path) if self.explorer_path is not None else \
            run_dir(trainer) / "attention" / "explorer.html"
        if self.record is None:  # a resumed run (the same run folder) keeps the epochs its page already holds
            self.record = ExplorerRecord.from_page(path, trainer.current_epoch,
                                                   title=f"{type(pl_module).__name__} · {run_dir(trainer).name}",
                                                   max_tokens=self.max_tokens, max_epochs=self.explorer_epochs,
                                                   max_audio_epochs=self.explorer_audio_epochs)
        if isinstance(pl_module, ListeningSampleSource) and self.explorer_audio_epochs != 0:  # the TTS's audio
            view = {**(view or {}), "epoch": {**((view or {}).get("epoch") or {}), **self._audio(pl_module)}}
        self.record.add(trainer.current_epoch, trainer.global_step, maps, sample, view)
        self.explorer_file = write_page(self.record.payload(), path)

    @staticmethod
    def _audio(pl_module: ListeningSampleSource) -> dict[str, str]:
        """The listening sample's audio, compact (8-bit mu-law, 16 kHz). The task computes the sample once per
        step, so with the tts_samples callback on (the default) this reuses its synthesis: only the encoding is
        added here."""
        from ..plots.views import audio_note

        ls = pl_module.listening_sample()
        return audio_note(ls.wave, ls.sample_rate, f"{ls.text!r}: free-running, Griffin-Lim")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the page (every epoch it holds) once: W&B keeps one file, not one per epoch."""
        if not trainer.is_global_zero or self.explorer_file is None or not self.explorer_file.is_file():
            return
        loggers = wandb_loggers(trainer)
        if not loggers:
            return
        import wandb

        from ..explorer.page import EXPLORER_KEY

        html = self.explorer_file.read_text(encoding="utf-8")
        for lg in loggers:
            lg.log_metrics({EXPLORER_KEY: wandb.Html(html, inject=False)}, step=trainer.global_step)
