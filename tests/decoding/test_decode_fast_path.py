"""The decoding fast path computes what the plain forward computes: double-buffered KV-cache reorders,
and translation beams that keep their source's cross-attention keys/values without copying them."""

from __future__ import annotations

import pytest
import torch

from attnlab.decoding import CausalLMStepper, DecodingOptions, beam_search, generate
from attnlab.models.causal_lm import CausalLM
from attnlab.models.transformer_mt import TransformerMT
from attnlab.modules.attention import KVCache
from attnlab.builders import load_part

V = 40
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pos", ["learned", "rotary"])
def test_cached_decoding_logits_equal_the_full_forward_without_autograd(pos):
    """What generate() runs (no autograd): each step's logits equal a full forward."""
    torch.manual_seed(0)
    model = CausalLM(V, d_model=32, n_layers=2, n_heads=4, max_len=16, dropout=0.0, pos=load_part("pos", pos)).eval()
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stepper = CausalLMStepper(model, use_cache=True)
        got = [stepper.prefill(x[:, :4])] + [stepper.step(x[:, t]) for t in range(4, 12)]
        full = model(x)[:, 3:]
    torch.testing.assert_close(torch.stack(got, dim=1), full, atol=1e-5, rtol=0)


def test_reorder_reuses_its_buffers_and_keeps_the_right_rows():
    torch.manual_seed(0)
    cache = KVCache(2, 2, 4, max_len=8)
    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    cache.append(k, v)
    expect_k, expect_v = k, v
    for index in ([1, 1, 0, 0, 1], [4, 0, 2, 2, 3], [3, 1], [0, 1]):  # grow (beam expansion), permute, shrink
        index = torch.tensor(index)
        cache.reorder(index)
        expect_k, expect_v = expect_k[index], expect_v[index]
        assert torch.equal(cache.k[:, :, :3], expect_k) and torch.equal(cache.v[:, :, :3], expect_v)
    before = cache.k.data_ptr(), cache._spare_k.data_ptr()
    cache.reorder(torch.tensor([1, 0]))
    cache.reorder(torch.tensor([1, 0]))
    assert (cache.k.data_ptr(), cache._spare_k.data_ptr()) == before  # two buffers, swapped: no new allocation
    assert torch.equal(cache.k[:, :, :3], expect_k)


def test_translation_beams_equal_recomputation_when_sentences_finish_apart(monkeypatch):
    """MT beam search skips the cross-attention reorder while every sentence is still in the batch and copies it
    when one leaves: both must give what recomputing the decoder gives."""
    from attnlab.modules.block import DecoderCache

    crossed = []
    original = DecoderCache.reorder
    monkeypatch.setattr(DecoderCache, "reorder",
                        lambda self, index, cross=True: (crossed.append(cross), original(self, index, cross))[1])
    torch.manual_seed(0)
    net = TransformerMT(V, d_model=32, n_layers=2, n_heads=4, max_len=24, dropout=0.0).eval()
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V, (4, 6), generator=g)
    mask = torch.arange(6)[None] < torch.tensor([6, 5, 3, 2])[:, None]
    bos = torch.full((4, 1), 1)
    # each sentence's own length limit (a·src_len + b): they leave the batch at different steps
    options = DecodingOptions(beam_size=3, n_best=2, max_len_a=1.0, max_len_b=2, early_stopping=True)
    kw = dict(limits=options.limits(mask.sum(1)), eos_id=2)
    cached = beam_search(net.stepper(src, mask, use_cache=True), bos, options, **kw)
    assert True in crossed and False in crossed  # both reorder paths ran
    fresh = beam_search(net.stepper(src, mask, use_cache=False), bos, options, **kw)
    assert [[h.tolist() for h in row] for row in cached.tokens] == [[h.tolist() for h in row] for row in fresh.tokens]
    torch.testing.assert_close(cached.scores, fresh.scores, atol=1e-5, rtol=1e-5)
