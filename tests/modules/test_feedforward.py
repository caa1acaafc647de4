"""Feed-forward parts as the ffn group builds them (conf/ffn/*.yaml): module parts, hidden sizes, parameter parity."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.modules.feedforward import FeedForward, ffn_hidden_dim
from attnlab.core.errors import PartError
from attnlab.modules.parts import resolve_part
from attnlab.builders import load_part

GATED = {"relu": False, "gelu": False, "swiglu": True, "geglu": True}


def build_ffn(option: str, dim: int, dropout: float = 0.0, **overrides) -> FeedForward:
    """What `ffn=<option> ffn.<key>=<value>` builds for a layer of width ``dim``."""
    return resolve_part("ffn", load_part("ffn", option, **overrides), None)(dim=dim, dropout=dropout)


def hidden(option: str, dim: int, mult: float = 4.0, multiple_of: int = 8) -> int:
    return ffn_hidden_dim(dim, mult, multiple_of, GATED[option])


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    "activation, act_type, gated",
    [("relu", nn.ReLU, False), ("gelu", nn.GELU, False), ("swiglu", nn.SiLU, True), ("geglu", nn.GELU, True)],
)
def test_builds_the_named_modules(activation, act_type, gated):
    torch.manual_seed(0)
    ffn = build_ffn(activation, 16)
    assert isinstance(ffn, FeedForward)
    assert type(ffn.activation) is act_type
    assert (ffn.gate_proj is not None) is gated
    h = hidden(activation, 16)
    assert ffn.up_proj.weight.shape == (h, 16)
    assert ffn.down_proj.weight.shape == (16, h)
    if gated:
        assert ffn.gate_proj.weight.shape == (h, 16)
    x = torch.randn(2, 3, 16)
    assert ffn(x).shape == (2, 3, 16)


def test_forward_formulas():
    torch.manual_seed(0)
    x = torch.randn(5, 16)
    relu = build_ffn("relu", 16)
    torch.testing.assert_close(relu(x), relu.down_proj(torch.relu(relu.up_proj(x))))
    sw = build_ffn("swiglu", 16)
    ref = sw.down_proj(nn.functional.silu(sw.gate_proj(x)) * sw.up_proj(x))
    torch.testing.assert_close(sw(x), ref)
    # gate and up are different maps: swapping them changes the output
    swapped = sw.down_proj(nn.functional.silu(sw.up_proj(x)) * sw.gate_proj(x))
    assert not torch.allclose(sw(x), swapped, atol=1e-4)


@pytest.mark.parametrize("dim, mult, multiple_of", [(384, 4.0, 8), (64, 4.0, 8), (100, 2.0, 16), (30, 3.0, 64)])
def test_hidden_dim_rule(dim, mult, multiple_of):
    dense = hidden("relu", dim, mult, multiple_of)
    assert dense == hidden("gelu", dim, mult, multiple_of)
    assert dense == multiple_of * math.ceil(mult * dim / multiple_of)
    gated = hidden("swiglu", dim, mult, multiple_of)
    assert gated % multiple_of == 0
    assert 2 * mult * dim / 3 <= gated < 2 * mult * dim / 3 + multiple_of


def test_hidden_dim_known_values():
    assert hidden("relu", 384) == 1536
    assert hidden("swiglu", 384) == 1024
    assert hidden("swiglu", 100) == 272  # 266.67 rounded up to a multiple of 8


def test_swiglu_params_match_relu_within_two_percent():
    relu, sw = build_ffn("relu", 384, hidden_mult=4.0), build_ffn("swiglu", 384, hidden_mult=4.0)
    assert n_params(relu) == 2 * 384 * 1536 + 1536 + 384  # with biases
    assert n_params(sw) == 3 * 384 * 1024  # bias-free
    assert abs(n_params(sw) - n_params(relu)) / n_params(relu) < 0.02
    # E10's size (d = 128): 132,096 vs 131,712, 0.3 % apart
    assert n_params(build_ffn("swiglu", 128)) == 3 * 128 * 344 and n_params(build_ffn("relu", 128)) == 131_712


@pytest.mark.parametrize("option", list(GATED))
def test_gated_units_are_bias_free_by_default_and_take_biases_on_request(option):
    """LLaMA/PaLM's SwiGLU (and Shazeer's GLU variants) have no biases; the plain FFN keeps the Transformer's."""
    def linears(m: FeedForward) -> list[nn.Linear]:
        return [m.up_proj, m.down_proj] + ([m.gate_proj] if m.gate_proj is not None else [])

    default = build_ffn(option, 16)
    assert all((lin.bias is None) == GATED[option] for lin in linears(default))
    assert all(lin.bias is not None for lin in linears(build_ffn(option, 16, bias=True)))  # ffn.bias=true
    assert all(lin.bias is None for lin in linears(build_ffn(option, 16, bias=False)))
    # the same default in code as in the YAML
    code = FeedForward(16, gated=GATED[option])
    assert [lin.bias is None for lin in linears(code)] == [lin.bias is None for lin in linears(default)]


def test_bias_switch_and_dropout():
    ffn = build_ffn("gelu", 8, bias=False, dropout=0.5)
    assert ffn.up_proj.bias is None and ffn.down_proj.bias is None
    assert isinstance(ffn.dropout, nn.Dropout)
    assert isinstance(build_ffn("gelu", 8).dropout, nn.Identity)


def test_unknown_option_and_bad_activation_are_one_line_errors():
    with pytest.raises(PartError, match="no ffn option 'tanh'"):
        build_ffn("tanh", 8)
    with pytest.raises(PartError, match="ffn.activation: cannot build torch.nn.NoSuchActivation: no such class") as e:
        load_part("ffn", "relu", activation={"_target_": "torch.nn.NoSuchActivation"})
    assert "\n" not in str(e.value)
    with pytest.raises(PartError, match="ffn: cannot build .*FeedForward: got an unexpected keyword argument 'dim_ff'"):
        load_part("ffn", "relu", dim_ff=8)
    # one module for every layer (a config without _partial_) is refused, not shared
    with pytest.raises(PartError, match=r"^ffn\.activation=PReLU\(.*\): must build one module per layer .*_partial_: true"):
        FeedForward(8, nn.PReLU())


def test_geglu_is_one_yaml_file_and_computes_gelu_gating():
    """The example of docs/adding_a_variant.md: conf/ffn/geglu.yaml, no code."""
    torch.manual_seed(0)
    ffn = build_ffn("geglu", 16)
    x = torch.randn(3, 16)
    torch.testing.assert_close(ffn(x), ffn.down_proj(nn.functional.gelu(ffn.gate_proj(x)) * ffn.up_proj(x)))
