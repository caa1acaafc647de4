"""Config specs, the block builder, encoder/decoder blocks."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from attnlab.modules.attention import KVCache, MultiHeadAttention
from attnlab.modules.block import DecoderBlock, DecoderCache, EncoderBlock, build_block, build_final_norm
from attnlab.modules.feedforward import FeedForward
from attnlab.modules.moe import MixtureOfExperts
from attnlab.modules.positional import RotaryEmbedding
from attnlab.modules.spec import FFNSpec, MoESpec, NormSpec, PosSpec

D, H = 32, 4
ATOL = 1e-5

NORMS = {
    "pre": dict(name="pre", kind="layernorm", placement="pre"),
    "post": dict(name="post", kind="layernorm", placement="post"),
    "rms": dict(name="rms", kind="rmsnorm", placement="pre"),
}
FFNS = {a: dict(name=a, activation=a) for a in ("relu", "gelu", "swiglu")}
MOES = {"off": dict(name="off", enabled=False), "on": dict(name="on", enabled=True, num_experts=3, top_k=2)}


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize("cls", [NormSpec, FFNSpec, MoESpec, PosSpec])
def test_from_cfg_unknown_key(cls):
    with pytest.raises(ValueError, match="bogus_key"):
        cls.from_cfg({"name": "x", "bogus_key": 1})


@pytest.mark.parametrize("cls", [NormSpec, FFNSpec, MoESpec, PosSpec])
def test_from_cfg_defaults_instances_and_type_errors(cls):
    default = cls.from_cfg(None)
    assert default == cls()
    assert cls.from_cfg(default) is default
    with pytest.raises(TypeError):
        cls.from_cfg(["name"])


def test_from_cfg_values():
    spec = NormSpec.from_cfg({"kind": "rmsnorm", "placement": "pre", "eps": 1e-6})
    assert (spec.kind, spec.placement, spec.eps) == ("rmsnorm", "pre", 1e-6)
    assert FFNSpec.from_cfg({"activation": "swiglu", "hidden_mult": 3.0}).hidden_mult == 3.0
    assert MoESpec.from_cfg({"enabled": True, "num_experts": 4}).num_experts == 4
    assert PosSpec.from_cfg({"kind": "rotary"}).kind == "rotary"


@pytest.mark.parametrize(
    "cls, cfg, field",
    [
        (NormSpec, {"kind": "groupnorm"}, "kind"),
        (NormSpec, {"placement": "sandwich"}, "placement"),
        (FFNSpec, {"activation": "tanh"}, "activation"),
        (PosSpec, {"kind": "alibi"}, "kind"),
    ],
)
def test_invalid_kinds(cls, cfg, field):
    with pytest.raises(ValueError, match=f"{cls.__name__}.{field}"):
        cls.from_cfg(cfg)


# --------------------------------------------------------------------------- build_block grid

NORM_TYPES = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}
ACT_TYPES = {"relu": nn.ReLU, "gelu": nn.GELU, "swiglu": nn.SiLU}


@pytest.mark.parametrize("norm, ffn, moe", list(itertools.product(NORMS, FFNS, MOES)))
def test_build_block_grid(norm, ffn, moe):
    torch.manual_seed(0)
    block = build_block(D, H, norm=NORMS[norm], ffn=FFNS[ffn], moe=MOES[moe]).eval()
    assert type(block) is EncoderBlock
    assert isinstance(block.self_attn, MultiHeadAttention) and not block.self_attn.is_cross
    kind = NORMS[norm]["kind"]
    assert type(block.sa_norm) is NORM_TYPES[kind] and type(block.ffn_norm) is NORM_TYPES[kind]
    assert block.sa_norm is not block.ffn_norm
    assert block.placement == NORMS[norm]["placement"]
    if moe == "on":
        assert isinstance(block.ffn, MixtureOfExperts)
        assert block.ffn.num_experts == 3 and block.ffn.top_k == 2
        experts = list(block.ffn.experts)
        assert len({id(e) for e in experts}) == 3
    else:
        assert type(block.ffn) is FeedForward
        experts = [block.ffn]
    for e in experts:
        assert type(e.activation) is ACT_TYPES[ffn]
        assert (e.gate_proj is not None) == (ffn == "swiglu")
    x = torch.randn(2, 5, D)
    y = block(x, is_causal=True)
    assert y.shape == (2, 5, D)
    assert torch.isfinite(y).all()
    assert not torch.allclose(y, x)


def test_pre_and_post_placement_differ_and_follow_their_formulas():
    torch.manual_seed(0)
    pre = build_block(D, H, norm=NORMS["pre"]).eval()
    post = build_block(D, H, norm=NORMS["post"]).eval()
    post.load_state_dict(pre.state_dict())
    # non-trivial norm parameters so that the two orders are visibly different
    with torch.no_grad():
        for b in (pre, post):
            b.sa_norm.weight.uniform_(0.5, 1.5)
            b.ffn_norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, D)
    y_pre, y_post = pre(x), post(x)
    assert not torch.allclose(y_pre, y_post, atol=1e-3)
    h = x + pre.self_attn(pre.sa_norm(x))
    torch.testing.assert_close(y_pre, h + pre.ffn(pre.ffn_norm(h)), atol=ATOL, rtol=0)
    h = post.sa_norm(x + post.self_attn(x))
    torch.testing.assert_close(y_post, post.ffn_norm(h + post.ffn(h)), atol=ATOL, rtol=0)
    # post-norm output is normalized per token (fresh LayerNorm weight 1, bias changed -> mean = bias mean)
    torch.testing.assert_close(y_post.mean(-1), post.ffn_norm.bias.mean().expand(2, 5), atol=1e-4, rtol=0)


def test_block_placement_checked():
    with pytest.raises(ValueError, match="placement"):
        EncoderBlock(MultiHeadAttention(D, H), nn.Identity(), nn.Identity(), nn.Identity(), placement="middle")


def test_block_padding_mask_and_rotary_pass_through():
    torch.manual_seed(0)
    rope = RotaryEmbedding(D // H, 16)
    block = build_block(D, H, rotary=rope).eval()
    assert block.self_attn.rotary is rope
    x = torch.randn(2, 6, D)
    pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    y = block(x, padding_mask=pad)
    x2 = x.clone()
    x2[1, 4:] = torch.randn(2, D)
    y2 = block(x2, padding_mask=pad)
    torch.testing.assert_close(y[:, :4], y2[:, :4], atol=ATOL, rtol=0)
    torch.testing.assert_close(y[0], y2[0], atol=ATOL, rtol=0)
    assert not torch.allclose(block(x)[1, :4], block(x2)[1, :4], atol=1e-4)  # the mask mattered


# --------------------------------------------------------------------------- decoder block


def make_decoder(memory_dim=None, norm="pre", seed=0) -> DecoderBlock:
    torch.manual_seed(seed)
    return build_block(D, H, norm=NORMS[norm], cross_attention=True, memory_dim=memory_dim).eval()


def test_decoder_block_structure():
    dec = make_decoder(memory_dim=24)
    assert type(dec) is DecoderBlock
    assert dec.cross_attn.is_cross and not dec.self_attn.is_cross
    assert dec.cross_attn.kv_proj.in_features == 24
    assert len({id(dec.sa_norm), id(dec.ca_norm), id(dec.ffn_norm)}) == 3
    assert make_decoder().cross_attn.kv_proj.in_features == D


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_output_depends_on_memory(norm):
    dec = make_decoder(norm=norm)
    x, mem = torch.randn(2, 4, D), torch.randn(2, 6, D)
    y = dec(x, mem)
    assert y.shape == (2, 4, D)
    assert not torch.allclose(y, dec(x, torch.randn(2, 6, D)), atol=1e-4)


def test_decoder_is_causal_by_default():
    dec = make_decoder()
    x, mem = torch.randn(2, 5, D), torch.randn(2, 6, D)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(2, 2, D)
    torch.testing.assert_close(dec(x, mem)[:, :3], dec(x2, mem)[:, :3], atol=ATOL, rtol=0)
    assert not torch.allclose(dec(x, mem, is_causal=False)[:, :3], dec(x2, mem, is_causal=False)[:, :3], atol=1e-4)


def test_decoder_respects_memory_padding():
    dec = make_decoder(memory_dim=24)
    x, mem = torch.randn(2, 4, D), torch.randn(2, 6, 24)
    mpad = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    mem2 = mem.clone()
    mem2[1, 3:] = 10 * torch.randn(3, 24)
    y = dec(x, mem, memory_padding_mask=mpad)
    torch.testing.assert_close(y, dec(x, mem2, memory_padding_mask=mpad), atol=ATOL, rtol=0)
    assert not torch.allclose(dec(x, mem), dec(x, mem2), atol=1e-4)  # the padding mask mattered


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_cache_equals_full_pass(norm):
    dec = make_decoder(memory_dim=24, norm=norm)
    b, t, s = 2, 5, 6
    x, mem = torch.randn(b, t, D), torch.randn(b, s, 24)
    mpad = torch.tensor([[True] * s, [True] * 4 + [False] * 2])
    full = dec(x, mem, memory_padding_mask=mpad)
    cache = DecoderCache(KVCache(b, H, D // H, t), KVCache(b, H, D // H, s))
    outs = [dec(x[:, :2], mem, memory_padding_mask=mpad, cache=cache)]
    for i in range(2, t):
        outs.append(dec(x[:, i : i + 1], None, memory_padding_mask=mpad, cache=cache))
    assert cache.self_attn.length == t and cache.cross_attn.length == s
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=ATOL, rtol=0)


def test_decoder_cache_reorder():
    cache = DecoderCache(KVCache(3, H, 2, 4), KVCache(3, H, 2, 5))
    cache.self_attn.append(torch.arange(3.0).view(3, 1, 1, 1).expand(3, H, 1, 2), torch.zeros(3, H, 1, 2))
    cache.cross_attn.append(torch.arange(3.0).view(3, 1, 1, 1).expand(3, H, 5, 2), torch.zeros(3, H, 5, 2))
    cache.reorder(torch.tensor([1, 0, 0]))
    assert torch.equal(cache.self_attn.k[:, 0, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(cache.cross_attn.k[:, 0, 4, 1], torch.tensor([1.0, 0.0, 0.0]))


# --------------------------------------------------------------------------- final norm


@pytest.mark.parametrize("norm, expected", [("pre", nn.LayerNorm), ("rms", nn.RMSNorm), ("post", nn.Identity)])
def test_build_final_norm(norm, expected):
    m = build_final_norm(NORMS[norm], D)
    assert type(m) is expected
    if expected is not nn.Identity:
        assert m.normalized_shape == (D,)


def test_build_final_norm_default_is_pre_layernorm():
    assert type(build_final_norm(None, D)) is nn.LayerNorm
