"""Image classification with a Vision Transformer (seed claim C12): cross-entropy, accuracy, a confusion matrix per
validation, and attention maps drawn over the image (per-head attention of one patch, attention rollout)."""

from __future__ import annotations

import re
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from ..analysis.rollout import attention_rollout, prediction_attribution
from ..utils.plotting import save_figure
from .classification import ClassificationTask


def _layer_order(name: str) -> tuple:
    """Sort key that puts blocks.10 after blocks.2."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


class ImageClassificationTask(ClassificationTask):
    """Wraps a :class:`~attnlab.models.vit.VisionTransformer` built from ``net`` (a config with ``_target_``).

    Args:
        label_smoothing: cross-entropy label smoothing (training loss only; val/test report the plain loss).
        attention_patch: the query patch whose attention is drawn, as a row-major index; None: the centre patch.
        confusion_matrix: draw ``<run dir>/confusion_matrix/epochNNN.png`` after every validation (and ``test.png``).
        attention_tokens: ignored; ``debug=fast`` sets it for every model (the language model's sample length).
    """

    input_key = "image"

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.0,
                 attention_patch: int | None = None, confusion_matrix: bool = True,
                 attention_tokens: int | None = None):
        super().__init__(net, optimizer, scheduler, compile, label_smoothing)
        n_patches = self.net.num_patches
        if attention_patch is not None and not 0 <= attention_patch < n_patches:
            raise ValueError(f"attention_patch={attention_patch} outside the {n_patches} patches "
                             f"(0..{n_patches - 1}, row-major)")
        grid = self.net.grid
        self.attention_patch = attention_patch if attention_patch is not None else (grid // 2) * grid + grid // 2
        self.draw_confusion = confusion_matrix
        k = self.net.num_classes
        self.val_confusion, self.test_confusion = MulticlassConfusionMatrix(k), MulticlassConfusionMatrix(k)
        self.confusion_paths: list[Path] = []
        self._sample: tuple[Tensor, int] | None = None
        self._sample_pred: int | None = None

    def _eval_step(self, batch: dict, stage: str) -> Tensor:
        preds = super()._eval_step(batch, stage)
        getattr(self, f"{stage}_confusion").update(preds, batch["label"])
        return preds

    def on_validation_epoch_end(self) -> None:
        self._confusion_end(self.val_confusion, f"epoch{self.current_epoch:03d}", "confusion_matrix/val",
                            f"validation — epoch {self.current_epoch}, step {self.global_step}")

    def on_test_epoch_end(self) -> None:
        self._confusion_end(self.test_confusion, "test", "confusion_matrix/test",
                            f"test — weights of step {self.global_step}")

    # --- confusion matrix -------------------------------------------------------------------------------------
    def _class_names(self) -> list[str] | None:
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return list(getattr(dm, "class_names", None) or []) or None

    def _confusion_end(self, metric: MulticlassConfusionMatrix, stem: str, key: str, title: str) -> None:
        cm = metric.compute()  # every rank: it syncs across processes
        metric.reset()
        trainer = self._trainer
        if trainer is None or not self.draw_confusion or trainer.sanity_checking or not trainer.is_global_zero:
            return
        from ..utils.vision_plots import confusion_matrix_figure

        fig = confusion_matrix_figure(cm, self._class_names(), title=title)
        path = save_figure(fig, Path(trainer.default_root_dir) / "confusion_matrix" / f"{stem}.png")
        del fig
        self.confusion_paths.append(path)
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.log_image(key=key, images=[str(path)], step=trainer.global_step,
                             caption=[f"epoch {self.current_epoch}, step {self.global_step}"])

    # --- protocols used by callbacks (throughput, attention maps) ---------------------------------------------
    def tokens_in_batch(self, batch: dict) -> int:
        """Tokens = the transformer's sequence positions: the patches (+ the class token) of every image."""
        return batch["image"].shape[0] * self.net.num_tokens

    def flops_per_token(self) -> float:
        return self.net.flops_per_token()

    def attention_sample(self):
        """The datamodule's fixed validation image (``example_image()``), cached on first use."""
        if self._sample is None:
            self._sample = self.trainer.datamodule.example_image()
        image = self._sample[0]
        grid = self.net.grid
        labels = (["cls"] if self.net.pool == "cls" else []) + [f"r{i // grid}c{i % grid}" for i in
                                                               range(self.net.num_patches)]
        return {"images": image}, labels, labels

    def attention_forward(self, images: Tensor) -> Tensor:
        logits = self.net(images)
        self._sample_pred = int(logits[0].argmax())  # shown in the rollout's title
        return logits

    def render_attention(self, maps: dict[str, Tensor], out_dir: Path) -> list[tuple[str, Path]]:
        """Draw the captured attention over the sample image (called by AttentionMapCallback).

        One figure per layer (``<module name>.png``): for every head, the attention of the query patch
        ``attention_patch`` over the patch grid. And ``rollout.png``: attention rollout through all layers, read as
        the prediction's share of each patch (mean pooling: the average over the patch rows; class token: its row).
        """
        from ..utils.vision_plots import patch_attention_figure, rollout_figure

        if self._sample is None:
            self.attention_sample()
        image, label = self._sample
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        display = dm.denormalize(image[0].cpu()) if hasattr(dm, "denormalize") else image[0]
        names = sorted(maps, key=_layer_order)
        grid, prefix, q = self.net.grid, self.net.prefix, self.attention_patch
        row, col = divmod(q, grid)
        step = f"epoch {self.current_epoch}, step {self.global_step}"
        out: list[tuple[str, Path]] = []
        for name in names:
            w = maps[name][0].float()  # (H, T, T), first sample
            patch_w = w[:, prefix + q, prefix:].reshape(-1, grid, grid)
            fig = patch_attention_figure(
                display, patch_w, (row, col),
                title=f"{name}: attention of patch ({row}, {col}) — {step}")
            safe = re.sub(r"[^\w.\-]+", "_", name) or "attention"
            out.append((name, save_figure(fig, Path(out_dir) / f"{safe}.png")))
            del fig
        rollout = attention_rollout([maps[n][:1] for n in names])  # (1, T, T)
        share = prediction_attribution(rollout, self.net.pool, prefix)[0].reshape(grid, grid)
        classes = self._class_names()
        name_of = lambda k: classes[k] if classes and 0 <= k < len(classes) else str(k)  # noqa: E731
        predicted = f", predicted {name_of(self._sample_pred)}" if self._sample_pred is not None else ""
        fig = rollout_figure(display, share, title=f"attention rollout ({self.net.pool} pooling) — label "
                                                   f"{name_of(label)}{predicted} — {step}")
        out.append(("rollout", save_figure(fig, Path(out_dir) / "rollout.png")))
        del fig
        return out
