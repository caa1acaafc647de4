"""Parts from the config groups, the layer/stack builders, encoder/decoder blocks."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from torch import nn

from attnlab.modules.attention import KVCache, MultiHeadAttention
from attnlab.modules.block import DecoderBlock, DecoderCache, EncoderBlock
from attnlab.modules.feedforward import FeedForward
from attnlab.modules.moe import MixtureOfExperts
from attnlab.modules.norm import RMSNorm
from attnlab.core.errors import PartError
from attnlab.modules.parts import BlockParts, Norm, resolve_norm, resolve_part
from attnlab.builders import load_part
from attnlab.modules.positional import RotaryEmbedding
from attnlab.modules.stack import TransformerStack, build_layer, build_stack

D, H = 32, 4
ATOL = 1e-5

NORMS = ("pre", "post", "rms")
FFNS = ("relu", "gelu", "swiglu")
MOES = ("off", "on")


def parts(norm="pre", ffn="gelu", moe="off", attn="mha") -> BlockParts:
    """The parts `python train.py norm=<norm> ffn=<ffn> moe=<moe> attn=<attn>` gives a model (conf/<group>/*.yaml)."""
    moe_cfg = load_part("moe", moe, num_experts=3) if moe == "on" else load_part("moe", moe)
    return BlockParts.resolve(load_part("norm", norm), load_part("ffn", ffn), moe_cfg, load_part("attn", attn))


def build_block(norm="pre", ffn="gelu", moe="off", **kw) -> EncoderBlock:
    return build_layer(D, H, parts(norm, ffn, moe), **kw)


# --------------------------------------------------------------------------- parts


def test_code_defaults_are_the_default_config_groups():
    """A model built in Python without parts gets what `python train.py` picks (conf/train.yaml's defaults)."""
    torch.manual_seed(0)
    default = build_layer(D, H, BlockParts())
    torch.manual_seed(0)
    from_conf = build_layer(D, H, parts("pre", "gelu", "off", "mha"))
    assert [(k, v.shape) for k, v in default.state_dict().items()] == \
        [(k, v.shape) for k, v in from_conf.state_dict().items()]
    assert [type(m) for m in default.modules()] == [type(m) for m in from_conf.modules()]
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(default.eval()(x), from_conf.eval()(x))


def test_parts_built_from_conf_or_in_python():
    norm = resolve_norm(load_part("norm", "rms", layer={"eps": 1e-6}))
    assert norm.placement == "pre" and type(norm.layer(D)) is RMSNorm and norm.layer(D).eps == 1e-6
    assert resolve_norm(norm) is norm and resolve_norm(None).placement == "pre"
    ffn = resolve_part("ffn", functools.partial(FeedForward, gated=True), None)
    assert ffn(dim=D).gate_proj is not None
    assert resolve_part("moe", load_part("moe", "off"), None) is None  # conf/moe/off.yaml is {}: dense
    assert resolve_part("moe", None, None) is None


LAYER = functools.partial(torch.nn.LayerNorm)


@pytest.mark.parametrize("bad, match", [
    ({"placement": "sandwich", "layer": LAYER}, "norm.placement"),
    ({"placement": "pre"}, "norm must be"),
    ({"placement": "pre", "layer": LAYER, "kind": "x"}, "unknown key"),
    ({"placement": "pre", "layer": {"_target_": "torch.nn.LayerNorm", "_partial_": True}},
     "norm.layer: got the config of torch.nn.LayerNorm, not the part: build it first"),
])
def test_bad_norm_parts_are_one_line_errors(bad, match):
    with pytest.raises(PartError, match=match) as e:
        resolve_norm(bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("group", ["ffn", "moe", "attn", "pos"])
def test_a_part_given_as_its_config_is_refused_not_built(group):
    """The parts build nothing from names: a config mapping is Hydra's or builders' to build."""
    with pytest.raises(PartError, match=f"^{group}: got the config of torch.nn.Identity, not the part"):
        resolve_part(group, {"_target_": "torch.nn.Identity", "_partial_": True}, None)


def test_builders_refuse_a_class_that_does_not_exist():
    with pytest.raises(PartError, match="^norm.layer: cannot build torch.nn.NoSuchNorm: no such class$"):
        load_part("norm", "pre", layer={"_target_": "torch.nn.NoSuchNorm"})


def test_load_part_unknown_option_names_the_choices():
    with pytest.raises(PartError, match="no attn option 'bogus'; choose one of .*gqa.*mha.*mqa"):
        load_part("attn", "bogus")


def test_a_norm_placement_must_be_known():
    with pytest.raises(PartError, match=r"^norm\.placement=middle: choose one of pre, post$"):
        Norm(nn.LayerNorm, "middle")


# --------------------------------------------------------------------------- build_layer grid

NORM_TYPES = {"pre": nn.LayerNorm, "post": nn.LayerNorm, "rms": RMSNorm}
ACT_TYPES = {"relu": nn.ReLU, "gelu": nn.GELU, "swiglu": nn.SiLU}


@pytest.mark.parametrize("norm, ffn, moe", list(itertools.product(NORMS, FFNS, MOES)))
def test_build_layer_grid(norm, ffn, moe):
    torch.manual_seed(0)
    block = build_block(norm, ffn, moe).eval()
    assert type(block) is EncoderBlock
    assert isinstance(block.self_attn, MultiHeadAttention) and not block.self_attn.is_cross
    assert type(block.sa_norm) is NORM_TYPES[norm] and type(block.ffn_norm) is NORM_TYPES[norm]
    assert block.sa_norm is not block.ffn_norm
    assert block.pre_norm == (norm != "post")
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
    pre = build_block("pre").eval()
    post = build_block("post").eval()
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


def test_block_padding_mask_and_rotary_pass_through():
    torch.manual_seed(0)
    rope = RotaryEmbedding(D // H, 16)
    block = build_block(positions=rope).eval()
    assert block.self_attn.positions is rope
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
    return build_block(norm, cross_attention=True, memory_dim=memory_dim).eval()


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


# --------------------------------------------------------------------------- stacks and final norm


@pytest.mark.parametrize("norm, expected", [("pre", nn.LayerNorm), ("rms", RMSNorm), ("post", nn.Identity)])
def test_stack_final_norm_follows_the_placement(norm, expected):
    stack = build_stack(2, D, H, parts(norm))
    assert type(stack) is TransformerStack and len(stack) == 2
    assert type(stack.final_norm) is expected
    if expected is not nn.Identity:
        assert stack.final_norm.normalized_shape == (D,)


def test_stack_equals_its_layers_then_final_norm():
    torch.manual_seed(0)
    stack = build_stack(3, D, H, parts("rms", "swiglu")).eval()
    x = torch.randn(2, 5, D)
    h = x
    for layer in stack.layers:
        h = layer(h, is_causal=True)
    torch.testing.assert_close(stack(x, is_causal=True), stack.final_norm(h))


@pytest.mark.parametrize("attn, kv_heads", [("mha", H), ("gqa", 2), ("mqa", 1)])
def test_stack_caches_are_sized_by_the_attention(attn, kv_heads):
    stack = build_stack(2, D, H, parts(attn=attn), cross_attention=True)
    caches = stack.new_caches(3, 7, memory_len=5)
    assert len(caches) == 2 and all(isinstance(c, DecoderCache) for c in caches)
    assert caches[0].self_attn.k.shape == (3, kv_heads, 7, D // H)
    assert caches[0].cross_attn.k.shape == (3, kv_heads, 5, D // H)


def test_stack_returns_the_cross_weights_it_is_asked_for_explicitly():
    """What a copy pointer or a guided-attention loss reads: returned, not left on modules by toggled flags."""
    torch.manual_seed(0)
    stack = build_stack(2, D, H, parts(), cross_attention=True).eval()
    x, mem = torch.randn(2, 4, D), torch.randn(2, 6, D)
    mpad = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    out, weights = stack.forward_with_cross_weights(x, [-1], memory=mem, memory_padding_mask=mpad)
    torch.testing.assert_close(out, stack(x, memory=mem, memory_padding_mask=mpad))
    assert list(weights) == [1] and weights[1].shape == (2, H, 4, 6)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(2, H, 4))
    assert (weights[1][1, :, :, 3:] == 0).all()  # padded sources get no weight
    assert not any(m.return_weights for m in stack.modules() if isinstance(m, MultiHeadAttention))
