"""Greedy decoding and sampling with temperature, top-k and nucleus (top-p) filtering, as :class:`SamplingOptions`
say."""

from __future__ import annotations

import torch
from torch import Tensor

from .options import SamplingOptions
from .step import Stepper


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set whose probability ≥ top_p."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first token always stays)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop_sorted[..., 0] = False  # also when top_p underflows to 0 in the logits' dtype (top_p=1e-300)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: Tensor, options: SamplingOptions, generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> next token ids (B,), drawn as ``options`` say (temperature 0: the argmax)."""
    if options.greedy:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / options.temperature, options.top_k, options.top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    stepper: Stepper,
    prefix: Tensor,
    options: SamplingOptions,
    *,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """prefix (B, T) -> (B, T + n) with n ≤ ``options.max_new_tokens``; rows that emitted ``eos_id`` keep emitting it.

    ``vocab_size``: never emit ids at or above it (a model whose embedding table is larger than its tokenizer).
    """
    out = [prefix]
    done = torch.zeros(prefix.shape[0], dtype=torch.bool, device=prefix.device)
    logits = stepper.prefill(prefix)
    for i in range(options.max_new_tokens):
        if vocab_size is not None and vocab_size < logits.shape[-1]:
            logits = logits.clone()
            logits[:, vocab_size:] = float("-inf")
        token = sample_next(logits, options, generator)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done |= token == eos_id
        out.append(token[:, None])
        if eos_id is not None and bool(done.all()):
            break
        if i + 1 < options.max_new_tokens:
            logits = stepper.step(token)
    return torch.cat(out, dim=1)
