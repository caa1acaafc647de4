"""The models every comparison builds: the project's CausalLM and HF transformers' GPT-2 at the same shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.models.causal_lm import CausalLM


@dataclass(frozen=True)
class Shape:
    vocab: int = 8192
    d_model: int = 384
    n_layers: int = 6
    n_heads: int = 6
    seq_len: int = 256
    max_len: int = 256


ISSUE_SHAPE = Shape()  # issue 5: 6 layers, 6 heads, d=384, T=256, vocab 8192, no dropout


def ours(shape: Shape = ISSUE_SHAPE, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(shape.vocab, shape.d_model, shape.n_layers, shape.n_heads, max_len=shape.max_len,
                    dropout=0.0, attn_dropout=0.0)


def hf_gpt2(shape: Shape = ISSUE_SHAPE, seed: int = 0):
    """GPT2LMHeadModel with sdpa attention, no dropout, tied head: the same parameter count as :func:`ours`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=shape.vocab, n_positions=shape.max_len, n_embd=shape.d_model,
                     n_layer=shape.n_layers, n_head=shape.n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    # _from_config is transformers' documented way to build an untrained model with a chosen attention kernel
    return GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")


def token_batch(batch: int, seq_len: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
