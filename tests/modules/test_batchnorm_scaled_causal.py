"""norm=batch (BatchNorm over batch and positions), unscaled attention (attn.scaled) and the causal LM's `causal`
switch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models.causal_lm import CausalLM
from attnlab.modules.attention import capture_attention
from attnlab.modules.norm import SequenceBatchNorm
from attnlab.modules.parts import BlockParts
from attnlab.builders import load_part
from attnlab.modules.stack import build_layer
from attnlab.runs.build import build_model

from helpers import compose_train

D = 16
BATCH = load_part("norm", "batch")


def test_batchnorm_normalizes_each_feature_over_batch_and_time_and_tracks_running_stats():
    torch.manual_seed(0)
    bn = SequenceBatchNorm(D).train()
    assert isinstance(bn, SequenceBatchNorm)
    x = 3 * torch.randn(4, 7, D) + torch.arange(D)  # a different mean per feature
    y = bn(x)
    torch.testing.assert_close(y.mean((0, 1)), torch.zeros(D), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var((0, 1), unbiased=False), torch.ones(D), atol=1e-3, rtol=0)
    # not per token (that would be LayerNorm): a token's features are not centered
    assert y.mean(-1).abs().max() > 0.1
    torch.testing.assert_close(bn.running_mean, 0.1 * x.mean((0, 1)), atol=1e-5, rtol=0)
    # eval: running statistics, so each token's output depends on that token only
    bn.eval()
    one = bn(x[:1, :3])
    torch.testing.assert_close(one, bn(x)[:1, :3])
    expected = (x - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps)
    torch.testing.assert_close(bn(x), expected, atol=1e-5, rtol=1e-5)


def test_batchnorm_padding_is_left_out_of_the_statistics():
    torch.manual_seed(0)
    x = torch.randn(3, 6, D)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 4:] = mask[2, 2:] = False
    garbage = x.clone()
    garbage[~mask] = 1e3  # whatever the pads hold must not move the real tokens' outputs
    masked, reference = SequenceBatchNorm(D).train(), SequenceBatchNorm(D).train()
    y = masked(garbage, mask)
    ref = reference(x[mask])  # the real tokens alone, as an (N, D) batch
    torch.testing.assert_close(y[mask], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked.running_mean, reference.running_mean)
    torch.testing.assert_close(masked.running_var, reference.running_var)
    assert masked.num_batches_tracked == 1
    # gradients flow through the masked statistics
    g = torch.randn_like(garbage).requires_grad_()
    masked(g, mask).pow(2).sum().backward()
    assert torch.isfinite(g.grad).all()
    with pytest.raises(ValueError, match="padding_mask"):
        masked(x, mask[:, :5])


def test_block_hands_its_padding_mask_to_batchnorm():
    torch.manual_seed(0)
    block = build_layer(D, 2, BlockParts.resolve(norm=BATCH), cross_attention=True).train()
    assert all(isinstance(n, SequenceBatchNorm) for n in (block.sa_norm, block.ca_norm, block.ffn_norm))
    x, memory = torch.randn(2, 5, D), torch.randn(2, 4, D)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    noisy = x.clone()
    noisy[~mask] = 50.0
    torch.manual_seed(1)
    a = block(x, memory, padding_mask=mask)
    torch.manual_seed(1)
    b = block(noisy, memory, padding_mask=mask)
    torch.testing.assert_close(a[mask], b[mask], atol=1e-4, rtol=1e-4)


def test_causal_lm_with_batchnorm_trains_then_decodes_with_running_stats():
    model = make_lm(norm=BATCH).train()
    ids = torch.randint(0, 40, (8, 12), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert model.decoder.layers[0].sa_norm.num_batches_tracked == 30
    model.eval()  # running statistics: the KV-cache path gives the full forward's logits
    caches = model.new_caches(2)
    stepped = torch.cat([model(ids[:2, :5], caches), *(model(ids[:2, t : t + 1], caches) for t in range(5, 11))], 1)
    torch.testing.assert_close(stepped, model(ids[:2, :11]), atol=1e-4, rtol=1e-4)


def make_lm(**kw) -> CausalLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=2, max_len=16, dropout=0.0)
    return CausalLM(**{**cfg, **kw}).eval()


def test_unscaled_attention_multiplies_scores_by_sqrt_head_dim():
    scaled, unscaled = make_lm(), make_lm(attn=load_part("attn", "mha", scaled=False))
    unscaled.load_state_dict(scaled.state_dict())
    for a, b in zip(scaled.decoder.layers, unscaled.decoder.layers):
        assert a.self_attn.scale == pytest.approx(1 / math.sqrt(16)) and b.self_attn.scale == 1.0
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(scaled(ids), unscaled(ids), atol=1e-4)
    # same weights: with the scale set back to 1/√d the outputs agree
    for b in unscaled.decoder.layers:
        b.self_attn.scale = 1 / math.sqrt(16)
    torch.testing.assert_close(scaled(ids), unscaled(ids))


def test_non_causal_lm_sees_the_future_and_cache_decoding_stays_causal():
    model = make_lm(causal=False)
    ids = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 40
    # without the mask, changing the last token changes the logits at position 0
    assert not torch.allclose(model(ids)[0, 0], model(changed)[0, 0], atol=1e-5)
    with capture_attention(model) as maps:
        model(ids)
    assert maps["decoder.layers.0.self_attn"][0, :, 0, 1:].sum() > 0  # position 0 attends to later ones
    # decoding with a KV cache is causal: it equals the full forward with the mask switched on
    caches = model.new_caches(1)
    stepped = torch.cat([model(ids[:, :4], caches), *(model(ids[:, t : t + 1], caches) for t in range(4, 10))], 1)
    model.causal = True
    torch.testing.assert_close(stepped, model(ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(ids)[0, 0], model(changed)[0, 0])


def test_config_flags_reach_the_net(tmp_path):
    cfg = compose_train(["model=causal_lm", "norm=batch", "attn.scaled=false", "model.net.causal=false",
                         "model.net.n_layers=2"], tmp_path)
    net = build_model(cfg.model).net
    assert net.causal is False
    assert all(b.self_attn.scale == 1.0 for b in net.decoder.layers)
    assert all(isinstance(b.sa_norm, SequenceBatchNorm) for b in net.decoder.layers)
    assert isinstance(net.decoder.final_norm, SequenceBatchNorm)
    cfg = compose_train(["model=causal_lm", "model.net.n_layers=2"], tmp_path)
    net = build_model(cfg.model).net
    assert net.causal is True and all(b.self_attn.scale < 1 for b in net.decoder.layers)
    assert isinstance(net.decoder.layers[0].sa_norm, nn.LayerNorm)
