"""Position parts of the ``pos`` group: one constructor for every kind (built by Hydra from ``_target_`` +
``_partial_``), the tables they add, the attention-side parts (RoPE, ALiBi) and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from attnlab.core.errors import ConfigError, UserError
from attnlab.modules.attention import MultiHeadAttention
from attnlab.modules.positional import (
    ALiBi,
    ALiBiPositions,
    AttentionPositions,
    LearnedPositions,
    NoPositions,
    Positions,
    RotaryEmbedding,
    RotaryPositions,
    SinusoidalPositions,
    alibi_slopes,
    sinusoidal_table,
    sinusoidal_table_2d,
)

MAX_LEN, D, H = 16, 32, 4
KINDS = {"none": NoPositions, "learned": LearnedPositions, "sinusoidal": SinusoidalPositions,
         "rotary": RotaryPositions, "alibi": ALiBiPositions}


# --------------------------------------------------------------------------- ALiBi


def paper_slopes(n: int) -> list[float]:
    """Press et al.'s reference code (github.com/ofirpress/attention_with_linear_biases), as published."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + paper_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def test_alibi_slopes_power_of_two_are_the_geometric_sequence():
    assert alibi_slopes(8) == pytest.approx([2 ** (-8 * i / 8) for i in range(1, 9)], rel=1e-12)
    assert alibi_slopes(8) == pytest.approx([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256])
    assert alibi_slopes(8) == pytest.approx(paper_slopes(8), rel=1e-12)


@pytest.mark.parametrize("n", [6, 12, 3, 1, 16])
def test_alibi_slopes_other_head_counts_follow_the_paper(n):
    assert alibi_slopes(n) == pytest.approx(paper_slopes(n), rel=1e-12)
    if n == 6:  # the 4 slopes of n=4, then every other slope of n=8: 2^-1 and 2^-3
        assert alibi_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_alibi_bias_matches_a_loop_over_absolute_positions():
    alibi = ALiBi(6)
    q_pos, k_pos = torch.arange(5, 8), torch.tensor([9, 3, 4, 5, 6, 7])  # keys in ring order, queries offset 5
    bias = alibi.score_bias(q_pos, k_pos, dtype=torch.float64)
    assert bias.shape == (6, 3, 6) and bias.dtype == torch.float64
    slopes = paper_slopes(6)
    for h in range(6):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * abs(qi - kj))
    assert "slopes" not in alibi.state_dict() and not list(alibi.parameters())


