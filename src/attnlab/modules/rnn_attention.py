"""Attention for RNN decoders, one decoder step at a time (seed claims C2, C3).

One query vector per row (a decoder state) against the encoder's memory ``h_1..h_S``:

* ``bahdanau`` (additive, Bahdanau et al. 2015): ``e_j = v · tanh(W q + U h_j)``, the query being the decoder's
  *previous* state ``s_{t-1}`` (C2's small MLP ``f_att``);
* ``luong_dot`` (Luong et al. 2015): ``e_j = q · h_j``, the query being the *current* state ``s_t``;
* ``luong_general``: ``e_j = q · (W_a h_j)`` (a bilinear score).

Which state is the query is the decoder's business; this module only scores, masks and averages. Weights are a
softmax over the real source positions only (padding gets exactly 0). ``U h_j`` / ``W_a h_j`` do not depend on the
step, so :meth:`project_memory` computes them once per sentence and every step reuses them.

Attention maps: with ``return_weights`` True (set by :func:`~attnlab.modules.attention.capture_attention`) each call
appends its row, so after a teacher-forced forward ``weights`` is (B, 1, T, S), one head, like the transformer's
(B, H, Tq, Tk). The decoder calls :meth:`reset_weights` at the start of each forward / decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.choices import RNN_ATTENTION_KINDS as ATTENTION_KINDS


class RNNAttention(nn.Module):
    """Score, mask, softmax and average one query per row over a memory.

    Args:
        kind: ``bahdanau`` | ``luong_dot`` | ``luong_general``.
        d_query: width of the query (decoder state).
        d_memory: width of the memory (encoder outputs); ``luong_dot`` needs ``d_query == d_memory``.
        d_attn: hidden width of the additive score's MLP (``bahdanau`` only; default ``d_query``).
    """

    def __init__(self, kind: str, d_query: int, d_memory: int, d_attn: int | None = None):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {kind!r}; valid kinds: {', '.join(ATTENTION_KINDS)}")
        self.kind = kind
        if kind == "bahdanau":
            d_attn = d_attn or d_query
            self.query_proj = nn.Linear(d_query, d_attn, bias=False)  # W
            self.memory_proj = nn.Linear(d_memory, d_attn, bias=True)  # U (its bias is the MLP's bias)
            self.v = nn.Linear(d_attn, 1, bias=False)
        elif kind == "luong_general":
            self.memory_proj = nn.Linear(d_memory, d_query, bias=False)  # W_a
        elif d_query != d_memory:
            raise ValueError(f"luong_dot needs d_query == d_memory, got {d_query} and {d_memory}")
        self.return_weights = False
        self.weights: Tensor | None = None  # (B, 1, T, S) rows appended per call while return_weights

    def project_memory(self, memory: Tensor) -> Tensor:
        """memory (B, S, d_memory) -> the step-independent part of the score: (B, S, d_attn | d_query)."""
        return memory if self.kind == "luong_dot" else self.memory_proj(memory)

    def reset_weights(self) -> None:
        self.weights = None

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor, keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """
        Args:
            query: (B, d_query) decoder state.
            memory: (B, S, d_memory) encoder outputs (the values).
            mask: (B, S) bool, True at real source tokens (each row needs at least one).
            keys: ``project_memory(memory)``, passed to skip recomputing it every step.
        Returns:
            context (B, d_memory) = Σ_j a_j h_j and weights a (B, S), summing to 1 over real tokens, 0 on padding.
        """
        keys = self.project_memory(memory) if keys is None else keys
        if self.kind == "bahdanau":
            scores = self.v(torch.tanh(self.query_proj(query)[:, None, :] + keys)).squeeze(-1)  # (B, S)
        else:
            scores = (keys @ query[:, :, None]).squeeze(-1)  # (B, S, D) @ (B, D, 1) -> (B, S)
        # -inf, not a large negative number: padding must get exactly 0 (a row always has a real token: <eos>)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        context = (weights[:, None, :] @ memory).squeeze(1)  # (B, 1, S) @ (B, S, D) -> (B, D)
        if self.return_weights:
            row = weights.detach()[:, None, None, :]  # (B, 1, 1, S)
            self.weights = row if self.weights is None else torch.cat([self.weights, row], dim=2)
        return context, weights

    def extra_repr(self) -> str:
        return f"kind={self.kind}"
