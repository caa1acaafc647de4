"""Translation task: one LightningModule for every sequence-to-sequence net (transformer, RNN, with copy).

The net contract (a plain ``nn.Module``)::

    net.vocab_size                                    int
    net(src, src_mask, tgt_in) -> scores (B, T, V')    teacher forcing; logits or normalized log-probs, V' ≥ V
    net.stepper(src, src_mask, use_cache=True)        a decoding.Stepper whose prefix starts with <bos>
    net.per_step_sampling (optional, bool)            the net does scheduled sampling itself:
                                                      net(src, src_mask, tgt_in, sampling_ratio=r)
    net.max_len (optional)                            longest target the net can decode

Training: cross-entropy with label smoothing over real target tokens (``F.cross_entropy`` is right for logits and
for log-probs alike: log-softmax leaves normalized log-probs unchanged), MoE auxiliary losses, scheduled sampling
(per step inside the net, or two passes here; see :mod:`attnlab.decoding.scheduled_sampling`).

Validation / test: the plain loss (no smoothing), then the model *translates* the batch (greedy or beam search,
``decoding.val`` / ``decoding.test``) and BLEU, chrF (sacrebleu's definitions, via torchmetrics), exact match
and exact match per source-length bucket are computed on detokenized text. After each validation the
translation-table callback writes a few fixed sentences (:meth:`TranslationTask.translation_table`: source /
reference / hypothesis) to W&B and to ``<run>/translations/``, and the attention-map callback draws encoder,
decoder and cross-attention maps of one fixed pair. With
``data.copy_names=true`` testing also covers the copy_test split (names never seen in training, claim E15):
``copy_test/*`` metrics and ``copy_test/name_copied``, the share of outputs that contain the source's name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from ..data.tokenizer import BOS_ID, EOS_ID, PAD_ID, BPETokenizer
from ..decoding import BeamResult, DecodingOptions, beam_search, greedy_search
from ..decoding.scheduled_sampling import SamplingSchedule, mix_predictions
from ..metrics.translation import TranslationMetrics
from ..modules.attention import is_attention_module
from .base import Task, to_container
from .protocols import AttentionSample, StepOutput, TranslationRow

log = logging.getLogger(__name__)

STAGES = ("val", "test", "copy_test")  # copy_test: held-out names (data.copy_names=true), tested after test


def decoding_options(values: dict | None, where: str) -> DecodingOptions:
    """A task config's decoding options (``decoding.val`` / ``.test``), checked once here."""
    try:
        return DecodingOptions(**(values or {}))
    except TypeError:
        known = ", ".join(f.name for f in fields(DecodingOptions))
        raise ValueError(f"{where} has keys {sorted(values)}; decoding options are {known}") from None


def decode_text(tokenizer: BPETokenizer, ids: Sequence[int] | Tensor) -> str:
    """Text of generated ids: cut at the first <eos>, special tokens dropped."""
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return tokenizer.decode(ids, skip_special=True).strip()


