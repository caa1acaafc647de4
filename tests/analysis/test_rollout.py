import pytest
import torch

from attnlab.analysis.rollout import attention_rollout, prediction_attribution


def random_attention(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g).softmax(dim=-1)


def test_rows_sum_to_one():
    maps = [random_attention(2, 3, 5, 5, seed=s) for s in range(4)]
    r = attention_rollout(maps)
    assert r.shape == (2, 5, 5)
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 5))
    assert (r >= 0).all()


def test_identity_attention_gives_identity():
    eye = torch.eye(6).expand(1, 4, 6, 6)
    torch.testing.assert_close(attention_rollout([eye, eye, eye]), torch.eye(6)[None])


def test_two_layers_by_hand():
    a1 = torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[1.0, 0.0], [0.4, 0.6]]])  # (H=2, 2, 2), unbatched
    a2 = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [0.6, 0.4]]])
    # heads averaged: A1 = [[.75, .25], [.3, .7]], A2 = [[0, 1], [.8, .2]]; + I, rows normalized (÷2)
    b1 = torch.tensor([[0.875, 0.125], [0.15, 0.85]])
    b2 = torch.tensor([[0.5, 0.5], [0.4, 0.6]])
    expected = b2 @ b1  # the later layer on the left: [[.5125, .4875], [.44, .56]]
    r = attention_rollout([a1, a2])
    assert r.shape == (2, 2)
    torch.testing.assert_close(r, expected)
    torch.testing.assert_close(r, torch.tensor([[0.5125, 0.4875], [0.44, 0.56]]))
    # without the residual identity it is the plain product of the head-averaged maps
    torch.testing.assert_close(attention_rollout([a1, a2], add_identity=False), a2.mean(0) @ a1.mean(0))


def test_prediction_attribution_mean_and_cls():
    r = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]])
    mean = prediction_attribution(r, "mean")
    torch.testing.assert_close(mean, r.mean(dim=1))
    cls = prediction_attribution(r, "cls", prefix=1)  # row 0, columns 1: re-normalized
    torch.testing.assert_close(cls, torch.tensor([[0.6, 0.4]]))
    mean_cls = prediction_attribution(r, "mean", prefix=1)  # patch rows 1, 2, patch columns 1, 2
    torch.testing.assert_close(mean_cls, torch.tensor([[0.8, 0.9]]) / 1.7)
    torch.testing.assert_close(prediction_attribution(r[0], "mean"), r[0].mean(0))


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])
    with pytest.raises(ValueError, match="expected"):
        attention_rollout([torch.ones(2, 3, 4)])
    with pytest.raises(ValueError, match="unknown pool"):
        prediction_attribution(torch.eye(3)[None], "max")
