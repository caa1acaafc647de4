"""The generic probes the claims use, on small real modules: the equivariance check (E4) and the translation
scores (E13, E15, E17)."""

from __future__ import annotations

import torch

from attnlab.analysis.equivariance import equivariance_error, shuffle_rows
from attnlab.probes.translation import score


class TokenwiseEncoder(torch.nn.Module):
    """Embedding + self-attention without positions: a set operation, so permutation equivariant; with
    ``positions`` a learned position vector is added to each token, which breaks that."""

    def __init__(self, positions: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(20, 16)
        self.pos = torch.nn.Parameter(torch.randn(12, 16)) if positions else None
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def encode(self, src, src_mask):
        x = self.embed(src) + (self.pos[: src.shape[1]] if self.pos is not None else 0)
        return self.attn(x, x, x, key_padding_mask=~src_mask)[0]


def batches() -> list[dict]:
    src = torch.tensor([[3, 4, 5, 6, 7, 0], [8, 9, 10, 0, 0, 0]])
    return [{"src": src, "src_mask": src != 0}]


def test_shuffle_keeps_padding_and_changes_the_order():
    batch = batches()[0]
    shuffled, perms = shuffle_rows(batch, torch.Generator().manual_seed(0))
    for b, perm in enumerate(perms):
        n = len(perm)
        assert not torch.equal(perm, torch.arange(n))
        assert torch.equal(shuffled[b, :n], batch["src"][b, :n][perm])
        assert torch.equal(shuffled[b, n:], batch["src"][b, n:])


@torch.no_grad()
def test_equivariance_error_tells_a_set_encoder_from_a_positional_one():
    set_max, _ = equivariance_error(TokenwiseEncoder(positions=False).eval(), batches(), limit=10)
    pos_max, _ = equivariance_error(TokenwiseEncoder(positions=True).eval(), batches(), limit=10)
    assert set_max < 1e-5 < 1e-2 < pos_max


def test_score_is_bleu_and_exact_match():
    bleu, em = score(["un deux trois quatre", "cinq six sept huit"], ["un deux trois quatre", "cinq six sept neuf"])
    assert em == 0.5 and 0 < bleu < 100
    assert score(["un deux trois quatre"], ["un deux trois quatre"]) == (100.0, 1.0)
