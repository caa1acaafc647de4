"""The sequence classifier's three encoders (claim E7): shapes, what each output position can depend on (the CNN's
receptive field 1 + L(k-1), the RNN's and attention's whole past), and the block groups reaching the attention."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.sequence_classifier import SequenceClassifier
from attnlab.builders import load_part
from attnlab.modules.positional import RotaryEmbedding, RotaryPositions

pytestmark = pytest.mark.usefixtures("one_thread")


def make(encoder: str, **kw) -> SequenceClassifier:
    torch.manual_seed(0)
    return SequenceClassifier(vocab_size=12, num_classes=5, max_len=24, encoder=encoder, d_model=16, n_heads=2, **kw)


def dependence(net: SequenceClassifier, t: int, length: int = 24) -> list[int]:
    """Input positions whose embedding changes output position t (non-zero gradient)."""
    x = torch.randn(2, length, net.d_model, requires_grad=True)
    out = net.encoder(x)[:, t]
    (out * torch.randn_like(out)).sum().backward()  # a random direction: the sum of a LayerNorm output is constant
    return (x.grad.abs().sum(dim=(0, 2)) > 0).nonzero().flatten().tolist()


@pytest.mark.parametrize("encoder,extra", [("rnn", {}), ("rnn", {"bidirectional": True}), ("cnn", {}),
                                           ("attention", {}), ("attention", {"pool": "mean"})])
def test_logits_shape_for_every_encoder(encoder, extra):
    net = make(encoder, **extra)
    ids = torch.randint(0, 12, (3, 24))
    assert net(ids).shape == (3, 5)
    assert net.features(ids).shape == (3, 24, 16)
    assert net(ids[:, :10]).shape == (3, 5)  # shorter sequences too
    assert net.flops_per_token(24) > 0 and net.num_params(non_embedding=False) > net.num_params()


@pytest.mark.parametrize("n_layers,kernel_size", [(1, 3), (2, 5), (3, 3), (4, 2)])
def test_cnn_output_sees_exactly_its_receptive_field(n_layers, kernel_size):
    net = make("cnn", n_layers=n_layers, kernel_size=kernel_size)
    r = 1 + n_layers * (kernel_size - 1)
    assert net.receptive_field == r
    t = 20
    assert dependence(net, t) == list(range(t - r + 1, t + 1))  # causal: the r positions ending at t


def test_rnn_and_attention_outputs_see_the_whole_past():
    assert dependence(make("rnn"), 20) == list(range(21))  # left to right: positions 0 … t
    assert dependence(make("rnn", bidirectional=True), 20) == list(range(24))
    assert dependence(make("attention"), 20) == list(range(24))  # non-causal: every position
    assert make("rnn").receptive_field is None and make("attention").receptive_field is None
    assert make("rnn", n_layers=2).sequential_steps == 48 and make("attention").sequential_steps == 2


def test_block_groups_reach_the_attention_encoder_only():
    net = make("attention", norm=load_part("norm", "rms"), pos=load_part("pos", "rotary"))
    assert all(isinstance(b.sa_norm, torch.nn.RMSNorm) for b in net.encoder.layers)
    # rotary adds nothing to the embeddings: it lives in every self-attention
    assert isinstance(net.positions, RotaryPositions)
    assert isinstance(net.positions.attention, RotaryEmbedding)
    assert all(b.self_attn.positions is net.positions.attention for b in net.encoder.layers)
    assert not any(isinstance(m, torch.nn.RMSNorm) for m in make("cnn", norm=load_part("norm", "rms")).modules())


def test_bad_choices_fail_clearly():
    with pytest.raises(ValueError, match="unknown encoder 'lstm'"):
        make("lstm")
    with pytest.raises(ValueError, match="unknown pool 'max'"):
        make("rnn", pool="max")
    with pytest.raises(ValueError, match="max_len=24"):
        make("cnn")(torch.zeros(1, 30, dtype=torch.long))
