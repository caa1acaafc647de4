"""beam_size=1 in translation is greedy decoding: the argmax chain the LM's generate emits at temperature 0.

A beam of one *without* early stopping (what translation's beam search uses for beam > 1) may keep searching after
its first finished hypothesis and end on another one; on random peaked scorers that happens in a few rows, which is
why beam 1 takes the greedy loop."""

from __future__ import annotations

import pytest
import torch

from attnlab.decoding import DecodingOptions, SamplingOptions, beam_search, generate, greedy_search
from attnlab.models.transformer_mt import TransformerMT
from attnlab.tasks.translation import TranslationTask

V, BOS, EOS = 24, 1, 2
pytestmark = pytest.mark.usefixtures("one_thread")


def peaked_mt(seed: int) -> TransformerMT:
    torch.manual_seed(seed)
    net = TransformerMT(vocab_size=V, d_model=32, n_layers=1, n_heads=4, max_len=24, dropout=0.0, tie_embeddings=False)
    with torch.no_grad():  # peaked logits, so that EOS comes early on some rows and late on others
        net.head.weight.mul_(12.0)
    return net.eval()


def sources(seed: int, b: int = 8, s: int = 6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    lengths = torch.randint(2, s + 1, (b,), generator=g)
    return src, torch.arange(s)[None] < lengths[:, None]


def task_for(net: TransformerMT) -> TranslationTask:
    task = TranslationTask(net=net)  # a built module passes through
    return task.eval()


@pytest.mark.parametrize("force", [True, False], ids=["force_eos", "no_eos"])
@pytest.mark.parametrize("seed", range(6))
def test_beam_one_in_translation_is_the_argmax_chain_of_generate(seed, force):
    """Either length-limit rule: the argmax chain up to the limit; fairseq's (force) then appends a scored EOS to
    a row the limit cut, so its tokens are the chain's and its log-prob the chain's plus that EOS's."""
    net = peaked_mt(seed)
    src, mask = sources(seed)
    res = task_for(net).translate_batch(src, mask, DecodingOptions(max_len_a=1.0, max_len_b=3,
                                                                   force_eos_at_max_len=force))
    limits = (mask.sum(1) + 3).tolist()
    chain = generate(net.stepper(src, mask), torch.full((8, 1), BOS), SamplingOptions(max(limits), temperature=0.0),
                     eos_id=EOS)[:, 1:]
    cut = 0
    for b, hyp in enumerate(res.best):
        want = chain[b, : limits[b]]
        stop = (want == EOS).nonzero()
        want = want[: int(stop[0]) + 1] if len(stop) else torch.cat([want, torch.tensor([EOS] * force)])
        cut += not len(stop)
        assert torch.equal(hyp, want), (b, hyp.tolist(), want.tolist())
        # its log-prob is the chain's: the sum of log p of each chosen token
        full = torch.cat([torch.tensor([BOS]), hyp])
        lp = net(src[b : b + 1], mask[b : b + 1], full[None, :-1]).log_softmax(-1)[0]
        assert res.logprobs[b, 0].item() == pytest.approx(lp.gather(1, hyp[:, None]).sum().item(), abs=1e-4)
    assert cut > 0 or seed in (0, 5)  # seeds 1-4 have rows the limit cuts (where the rules differ): 8, 5, 3, 8


def test_a_beam_of_one_without_early_stopping_can_end_elsewhere():
    """The control: the path beam 1 took before. Over these scorers at least one row ends on a hypothesis that is
    not the argmax chain (so the test above could fail), while greedy_search never does."""
    differ = 0
    for seed in range(6):
        net = peaked_mt(seed)
        src, mask = sources(seed)
        limits = (mask.sum(1) + 3).tolist()
        prefix = torch.full((8, 1), BOS)
        old = beam_search(net.stepper(src, mask), prefix, DecodingOptions(), limits=limits, eos_id=EOS)
        new = greedy_search(net.stepper(src, mask), prefix, DecodingOptions(), limits=limits, eos_id=EOS)
        differ += sum(not torch.equal(a, b) for a, b in zip(old.best, new.best))
    assert differ > 0


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_forced_eos_fits_the_decoders_positions(beam_size):
    """At a limit clamped to the decoder's positions (max_len - 1, <bos> taking one), the forced EOS needs no input
    position of its own: a row that runs to the limit ends in EOS, max_len tokens in all, without an error."""
    torch.manual_seed(0)
    net = TransformerMT(vocab_size=V, d_model=32, n_layers=1, n_heads=4, max_len=6, dropout=0.0, tie_embeddings=False)
    with torch.no_grad():
        net.head.weight.mul_(12.0)
    src, mask = torch.randint(3, V, (8, 6)), torch.ones(8, 6, dtype=torch.bool)
    task = task_for(net.eval())
    kw = dict(beam_size=beam_size, max_len_a=2.0, max_len_b=10)  # a·6 + b = 22, clamped to max_len - 1 = 5
    cut = task.translate_batch(src, mask, DecodingOptions(force_eos_at_max_len=False, **kw)).best
    forced = task.translate_batch(src, mask, DecodingOptions(force_eos_at_max_len=True, **kw)).best
    ran_to_limit = [len(h) == 5 and EOS not in h.tolist() for h in cut]
    assert sum(ran_to_limit) >= 4  # (with this seed: all 8)
    for h, at_limit in zip(forced, ran_to_limit):
        assert len(h) <= 6 and h[-1] == EOS and EOS not in h[:-1]
        assert len(h) == 6 or not at_limit