class TranslationTask(Task):
    """Args:
    label_smoothing: ε of the training loss (Szegedy et al. 2016; 0.1 in Vaswani et al.).
    scheduled_sampling: :class:`SamplingSchedule` fields (``schedule: none`` = teacher forcing).
    decoding: ``{"val": {...}, "test": {...}}``, each the fields of a
        :class:`~attnlab.decoding.options.DecodingOptions` (``beam_size``, ``length_penalty``, ``max_len_a``,
        ``max_len_b``: max new tokens before EOS = a · source length + b, ``n_best``, ``force_eos_at_max_len``:
        True, fairseq, a hypothesis cut by the limit ends in a forced, scored EOS).
    decode_val_batches: translate only the first N validation batches (None: all); the loss uses all.
    """

    checkpoint_keys = ("tokenizer",)  # what translate needs from the checkpoint besides the model

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.1,
                 scheduled_sampling: dict | None = None, decoding: dict | None = None,
                 decode_val_batches: int | None = None):
        super().__init__(net, optimizer, scheduler, compile)
        self.label_smoothing = label_smoothing
        self.sampling = SamplingSchedule(**(to_container(scheduled_sampling) or {}))
        decoding = to_container(decoding) or {}
        unknown = set(decoding) - {"val", "test"}
        if unknown:
            raise ValueError(f"decoding has keys val and test only, got {sorted(unknown)}")
        self.decoding = {s: decoding_options(decoding.get(s), f"decoding.{s}") for s in ("val", "test")}
        self.decode_val_batches = decode_val_batches
        self.losses = nn.ModuleDict({s: MeanMetric() for s in STAGES})
        self.name_copied = MeanMetric()  # copy_test: the held-out name appears in the translation
        self.tokenizer: BPETokenizer | None = None
        self.bucket_names: list[str] = []
        self.src_eos = True
        self._decode_time, self._decoded = dict.fromkeys(STAGES, 0.0), dict.fromkeys(STAGES, 0)

    # --- setup: the data decides tokenizer and buckets ----------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        dm = self.trainer.datamodule
        self.tokenizer, self.bucket_names = dm.tokenizer, list(dm.bucket_names)
        self.src_eos = bool(dm.hparams.src_eos)
        if dm.vocab_size > self.net.vocab_size:
            raise ValueError(f"the tokenizer has {dm.vocab_size} tokens but the model only {self.net.vocab_size}: "
                             "raise data.vocab_size's cap or model.net.vocab_size")
        if not hasattr(self, "metrics"):
            self.metrics = nn.ModuleDict({s: TranslationMetrics(len(self.bucket_names)) for s in STAGES})
            self.metrics.to(self.device)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer is not None:  # `translate` needs nothing but the checkpoint
            checkpoint["tokenizer"] = self.tokenizer.to_str()
            checkpoint["translation"] = {"src_eos": self.src_eos, "bucket_names": self.bucket_names}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if "tokenizer" in checkpoint:  # the tokenizer itself: restored by the base
            meta = checkpoint.get("translation", {})
            self.src_eos, self.bucket_names = meta.get("src_eos", True), list(meta.get("bucket_names", []))

    # --- loss -------------------------------------------------------------------------------------------------
    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, **kwargs) -> Tensor:
        return self._forward(src, src_mask, tgt_in, **kwargs)

    def _loss(self, scores: Tensor, tgt_out: Tensor, smoothing: float) -> Tensor:
        return F.cross_entropy(scores.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=smoothing)

    def step(self, batch: dict, stage: str) -> StepOutput:
        if stage != "train":  # the plain loss (no smoothing), reduced per token over the epoch and the ranks
            scores = self(batch["src"], batch["src_mask"], batch["tgt_in"])
            loss = self._loss(scores, batch["tgt_out"], 0.0)
            self.losses[stage].update(loss, weight=batch["tgt_mask"].sum())
            return StepOutput(loss, {"loss": self.losses[stage]}, ("loss",) if stage == "val" else (),
                              batch_size=len(batch["src"]))
        src, src_mask, tgt_in = batch["src"], batch["src_mask"], batch["tgt_in"]
        ratio = self.sampling.sampling_ratio(self.global_step)
        if getattr(self.net, "per_step_sampling", False):
            scores = self(src, src_mask, tgt_in, sampling_ratio=ratio)
        else:
            if ratio > 0:  # two passes: the model's own predictions replace some inputs (no gradient through them)
                with torch.no_grad():
                    first = self(src, src_mask, tgt_in)
                tgt_in = mix_predictions(tgt_in, first, ratio, batch["tgt_mask"])
            scores = self(src, src_mask, tgt_in)
        loss = self._loss(scores, batch["tgt_out"], self.label_smoothing)
        metrics = {"loss": loss}
        if self.label_smoothing:  # train/loss is smoothed (its floor is above 0): the plain one, as val/loss is
            metrics["nll"] = self._loss(scores.detach(), batch["tgt_out"], 0.0)
        if self.sampling.schedule != "none":
            metrics["sampling_ratio"] = ratio
        return StepOutput(loss, metrics, batch_size=len(src))

    # --- translation --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def translate_batch(self, src: Tensor, src_mask: Tensor, options: DecodingOptions | None = None) -> BeamResult:
        """Beam search -> :class:`~attnlab.decoding.beam.BeamResult` (ids without <bos>); ``beam_size=1`` is greedy
        decoding, the argmax chain (:func:`~attnlab.decoding.beam.greedy_search`). ``options``: the defaults of
        :class:`~attnlab.decoding.options.DecodingOptions` if None.

        Without early stopping (the options' default): a sentence is done when no live hypothesis can still beat its
        beam_size-th finished one. Stopping at the first beam_size finished ones (fairseq's default) let short
        hypotheses ending early at a smoothed-floor probability (≈ -9 with label smoothing 0.1) fill the finished
        list while the right one was still growing: on the numbers, beam 5 then returned a *less* likely translation
        than greedy for 17 of 1,000 test sentences (mean log-prob -0.886 vs -0.794); without early stopping, for
        none (-0.793)."""
        options = options or DecodingOptions()
        limits = options.limits(src_mask.sum(dim=1), getattr(self.net, "max_len", None))
        prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
        search = greedy_search if options.beam_size == 1 and options.n_best == 1 else beam_search
        return search(self.net.stepper(src, src_mask), prefix, options, limits=limits, eos_id=EOS_ID,
                      vocab_size=self.net.vocab_size)

    def translate_texts(self, src: Tensor, src_mask: Tensor,
                        options: DecodingOptions | None = None) -> tuple[list[str], Tensor]:
        """Best translation of each row as text, and its summed log-probability (B,)."""
        result = self.translate_batch(src, src_mask, options)
        return [decode_text(self.tokenizer, ids) for ids in result.best], result.logprobs[:, 0]

    # --- validation and test ------------------------------------------------------------------------------------
    def generate_step(self, batch: dict, batch_idx: int, stage: str) -> None:
        """Translate the batch: BLEU, chrF, exact match (per bucket), log-prob, speed; copy_test: names copied."""
        if stage == "val" and self.decode_val_batches is not None and batch_idx >= self.decode_val_batches:
            return
        start = time.perf_counter()
        hyps, logprob = self.translate_texts(batch["src"], batch["src_mask"],
                                             self.decoding["val" if stage == "val" else "test"])
        self._decode_time[stage] += time.perf_counter() - start
        self._decoded[stage] += len(hyps)
        self.metrics[stage].update(hyps, batch["tgt_text"], batch["bucket"])
        self.log(f"{stage}/logprob", logprob.mean(), on_epoch=True, batch_size=len(hyps), add_dataloader_idx=False)
        if stage == "copy_test":  # claim E15: is the name (never seen in training) in the output?
            names = [[w for w in s.split() if w[:1].isupper()] for s in batch["src_text"]]
            self.name_copied.update(torch.tensor([all(n in h.split() for n in ns) for ns, h in zip(names, hyps)],
                                                 dtype=torch.float))

    def test_stage(self, dataloader_idx: int) -> str:
        return "copy_test" if dataloader_idx == 1 else "test"

    def _log_metrics(self, stage: str) -> None:
        metrics = self.metrics[stage]
        if metrics.exact.update_count == 0:
            return
        for k, v in metrics.compute(self.bucket_names).items():
            if not torch.isnan(v):  # a bucket without sentences has no accuracy
                self.log(f"{stage}/{k}", v, prog_bar=k in ("bleu", "exact_match"), sync_dist=True)
        metrics.reset()
        if self._decode_time[stage] > 0:  # decoding speed of this rank (claim E13: autoregressive vs NAT)
            self.log(f"{stage}/sentences_per_sec", self._decoded[stage] / self._decode_time[stage])
        self._decode_time[stage], self._decoded[stage] = 0.0, 0

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")
        self._log_metrics("copy_test")
        if self.name_copied.update_count:
            self.log("copy_test/name_copied", self.name_copied.compute())
            self.name_copied.reset()

    def _table_batch(self, size: int) -> dict:
        """A few validation pairs spread over the (length-sorted) split, the same ones every time."""
        from ..data.translation_datamodule import collate

        ds = self.trainer.datamodule.val_dataset
        n = min(size, len(ds))
        order = sorted(range(len(ds)), key=lambda i: (int(ds.src_lens[i]), i))
        picks = [order[round(j * (len(ds) - 1) / max(1, n - 1))] for j in range(n)]
        return collate([ds[i] for i in picks])

    def translation_table(self, size: int) -> list[TranslationRow]:
        """``size`` fixed validation sentences and their translations by the current weights (``decoding.val``)."""
        if size <= 0:
            return []
        batch = self._table_batch(size)
        was_training = self.net.training
        self.net.eval()
        try:
            hyps, _ = self.translate_texts(batch["src"].to(self.device), batch["src_mask"].to(self.device),
                                           self.decoding["val"])
        finally:
            self.net.train(was_training)
        return [TranslationRow(*r) for r in zip(batch["src_text"], batch["tgt_text"], hyps)]

    # --- protocols used by callbacks (attention maps, throughput) -----------------------------------------------
    def tokens_in_batch(self, batch: dict) -> int:
        return batch["src"].numel() + batch["tgt_in"].numel()

    def attention_sample(self, max_tokens: int) -> AttentionSample:
        """The datamodule's fixed pair: encoder maps are named by source tokens, decoder maps by target tokens,
        cross-attention maps by both."""
        pair = self.trainer.datamodule.example_pair()
        tok = self.tokenizer
        src = [tok.id_to_token(int(i)) for i in pair["src"][0]]
        tgt = [tok.id_to_token(int(i)) for i in pair["tgt_in"][0]]
        labels = {"net.encoder": (src, src), "net.decoder": (tgt, tgt)}
        for name, m in self.named_modules():
            if "cross_attn" in name and is_attention_module(m):
                labels[name] = (tgt, src)
        inputs = {"src": pair["src"], "src_mask": pair["src_mask"], "tgt_in": pair["tgt_in"]}
        return AttentionSample(inputs, queries=tgt, keys=src, labels=labels)

    def attention_forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        return self.net(src, src_mask, tgt_in)
