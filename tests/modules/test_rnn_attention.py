import pytest
import torch

from attnlab.modules.attention import capture_attention
from attnlab.modules.rnn_attention import ATTENTION_KINDS, RNNAttention


def batch(B=3, S=6, D=8):
    torch.manual_seed(0)
    memory = torch.randn(B, S, D)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 4:] = False  # row 1: 4 real tokens
    mask[2, 1:] = False  # row 2: a single real token
    return torch.randn(B, D), memory, mask


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_weights_sum_to_one_over_real_tokens_and_are_zero_on_padding(kind):
    query, memory, mask = batch()
    attn = RNNAttention(kind, 8, 8)
    context, weights = attn(query, memory, mask)
    assert weights.shape == (3, 6) and context.shape == (3, 8)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    assert (weights[~mask] == 0).all()
    assert (weights[mask] > 0).all()
    assert weights[2, 0] == 1.0  # one real token takes all the weight
    torch.testing.assert_close(context, torch.einsum("bs,bsd->bd", weights, memory))


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_padding_values_do_not_matter(kind):
    query, memory, mask = batch()
    attn = RNNAttention(kind, 8, 8)
    garbage = memory.masked_fill(~mask[..., None], 1e3)
    for a, b in zip(attn(query, memory, mask), attn(query, garbage, mask)):
        torch.testing.assert_close(a, b)


def test_scores_are_the_documented_formulas():
    query, memory, mask = batch()
    full = torch.ones_like(mask)
    add = RNNAttention("bahdanau", 8, 8, d_attn=5)
    e = add.v(torch.tanh(add.query_proj(query)[:, None] + add.memory_proj(memory))).squeeze(-1)  # v·tanh(Wq + Uh)
    torch.testing.assert_close(add(query, memory, full)[1], e.softmax(-1))
    dot = RNNAttention("luong_dot", 8, 8)
    torch.testing.assert_close(dot(query, memory, full)[1], torch.einsum("bd,bsd->bs", query, memory).softmax(-1))
    gen = RNNAttention("luong_general", 6, 8)
    q6 = query[:, :6]
    expected = torch.einsum("bd,bsd->bs", q6, gen.memory_proj(memory)).softmax(-1)  # q · W_a h
    torch.testing.assert_close(gen(q6, memory, full)[1], expected)
    # the precomputed keys give the same result as computing them in the call
    torch.testing.assert_close(add(query, memory, mask, add.project_memory(memory)), add(query, memory, mask))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown attention 'cosine'"):
        RNNAttention("cosine", 8, 8)
    with pytest.raises(ValueError, match="luong_dot needs d_query == d_memory"):
        RNNAttention("luong_dot", 8, 6)


def test_rows_are_recorded_per_call_and_captured():
    query, memory, mask = batch()

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cross_attn = RNNAttention("bahdanau", 8, 8)

    holder = Holder()
    holder.cross_attn(query, memory, mask)
    assert holder.cross_attn.weights is None  # nothing kept unless asked
    with capture_attention(holder) as maps:
        rows = [holder.cross_attn(query + i, memory, mask)[1] for i in range(4)]
    assert maps["cross_attn"].shape == (3, 1, 4, 6)
    torch.testing.assert_close(maps["cross_attn"][:, 0], torch.stack(rows, dim=1))
    assert holder.cross_attn.weights is None and not holder.cross_attn.return_weights
