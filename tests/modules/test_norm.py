"""Norm layers as the norm group builds them (conf/norm/*.yaml): kinds, parameter counts, RMSNorm's unit RMS."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.modules.parts import PartError, load_part, resolve_norm


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
    assert type(m) is nn.RMSNorm
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
    with pytest.raises(PartError, match="no norm option 'groupnorm'; choose one of batch, post, pre, rms"):
        build_norm("groupnorm", 8)
