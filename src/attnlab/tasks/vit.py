"""Image classification with a Vision Transformer (seed claim C12): cross-entropy, accuracy, a confusion matrix per
validation and test (drawn by :mod:`attnlab.callbacks.confusion_matrix`), and attention maps drawn over the image
(per-head attention of one patch, attention rollout; saved by :mod:`attnlab.callbacks.attention_maps`)."""

from __future__ import annotations

from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from ..analysis.rollout import attention_rollout, prediction_attribution
from ..plots.figures import layer_order
from .classification import ClassificationTask
from .protocols import AttentionFigure, AttentionSample, ConfusionResult


class ImageClassificationTask(ClassificationTask):
    """Wraps a :class:`~attnlab.models.vit.VisionTransformer` built from ``net`` (a config with ``_target_``).

    Args:
        label_smoothing: cross-entropy label smoothing (training loss only; val/test report the plain loss).
        attention_patch: the query patch whose attention is drawn, as a row-major index; None: the centre patch.
        confusion_matrix: track the confusion matrix of every validation and test (the confusion-matrix callback
            draws it: ``<run dir>/confusion_matrix/epochNNN.png``, ``test.png``).
    """

    input_key = "image"

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.0,
                 attention_patch: int | None = None, confusion_matrix: bool = True):
        super().__init__(net, optimizer, scheduler, compile, label_smoothing)
        n_patches = self.net.num_patches
        if attention_patch is not None and not 0 <= attention_patch < n_patches:
            raise ValueError(f"attention_patch={attention_patch} outside the {n_patches} patches "
                             f"(0..{n_patches - 1}, row-major)")
        grid = self.net.grid
        self.attention_patch = attention_patch if attention_patch is not None else (grid // 2) * grid + grid // 2
        self.track_confusion = confusion_matrix
        k = self.net.num_classes
        self.val_confusion, self.test_confusion = MulticlassConfusionMatrix(k), MulticlassConfusionMatrix(k)
        self._confusion: dict[str, ConfusionResult] = {}
        self._sample: tuple[Tensor, int] | None = None
        self._sample_pred: int | None = None

    def update_eval_metrics(self, batch: dict, preds: Tensor, stage: str) -> None:
        if self.track_confusion:
            getattr(self, f"{stage}_confusion").update(preds, batch["label"])

    def on_validation_epoch_end(self) -> None:
        self._confusion_end("val")

    def on_test_epoch_end(self) -> None:
        self._confusion_end("test")

    # --- confusion matrix -------------------------------------------------------------------------------------
    def _class_names(self) -> list[str] | None:
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return list(getattr(dm, "class_names", None) or []) or None

    def _confusion_end(self, stage: str) -> None:
        metric: MulticlassConfusionMatrix = getattr(self, f"{stage}_confusion")
        if not self.track_confusion or metric.update_count == 0:
            self._confusion.pop(stage, None)
            return
        self._confusion[stage] = ConfusionResult(metric.compute().cpu(), self._class_names())  # every rank: syncs
        metric.reset()

    def confusion_result(self, stage: str) -> ConfusionResult | None:
        """The confusion matrix of the stage's last epoch ("val" or "test"), None when not tracked."""
        return self._confusion.get(stage)

    # --- protocols used by callbacks (throughput, attention maps) ---------------------------------------------
    def tokens_in_batch(self, batch: dict) -> int:
        """Tokens = the transformer's sequence positions: the patches (+ the class token) of every image."""
        return batch["image"].shape[0] * self.net.num_tokens

    def flops_per_token(self) -> float:
        return self.net.flops_per_token()

    def _example(self) -> tuple[Tensor, int]:
        """The datamodule's fixed validation image and its label (``example_image()``), cached on first use."""
        if self._sample is None:
            self._sample = self.trainer.datamodule.example_image()
        return self._sample

    def attention_sample(self, max_tokens: int) -> AttentionSample:
        """The fixed validation image, drawn whole (every patch)."""
        image = self._example()[0]
        grid = self.net.grid
        labels = (["cls"] if self.net.pool == "cls" else []) + [f"r{i // grid}c{i % grid}" for i in
                                                               range(self.net.num_patches)]
        return AttentionSample({"images": image}, labels, labels)

    def attention_forward(self, images: Tensor) -> Tensor:
        logits = self.net(images)
        self._sample_pred = int(logits[0].argmax())  # shown in the rollout's title
        return logits

    def explorer_view(self, maps: dict[str, Tensor], sample: AttentionSample) -> dict:
        """The explorer page's image view: the sample image, its patch grid and the rollout (attnlab.explorer)."""
        from ..plots.views import image_view

        image, label = self._example()
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        display = dm.denormalize(image[0].cpu()) if hasattr(dm, "denormalize") else image[0]
        classes = self._class_names()
        name_of = lambda k: classes[k] if classes and 0 <= k < len(classes) else str(k)  # noqa: E731
        caption = f"label {name_of(int(label))}" + (
            f", predicted {name_of(self._sample_pred)}" if self._sample_pred is not None else "")
        return image_view(maps, display, self.net.grid, self.net.prefix, self.net.pool, caption,
                          patch_px=self.net.patch_size, patch=self.attention_patch)

    def render_attention(self, maps: dict[str, Tensor], sample: AttentionSample) -> list[AttentionFigure]:
        """Draw the captured attention over the sample image (called by AttentionMapCallback, which saves them).

        One figure per layer (``<module name>.png``): for every head, the attention of the query patch
        ``attention_patch`` over the patch grid. And ``rollout.png``: attention rollout through all layers, read as
        the prediction's share of each patch (mean pooling: the average over the patch rows; class token: its row).
        """
        from ..plots.vision import patch_attention_figure, rollout_figure

        image, label = self._example()
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        display = dm.denormalize(image[0].cpu()) if hasattr(dm, "denormalize") else image[0]
        names = sorted(maps, key=layer_order)
        grid, prefix, q = self.net.grid, self.net.prefix, self.attention_patch
        row, col = divmod(q, grid)
        step = f"epoch {self.current_epoch}, step {self.global_step}"
        out: list[AttentionFigure] = []
        for name in names:
            w = maps[name][0].float()  # (H, T, T), first sample
            patch_w = w[:, prefix + q, prefix:].reshape(-1, grid, grid)
            fig = patch_attention_figure(
                display, patch_w, (row, col),
                title=f"{name}: attention of patch ({row}, {col}) — {step}")
            out.append(AttentionFigure(name, fig))
        rollout = attention_rollout([maps[n][:1] for n in names])  # (1, T, T)
        share = prediction_attribution(rollout, self.net.pool, prefix)[0].reshape(grid, grid)
        classes = self._class_names()
        name_of = lambda k: classes[k] if classes and 0 <= k < len(classes) else str(k)  # noqa: E731
        predicted = f", predicted {name_of(self._sample_pred)}" if self._sample_pred is not None else ""
        fig = rollout_figure(display, share, title=f"attention rollout ({self.net.pool} pooling) — label "
                                                   f"{name_of(label)}{predicted} — {step}")
        out.append(AttentionFigure("rollout", fig))
        return out
