"""Norm layers as the norm group builds them (conf/norm/*.yaml): kinds, parameter counts, RMSNorm's unit RMS."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.modules.norm import RMSNorm
from attnlab.core.errors import PartError
from attnlab.modules.parts import resolve_norm
from attnlab.builders import load_part
from attnlab.core.paths import CONF_DIR


def build_norm(option: str, dim: int, **layer) -> nn.Module:
    """The layer `norm=<option> norm.layer.<key>=<value>` puts in a block of width ``dim``."""
    return resolve_norm(load_part("norm", option, layer=layer)).layer(dim)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_layernorm_type_and_params():
    m = build_norm("pre", 24)
    assert type(m) is nn.LayerNorm
    assert n_params(m) == 2 * 24
    assert m.eps == 1e-5


def test_rmsnorm_type_and_params():
    m = build_norm("rms", 24, eps=1e-6)
    assert type(m) is RMSNorm and isinstance(m, nn.RMSNorm)
    assert n_params(m) == 24
    assert m.eps == 1e-6


def test_rmsnorm_output_has_unit_rms_and_keeps_mean():
    torch.manual_seed(0)
    m = build_norm("rms", 32)
    x = 3 * torch.randn(4, 5, 32) + 2
    y = m(x)
    rms = y.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(4, 5), atol=1e-4, rtol=0)
    # unlike LayerNorm, it does not re-center: y is x rescaled per token
    ratio = y / x
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio), atol=1e-4, rtol=1e-4)
    assert y.mean(-1).abs().min() > 0.1


def test_layernorm_output_is_centered():
    torch.manual_seed(0)
    y = build_norm("pre", 32)(3 * torch.randn(4, 32) + 2)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4), atol=1e-3, rtol=0)


def test_unknown_norm_option():
    options = ", ".join(sorted(p.stem for p in (CONF_DIR / "norm").glob("*.yaml")))  # whatever conf/norm holds
    with pytest.raises(PartError, match=f"no norm option 'groupnorm'; choose one of {options}$"):
        build_norm("groupnorm", 8)


@pytest.mark.parametrize("shape, eps", [((3, 7, 24), 1e-5), ((64, 128), None), ((2, 4, 5, 16), 1e-6)])
def test_rmsnorm_fast_path_matches_torch(shape, eps):
    """The CPU fast path of `norm=rms` gives torch.nn.RMSNorm's output and gradients (input and gain)."""
    torch.manual_seed(0)
    ours, ref = RMSNorm(shape[-1], eps=eps), nn.RMSNorm(shape[-1], eps=eps)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    assert ours._fast_path(torch.randn(shape))
    x = (3 * torch.randn(shape) + 0.5).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    upstream = torch.randn(shape)
    y, y_ref = ours(x), ref(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    y.backward(upstream)
    y_ref.backward(upstream)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # the inference branch (no autograd)
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    assert ours.state_dict().keys() == ref.state_dict().keys()


def test_rmsnorm_fast_path_gradcheck_and_fallbacks():
    torch.manual_seed(0)
    m = RMSNorm(6, eps=1e-5).double()
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: RMSNorm.forward(m, x), (x, m.weight))
    # torch's own forward where the fast path does not apply: bf16, autocast, no gain
    assert not m.float()._fast_path(torch.randn(3, 6, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not m._fast_path(torch.randn(3, 6))
    assert not RMSNorm(6, elementwise_affine=False)._fast_path(torch.randn(3, 6))
