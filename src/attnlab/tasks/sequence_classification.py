"""Sequence classification (claim E7: RNN vs CNN vs self-attention): cross-entropy, accuracy, accuracy per distance.

Batches are ``{"input_ids": (B, T), "label": (B,)}`` and, optionally, ``"distance": (B,)``: how far the evidence for
the label sits from the readout position (:mod:`attnlab.data.needle_recall`). With distances, the test's
:meth:`~SequenceClassificationTask.distance_record` holds the test accuracy at every distance, next to the encoder's
size, receptive field and sequential steps; :mod:`attnlab.callbacks.accuracy_by_distance` writes it to
``<run dir>/test_by_distance.json`` for the claim's analysis.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from ..plots.figures import layer_order, new_figure
from .classification import ClassificationTask
from .protocols import AttentionFigure, AttentionSample, DistanceRecord


class AccuracyByDistance(Metric):
    """Correct and total predictions per distance 0 … max_distance (summed over DDP ranks)."""

    full_state_update = False

    def __init__(self, max_distance: int):
        super().__init__()
        self.add_state("correct", torch.zeros(max_distance + 1, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(max_distance + 1, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, distance: Tensor) -> None:
        self.correct += torch.bincount(distance, weights=(preds == target).long(), minlength=len(self.correct)).long()
        self.total += torch.bincount(distance, minlength=len(self.total))

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.correct, self.total


class SequenceClassificationTask(ClassificationTask):
    """Wraps a :class:`~attnlab.models.sequence_classifier.SequenceClassifier` built from ``net``.

    Args:
        label_smoothing: cross-entropy label smoothing (training loss only).
    """

    input_key = "input_ids"

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.0):
        super().__init__(net, optimizer, scheduler, compile, label_smoothing)
        self.test_by_distance = AccuracyByDistance(self.net.max_len)
        self._distance_record: DistanceRecord | None = None
        self._sample: dict[str, Tensor] | None = None

    def update_eval_metrics(self, batch: dict, preds: Tensor, stage: str) -> None:
        if stage == "test" and "distance" in batch:
            self.test_by_distance.update(preds, batch["label"], batch["distance"])

    def on_test_epoch_end(self) -> None:
        correct, total = (t.cpu() for t in self.test_by_distance.compute())  # every rank: it syncs
        self.test_by_distance.reset()
        if int(total.sum()) == 0:
            self._distance_record = None
            return
        net = self.net
        seen = total.nonzero().flatten().tolist()
        self._distance_record = {
            "encoder": net.encoder_kind, "seq_len": net.max_len, "num_classes": net.num_classes,
            "params": net.num_params(non_embedding=False), "receptive_field": net.receptive_field,
            "sequential_steps": net.sequential_steps, "global_step": self.global_step,
            "distance": seen, "correct": [int(correct[d]) for d in seen], "total": [int(total[d]) for d in seen],
        }

    def distance_record(self) -> DistanceRecord | None:
        """The last test's accuracy per distance (None: no test yet, or a test set without distances)."""
        return self._distance_record

    # --- protocols used by callbacks (throughput, attention maps) ---------------------------------------------
    def tokens_in_batch(self, batch: dict) -> int:
        return batch["input_ids"].numel()

    def flops_per_token(self, seq_len: int) -> float:
        return self.net.flops_per_token(seq_len)

    def attention_sample(self, max_tokens: int) -> AttentionSample | None:
        """The datamodule's fixed validation sequence, or None (nothing to draw) for the RNN and CNN encoders."""
        if self.net.encoder_kind != "attention":
            return None
        dm = self.trainer.datamodule
        if self._sample is None:
            self._sample = dm.example() if hasattr(dm, "example") else None
            if self._sample is None:
                return None
        ids = self._sample["input_ids"]
        names = dm.token_names(ids[0]) if hasattr(dm, "token_names") else [str(int(i)) for i in ids[0]]
        return AttentionSample({"ids": ids}, names, names)

    def attention_forward(self, ids: Tensor) -> Tensor:
        return self.net(ids)

    def explorer_view(self, maps: dict[str, Tensor], sample: AttentionSample) -> dict:
        """The tokens page with the maps whole, as :meth:`render_attention` draws them: the answer is read at the
        last position and the needle may sit anywhere before it, so the callback's crop to the first
        ``max_tokens`` positions would drop the readout row always and the needle often (then the page would
        open on a filler)."""
        return {"whole": True}

    def render_attention(self, maps: dict[str, Tensor], sample: AttentionSample) -> list[AttentionFigure]:
        """One figure, ``query_attention.png``: for every layer (rows), each head's attention from the readout
        position (the last one, where the question is) over the sequence, the answer's position marked."""
        names = sorted(maps, key=layer_order)
        example = self._sample or {}
        answer = None
        if "distance" in example:
            answer = example["input_ids"].shape[1] - 1 - int(example["distance"][0])
        fig = new_figure(figsize=(9, 1.1 + 1.3 * len(names)))
        axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
        for ax, name in zip(axes, names):
            w = maps[name][0, :, -1, :].float().cpu()  # (H, T): the last query's row, every head
            ax.imshow(w.numpy(), aspect="auto", cmap="viridis", vmin=0, interpolation="nearest")
            ax.set_yticks(range(w.shape[0]), [f"h{h}" for h in range(w.shape[0])], fontsize=7)
            ax.set_title(name, fontsize=8)
            if answer is not None:
                ax.axvline(answer, color="red", lw=0.8, ls="--")
        axes[-1].set_xlabel("key position" + (" (red: the answer)" if answer is not None else ""))
        fig.suptitle(f"attention of the last position — epoch {self.current_epoch}, step {self.global_step}",
                     fontsize=9)
        fig.tight_layout()
        return [AttentionFigure("query_attention", fig)]