def test_alibi_weights_in_attention_are_softmax_of_scores_plus_bias():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, positions=ALiBi(H)).eval()
    x = torch.randn(2, 6, D)
    attn(x, is_causal=True, need_weights=True)
    q, k, _ = attn.qkv_proj(x).view(2, 6, 3, H, D // H).permute(2, 0, 3, 1, 4)
    pos = torch.arange(6)
    dist = (pos[:, None] - pos[None, :]).abs().float()
    scores = q @ k.transpose(-1, -2) / math.sqrt(D // H) - torch.tensor(paper_slopes(H))[:, None, None] * dist
    scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    torch.testing.assert_close(attn.weights, scores.softmax(-1), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- one constructor for every kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_builds_from_a_partial_config(kind):
    cls = KINDS[kind]
    partial = instantiate({"_target_": f"{cls.__module__}.{cls.__name__}", "_partial_": True})
    pos = partial(max_len=MAX_LEN, d_model=D, n_heads=H)
    assert isinstance(pos, Positions)
    x = torch.randn(2, 5, D)
    out = pos.add(x, offset=3)
    assert out.shape == x.shape
    if kind in ("learned", "sinusoidal"):
        torch.testing.assert_close(out, x + pos.table[3:8])
        assert pos.attention is None
    else:
        assert torch.equal(out, x)  # nothing added to the embeddings
    if kind == "none":
        assert pos.attention is None
    if kind == "rotary":
        assert isinstance(pos.attention, RotaryEmbedding) and pos.attention.cos.shape == (MAX_LEN, D // H // 2)
    if kind == "alibi":
        assert isinstance(pos.attention, ALiBi) and pos.attention.slopes.tolist() == alibi_slopes(H)
    if pos.attention is not None:  # an attention layer takes it as is
        MultiHeadAttention(D, H, positions=pos.attention)(x, is_causal=True)


def test_state_dicts_learned_table_only():
    learned = LearnedPositions(max_len=64, d_model=D, n_heads=H)
    assert list(learned.state_dict()) == ["table"] and learned.table.shape == (64, D)
    assert isinstance(learned.table, torch.nn.Parameter)
    assert learned.table.std().item() == pytest.approx(0.02, rel=0.1)
    for kind in ("none", "sinusoidal", "rotary", "alibi"):
        assert list(KINDS[kind](max_len=64, d_model=D, n_heads=H).state_dict()) == [], kind


def test_sinusoidal_1d_table_and_the_older_call_forms():
    pos = SinusoidalPositions(max_len=MAX_LEN, d_model=D, n_heads=H)
    assert torch.equal(pos.table, sinusoidal_table(MAX_LEN, D))
    assert torch.equal(SinusoidalPositions(10, 6)(3, offset=2), sinusoidal_table(10, 6)[2:5])  # older form
    torch.manual_seed(0)
    old = LearnedPositions(12, 8)
    assert torch.equal(old(4, offset=8), old.table[8:12])
    with pytest.raises(ValueError, match="beyond"):
        pos.add(torch.zeros(1, 5, D), offset=MAX_LEN - 4)


def test_sinusoidal_grid_is_the_vit_table_behind_zero_rows_for_class_tokens():
    pos = SinusoidalPositions(max_len=1 + 3 * 4, d_model=D, n_heads=H, grid=(3, 4))
    assert pos.table.shape == (13, D)
    assert torch.equal(pos.table[0], torch.zeros(D))
    assert torch.equal(pos.table[1:], sinusoidal_table_2d(3, 4, D))
    assert torch.equal(SinusoidalPositions(max_len=12, d_model=D, grid=(3, 4)).table, sinusoidal_table_2d(3, 4, D))
    with pytest.raises(ConfigError, match="max_len=11 is smaller than the 3x4 grid"):
        SinusoidalPositions(max_len=11, d_model=D, n_heads=H, grid=(3, 4))
    learned = LearnedPositions(max_len=13, d_model=D, n_heads=H, grid=(3, 4))  # one row per token, as in ViT
    assert learned.table.shape == (13, D)


@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_sequence_positions_refuse_a_grid_in_one_line(kind):
    with pytest.raises(ConfigError) as err:
        KINDS[kind](max_len=MAX_LEN, d_model=D, n_heads=H, grid=(4, 4))
    msg = str(err.value)
    assert msg == (f"pos={kind} is a 1-D sequence position; patches sit on a 2-D grid: "
                   f"use learned, sinusoidal or none")
    assert isinstance(err.value, UserError)


def test_rotary_needs_an_even_head_dim_and_heads_that_divide():
    with pytest.raises(ConfigError, match=r"^pos=rotary needs an even head dimension, but model\.net\.d_model=24 / model\.net\.n_heads=8 = 3$"):
        RotaryPositions(max_len=MAX_LEN, d_model=24, n_heads=8)
    with pytest.raises(ConfigError, match=r"^model\.net\.d_model=30 is not divisible by model\.net\.n_heads=4"):
        ALiBiPositions(max_len=MAX_LEN, d_model=30, n_heads=4)


def test_rotary_positions_rotate_like_the_embedding_and_base_is_honoured():
    pos = RotaryPositions(max_len=MAX_LEN, d_model=D, n_heads=H, base=500.0)
    ref = RotaryEmbedding(D // H, MAX_LEN, 500.0)
    q, k = torch.randn(1, H, 3, D // H), torch.randn(1, 2, 3, D // H)  # GQA: fewer key heads
    for a, b in zip(pos.attention.rotate(q, k, 4), ref(q, k, offset=4)):
        assert torch.equal(a, b)
    assert not torch.allclose(RotaryEmbedding(D // H, MAX_LEN).cos, ref.cos)


def test_attention_positions_base_is_neutral():
    base = AttentionPositions()
    q, k = torch.randn(1, H, 2, 8), torch.randn(1, H, 2, 8)
    assert base.rotate(q, k, 5) == (q, k)
    assert base.score_bias(torch.arange(2), torch.arange(2)) is None
