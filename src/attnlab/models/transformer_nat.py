"""Non-autoregressive transformer translation (seed claim C21; Gu et al. 2018, without fertilities).

    memory = encoder(src)                                   as in TransformerMT
    length = argmax length_head(mean of memory + E[|src|]) + |src|   a classifier over the offset |tgt| − |src|
    dec_in[t] = embed(src)[⌊t·|src| / length⌋] + pos[t]      "uniform copy" of the source embeddings
    logits = decoder(dec_in, memory)                        no causal mask: every position at once

All target positions come out of one decoder pass, so decoding time does not grow with a loop over the output
(claim E13 measures the speed-up and the quality cost). The predicted length counts the <eos> slot, so the
target the decoder learns is exactly the autoregressive model's ``tgt_out`` (target + <eos>).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.special_tokens import PAD_ID
from .transformer_mt import TransformerMT


class TransformerNAT(TransformerMT):
    """Same encoder, embeddings, layers and head as :class:`TransformerMT`; a length head on top."""

    def __init__(self, vocab_size: int, *args, max_length_offset: int = 32, **kwargs):
        if kwargs.get("copy"):
            raise ValueError("the copy mechanism is for autoregressive decoders; model=transformer_nat has none")
        super().__init__(vocab_size, *args, **kwargs)
        self.max_length_offset = max_length_offset
        # The mean of the encoder output hardly depends on how many tokens went into it, and the offset usually
        # grows with the source length (French runs longer than English), so the head also sees |src|.
        self.src_length_embed = nn.Embedding(self.max_len + 1, self.d_model)
        self.length_head = nn.Linear(self.d_model, 2 * max_length_offset + 1)  # offsets -M..M

    def predict_length_logits(self, memory: Tensor, src_mask: Tensor) -> Tensor:
        """memory (B, S, D) -> logits (B, 2M + 1) over the offset |tgt| − |src| (index M = same length)."""
        m = src_mask[..., None].to(memory.dtype)
        n = src_mask.sum(1)
        pooled = (memory * m).sum(1) / n.clamp_min(1)[:, None]
        return self.length_head(pooled + self.src_length_embed(n.clamp(max=self.max_len)))

    def length_target(self, src_mask: Tensor, tgt_lengths: Tensor) -> Tensor:
        """The offset class of each true length (clamped to the head's range)."""
        offset = tgt_lengths - src_mask.sum(1)
        return offset.clamp(-self.max_length_offset, self.max_length_offset) + self.max_length_offset

    def lengths_from_logits(self, logits: Tensor, src_mask: Tensor, k: int = 1, scale: float = 1.0) -> Tensor:
        """The ``k`` most likely lengths per row (B, k), each times ``scale``, within [1, max_len]."""
        offsets = logits.topk(k, dim=-1).indices - self.max_length_offset
        lengths = (src_mask.sum(1, keepdim=True) + offsets).float() * scale
        return lengths.round().long().clamp(1, self.max_len)

    def decode_parallel(self, src: Tensor, src_mask: Tensor, memory: Tensor, lengths: Tensor) -> Tensor:
        """All positions at once: lengths (B,) -> logits (B, max(lengths), V); positions ≥ a row's length are
        padding (masked in self-attention, their logits meaningless)."""
        T = int(lengths.max())
        t = torch.arange(T, device=src.device)
        tgt_mask = t[None] < lengths[:, None]  # (B, T)
        src_len = src_mask.sum(1, keepdim=True)  # (B, 1)
        index = (t[None] * src_len // lengths[:, None].clamp_min(1)).clamp(max=src.shape[1] - 1)  # (B, T)
        x = self.embed(src).gather(1, index[..., None].expand(-1, -1, self.d_model))
        x = self.drop(self.tgt_positions.add(x))
        h = self.decoder(x, memory=memory, memory_padding_mask=src_mask, padding_mask=tgt_mask, is_causal=False)
        return self.head(h)

    def forward_with_length(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Training: (logits (B, T, V) at the true lengths, length logits (B, 2M+1), their targets (B,))."""
        memory = self.encode(src, src_mask)
        lengths = (tgt_in != PAD_ID).sum(1)  # <bos> + target = target + <eos>: the length of tgt_out
        logits = self.decode_parallel(src, src_mask, memory, lengths)
        if logits.shape[1] < tgt_in.shape[1]:  # keep the (B, T) layout of tgt_out
            logits = nn.functional.pad(logits, (0, 0, 0, tgt_in.shape[1] - logits.shape[1]))
        return logits, self.predict_length_logits(memory, src_mask), self.length_target(src_mask, lengths)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Scores (B, T, V) aligned with ``tgt_out``, decoded in parallel at the true target lengths."""
        return self.forward_with_length(src, src_mask, tgt_in)[0]

    def stepper(self, *args, **kwargs):
        raise TypeError("model=transformer_nat decodes all positions in one pass; it has no step-by-step decoder")
