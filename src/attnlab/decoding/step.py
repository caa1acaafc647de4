"""The step interface every decoder exposes to the decoding loops (greedy, sampling, beam search).

A ``Stepper`` owns the model's incremental state (KV caches, or nothing when recomputing):

    logits = stepper.prefill(prefix)   # prefix (B, T) -> next-token logits (B, V)
    logits = stepper.step(token)       # token (B,)     -> next-token logits (B, V)
    stepper.reorder(index)             # beam search: keep the rows ``index`` (B',)

The loops never touch caches or models themselves, so the same loop decodes a causal LM, a translation decoder
(its stepper holds the encoder output) or a TTS decoder.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..models.causal_lm import CausalLM


class Stepper(Protocol):
    def prefill(self, prefix: Tensor) -> Tensor: ...

    def step(self, token: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


class CausalLMStepper:
    """Incremental decoding of a :class:`CausalLM`.

    use_cache=True keeps one KV cache per layer, so each step costs one token's forward pass. use_cache=False
    recomputes the whole sequence every step (the reference the cache must match, and the baseline for benches).
    When the model's context (``max_len``) is full, the oldest half is dropped and the rest re-encoded, so
    generation can go on past max_len.
    """

    def __init__(self, model: CausalLM, use_cache: bool = True):
        self.model, self.use_cache = model, use_cache
        self.tokens: Tensor | None = None  # (B, T) everything seen so far (inside the window)
        self.caches = None

    def _run(self, new: Tensor) -> Tensor:
        ids, caches = (new, self.caches) if self.use_cache else (self.tokens, None)
        return self.model(ids, caches, last_only=True)[:, -1]  # the head on one position, not all T

    def prefill(self, prefix: Tensor) -> Tensor:
        self.tokens = prefix[:, -self.model.max_len :]
        if self.use_cache:
            dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            self.caches = self.model.new_caches(prefix.shape[0], dtype=dtype)
        return self._run(self.tokens)

    def step(self, token: Tensor) -> Tensor:
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        if self.tokens.shape[1] > self.model.max_len:  # window full: keep the newest half, re-encode it
            return self.prefill(self.tokens[:, -(self.model.max_len // 2) :])
        return self._run(token[:, None])

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens.index_select(0, index)
        if self.caches:
            for c in self.caches:
                c.reorder(index)
