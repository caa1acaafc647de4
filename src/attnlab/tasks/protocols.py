"""The typed contracts between tasks and what surrounds them.

A task computes losses and metrics and hands results to callbacks; it writes no files and logs no media. Each
callback that writes something (``attnlab.callbacks``) asks the task for one value through a small protocol below
and does nothing for a task without it, so a callback can be on for every model (conf/callbacks/default.yaml).

* :class:`StepOutput`: what a task's :meth:`~attnlab.tasks.base.Task.step` returns to the base task's one
  template step (which adds and logs the MoE terms and logs the metrics).
* :class:`AttentionSample`, :class:`AttentionFigure`: attention maps (:mod:`attnlab.callbacks.attention_maps`), and
  :class:`ExplorerViewSource`: what a family adds to the explorer page (:mod:`attnlab.explorer`).
* :class:`TranslationRow`: the translation table (:mod:`attnlab.callbacks.translation_table`).
* :class:`ListeningSample`: TTS mels, alignment and audio (:mod:`attnlab.callbacks.tts_samples`).
* :class:`ConfusionResult`: a confusion matrix (:mod:`attnlab.callbacks.confusion_matrix`).
* :class:`DistanceRecord`: test accuracy by distance (:mod:`attnlab.callbacks.accuracy_by_distance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Labels = Sequence[str] | None


# --- the template step ---------------------------------------------------------------------------------------------
@dataclass
class StepOutput:
    """One training/validation/test batch as a task computed it.

    Args:
        loss: the task's objective for this batch (training: what is optimized, before the MoE terms, which the
            base task adds).
        metrics: logged as ``<stage>/<name>`` (tensors, floats or torchmetrics objects, which Lightning reduces
            per epoch); per step in training, per epoch in val/test.
        prog_bar: names in ``metrics`` shown in the progress bar.
        batch_size: weight of this batch in the epoch means (None: Lightning infers it from the batch).
    """

    loss: Tensor
    metrics: dict[str, Any] = field(default_factory=dict)
    prog_bar: tuple[str, ...] = ("loss",)
    batch_size: int | None = None


# --- attention maps --------------------------------------------------------------------------------------------------
@dataclass
class AttentionSample:
    """One fixed example (batch of one) whose attention maps are drawn, with the names of its positions.

    Args:
        inputs: keyword arguments of the task's ``attention_forward``; tensors on any device (the callback moves
            them).
        queries: default names of the rows of a map (the positions that attend), None: unnamed.
        keys: default names of the columns (the positions attended to), None: unnamed.
        labels: ``(queries, keys)`` for the attention modules whose name starts with a prefix (as in
            ``named_modules()``), for models whose modules attend over different sequences (an encoder-decoder's
            encoder, decoder and cross-attention); the longest matching prefix wins.
    """

    inputs: dict[str, Any]
    queries: Labels = None
    keys: Labels = None
    labels: dict[str, tuple[Labels, Labels]] = field(default_factory=dict)

    def labels_for(self, module_name: str) -> tuple[Labels, Labels]:
        matches = [p for p in self.labels if module_name.startswith(p)]
        return tuple(self.labels[max(matches, key=len)]) if matches else (self.queries, self.keys)


class AttentionFigure(NamedTuple):
    """A figure a task drew from the maps: saved as ``<key>.png`` (characters other than letters, digits, ``.``,
    ``-`` and ``_`` replaced by ``_``) and logged to W&B as ``attention/<key>``."""

    key: str
    figure: Figure


@runtime_checkable
class AttentionSource(Protocol):
    def attention_sample(self, max_tokens: int) -> AttentionSample | None:
        """The fixed sample (the same one every time), or None: nothing to draw (an RNN/CNN variant).
        ``max_tokens``: the callback draws at most this many positions; a task whose sample length is free
        (the language model's text) makes its sample that long."""

    def attention_forward(self, **inputs: Any) -> Any:
        """The forward pass the maps are captured from (its result is ignored)."""


@runtime_checkable
class RendersAttention(Protocol):
    def render_attention(self, maps: dict[str, Tensor], sample: AttentionSample) -> list[AttentionFigure]:
        """Draw the captured maps (module name -> (B, H, Tq, Tk)) itself instead of the token heatmaps."""


@runtime_checkable
class ExplorerViewSource(Protocol):
    def explorer_view(self, maps: dict[str, Tensor], sample: AttentionSample) -> dict[str, Any]:
        """What the family adds to the attention explorer's page (:func:`attnlab.plots.views.image_view`,
        :func:`~attnlab.plots.views.speech_view`); tasks without it get the tokens page."""


# --- the translation table -------------------------------------------------------------------------------------------
class TranslationRow(NamedTuple):
    source: str
    reference: str
    hypothesis: str


@runtime_checkable
class TranslationTableSource(Protocol):
    def translation_table(self, size: int) -> list[TranslationRow]:
        """``size`` fixed validation sentences translated by the current weights (the same sentences every time)."""


# --- TTS listening material ------------------------------------------------------------------------------------------
@dataclass
class ListeningSample:
    """One fixed validation utterance, teacher-forced and free-running.

    ``mels``: (title, (frames, n_mels)) panels, target first; ``alignment``: the free-running cross-attention
    (steps, characters); ``wave``: audio of the free-running mel at ``sample_rate``; ``labels``: one per alignment
    column (the characters, then ``<eos>`` when the model appends it), None: the characters of ``text``."""

    text: str
    mels: list[tuple[str, Tensor]]
    alignment: Tensor
    wave: Tensor
    sample_rate: int
    labels: list[str] | None = None


@runtime_checkable
class ListeningSampleSource(Protocol):
    def listening_sample(self) -> ListeningSample:
        ...


# --- confusion matrix ------------------------------------------------------------------------------------------------
@dataclass
class ConfusionResult:
    """A stage's confusion matrix (rows: true class, columns: predicted), reduced over every rank."""

    matrix: Tensor
    class_names: list[str] | None = None


@runtime_checkable
class ConfusionSource(Protocol):
    def confusion_result(self, stage: str) -> ConfusionResult | None:
        """The matrix of the stage's last epoch ("val" or "test"), None if not tracked."""


# --- accuracy by distance --------------------------------------------------------------------------------------------
DistanceRecord = dict[str, Any]


@runtime_checkable
class DistanceRecordSource(Protocol):
    def distance_record(self) -> DistanceRecord | None:
        """The last test's accuracy per distance (JSON-ready), None if the test set has no distances."""
