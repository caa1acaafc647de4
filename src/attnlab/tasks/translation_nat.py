"""Non-autoregressive translation task (claim C21): token loss + length loss, one-pass decoding with length beam.

Training adds ``length_loss_weight`` × the length classifier's cross-entropy to the token loss (both at the true
target length). At inference the ``beam_size`` most likely lengths are decoded in parallel (Gu et al.'s length
beam, without a teacher to rescore) and ranked by mean token log-prob plus the length's log-prob; ``length_scale`` multiplies every predicted
length (claim E13 sweeps it to see how the quality depends on the length).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.tokenizer import EOS_ID
from ..decoding import BeamResult, DecodingOptions
from .protocols import StepOutput
from .translation import TranslationTask


class NATTranslationTask(TranslationTask):
    """Args: those of :class:`TranslationTask` (no scheduled sampling), and
    length_loss_weight: weight of the length classifier's cross-entropy in the training loss.
    length_scale: multiplies every predicted length at inference.
    """

    # The arguments are spelled out (no **kwargs): Lightning then passes a checkpoint only the hyper-parameters
    # this class takes, so checkpoints saved with retired arguments (attention_tokens, table_size) still load.
    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.1,
                 scheduled_sampling: dict | None = None, decoding: dict | None = None,
                 decode_val_batches: int | None = None, length_loss_weight: float = 0.1, length_scale: float = 1.0):
        super().__init__(net, optimizer, scheduler, compile, label_smoothing, scheduled_sampling, decoding,
                         decode_val_batches)
        if self.sampling.schedule != "none":
            raise ValueError("scheduled sampling needs an autoregressive decoder; model=transformer_nat has none")
        self.length_loss_weight, self.length_scale = length_loss_weight, length_scale

    def step(self, batch: dict, stage: str) -> StepOutput:
        if stage != "train":
            return super().step(batch, stage)
        scores, length_logits, length_target = self.net.forward_with_length(
            batch["src"], batch["src_mask"], batch["tgt_in"])
        token_loss = self._loss(scores, batch["tgt_out"], self.label_smoothing)
        length_loss = F.cross_entropy(length_logits.float(), length_target)
        length_acc = (length_logits.argmax(-1) == length_target).float().mean()
        metrics = {"loss": token_loss, "length_loss": length_loss, "length_acc": length_acc}
        if self.label_smoothing:  # train/loss is smoothed: the plain one too, as val/loss is
            metrics["nll"] = self._loss(scores.detach(), batch["tgt_out"], 0.0)
        return StepOutput(token_loss + self.length_loss_weight * length_loss, metrics, batch_size=len(batch["src"]))

    @torch.no_grad()
    def translate_batch(self, src: Tensor, src_mask: Tensor, options: DecodingOptions | None = None) -> BeamResult:
        """One decoder pass per candidate length (all candidates batched), ranked by mean token log-prob + length
        log-prob (the mean alone lets a wrong length win whenever its few tokens are confident).

        The options' ``beam_size`` is the number of candidate lengths, ``n_best`` as in a beam; the others (length
        penalty and limit, ``force_eos_at_max_len``) do not apply."""
        options = options or DecodingOptions()
        net, B, k, n_best = self.net, src.shape[0], options.beam_size, options.n_best
        memory = net.encode(src, src_mask)
        length_logits = net.predict_length_logits(memory, src_mask).float()
        lengths = net.lengths_from_logits(length_logits, src_mask, k, self.length_scale)  # (B, k)
        length_logp = length_logits.log_softmax(-1).topk(k, dim=-1).values  # (B, k) log p(length)
        rep = lambda x: x.repeat_interleave(k, dim=0)  # noqa: E731  rows b*k .. b*k+k-1 are sentence b's
        flat = lengths.flatten()
        logp = net.decode_parallel(rep(src), rep(src_mask), rep(memory), flat).float().log_softmax(-1)
        best, ids = logp.max(dim=-1)  # (B·k, T)
        valid = torch.arange(ids.shape[1], device=ids.device)[None] < flat[:, None]
        total = (best * valid).sum(1).view(B, k) + length_logp  # log p(length) + Σ log p(token)
        score = (best * valid).sum(1).view(B, k) / lengths + length_logp  # per-token mean: lengths compete fairly
        order = score.argsort(dim=1, descending=True)[:, :n_best]  # (B, n_best)
        tokens = []
        for b in range(B):
            hyps = []
            for j in order[b].tolist():
                row = ids[b * k + j, : int(flat[b * k + j])]
                eos = (row == EOS_ID).nonzero()
                hyps.append(row[: int(eos[0]) + 1] if len(eos) else row)
            tokens.append(hyps)
        return BeamResult(tokens, score.gather(1, order), total.gather(1, order))
