"""The models every comparison builds: the project's CausalLM, HF transformers' GPT-2 and an LM of
``torch.nn.TransformerEncoderLayer`` at the same shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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


class TorchLayersLM(nn.Module):
    """A second independent reference for P1: the same LM from ``torch.nn.TransformerEncoderLayer`` (pre-norm,
    GELU, 4·d feed-forward, biases, no dropout) under a causal mask, learned positions, final LayerNorm, head tied to
    the token table: the same parameter count as :func:`ours`. Its loss is the idiomatic logits + F.cross_entropy."""

    def __init__(self, shape: Shape = ISSUE_SHAPE):
        super().__init__()
        d = shape.d_model
        self.embed = nn.Embedding(shape.vocab, d)
        self.positions = nn.Parameter(torch.randn(shape.max_len, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, shape.n_heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        # enable_nested_tensor only matters for padding masks in inference; off, so training takes the plain path
        self.layers = nn.TransformerEncoder(layer, shape.n_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        self.head = nn.Linear(d, shape.vocab, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.embed(ids) + self.positions[:t]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.layers(x, mask=mask, is_causal=True))

    def loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(ids).flatten(0, 1), labels.flatten())


def torch_layers_lm(shape: Shape = ISSUE_SHAPE, seed: int = 0) -> TorchLayersLM:
    torch.manual_seed(seed)
    return TorchLayersLM(shape)
