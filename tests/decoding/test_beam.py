"""Beam search: exact checks on a hand-made bigram stepper, beam 1 == greedy, beam as wide as the search space ==
exhaustive search (under each length-limit rule: EOS forced and scored at the limit, fairseq's, or not), beam ≥
greedy on average, KV cache == recomputation (reorder), n-best, max/min length, EOS."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor

from attnlab.decoding import (BeamResult, CausalLMStepper, DecodingOptions, SamplingOptions, beam_search, generate,
                              greedy_search)
from attnlab.models.causal_lm import CausalLM


def search(stepper, prefix: Tensor, *, src_lengths=None, eos_id: int | None = None, vocab_size: int | None = None,
           expand_prefix: bool = False, early_stopping: bool = True, **options) -> BeamResult:
    """:func:`beam_search` with its :class:`DecodingOptions` spelled out (fairseq's early stopping unless told);
    ``src_lengths``: what the max_len_a/b limits are taken from (default: the prefix length)."""
    opts = DecodingOptions(early_stopping=early_stopping, **options)
    limits = opts.limits(src_lengths) if src_lengths is not None else None
    return beam_search(stepper, prefix, opts, limits=limits, eos_id=eos_id, vocab_size=vocab_size,
                       expand_prefix=expand_prefix)


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------
class TableStepper:
    """A Stepper test double: the next-token distribution is ``table[last token]`` (a bigram model), so every
    sequence's probability is known exactly. Records what the search feeds it and the batch sizes it sees."""

    def __init__(self, table: list[list[float]]):
        self.logp = torch.tensor(table, dtype=torch.float).log()  # zeros -> -inf logits: impossible tokens
        self.last: Tensor | None = None
        self.fed: list[list[int]] = []
        self.calls = 0

    def _out(self) -> Tensor:
        self.calls += 1
        return self.logp[self.last]

    def prefill(self, prefix: Tensor) -> Tensor:
        self.last = prefix[:, -1]
        return self._out()

    def step(self, token: Tensor) -> Tensor:
        assert token.shape == self.last.shape, "step() must get one token per current row"
        self.fed.append(token.tolist())
        self.last = token
        return self._out()

    def reorder(self, index: Tensor) -> None:
        self.last = self.last.index_select(0, index)

    def seq_logprob(self, start: int, seq: list[int]) -> float:
        return sum(float(self.logp[a, b]) for a, b in zip([start] + seq[:-1], seq))


# bigram table over {0: EOS, 1: x, 2: y, 3: z, 4: start}
EOS = 0
START = 4


def trap_table() -> list[list[float]]:
    """Greedy takes x (0.5) then at best 0.34: p = 0.17; y then EOS has p = 0.4 · 0.9 = 0.36."""
    return [
        [1.0, 0.0, 0.0, 0.0, 0.0],  # after EOS (never used)
        [0.0, 0.34, 0.33, 0.33, 0.0],  # x: flat
        [0.9, 0.05, 0.0, 0.05, 0.0],  # y: EOS likely
        [0.1, 0.0, 0.0, 0.9, 0.0],  # z: z again
        [0.1, 0.5, 0.4, 0.0, 0.0],  # start
    ]


def make_lm(vocab: int, seed: int = 0, scale: float = 20.0, max_len: int = 32) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(vocab, d_model=32, n_layers=2, n_heads=4, max_len=max_len, dropout=0.0, tie_embeddings=False)
    with torch.no_grad():  # peaked (not near-uniform) logits, untied so a token does not just predict itself
        model.embed.weight.mul_(scale)
        model.head.weight.mul_(scale)
    return model.eval()


def prompts(vocab: int, b: int, t: int = 5, seed: int = 1, low: int = 0) -> Tensor:
    return torch.randint(low, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def lm_logprob(model: CausalLM, prefix: Tensor, seq: Tensor) -> float:
    """Sum of log p(seq | prefix) by one full forward pass (no stepper, no cache)."""
    ids = torch.cat([prefix, seq])[None]
    lp = model(ids[:, :-1])[0, -len(seq):].float().log_softmax(-1)
    return float(lp.gather(-1, seq[:, None]).sum())


def check_well_formed(res: BeamResult, eos_id: int | None, length_penalty: float) -> None:
    for hyps, scores, logprobs in zip(res.tokens, res.scores, res.logprobs):
        for h, sc, lp in zip(hyps, scores.tolist(), logprobs.tolist()):
            if eos_id is not None:
                assert eos_id not in h[:-1].tolist(), "no token after EOS"
            assert sc == pytest.approx(lp / len(h) ** length_penalty, rel=1e-5, abs=1e-6)
        assert scores[: len(hyps)].tolist() == sorted(scores[: len(hyps)].tolist(), reverse=True)


# --------------------------------------------------------------------------------------------------------------
# exact checks on the bigram stepper
# --------------------------------------------------------------------------------------------------------------
def test_beam_escapes_the_greedy_trap():
    prefix = torch.tensor([[START]])  # x never precedes EOS here: the hypotheses stop at the limit as they are
    greedy = search(TableStepper(trap_table()), prefix, beam_size=1, max_new_tokens=2, eos_id=EOS,
                         length_penalty=0.0, force_eos_at_max_len=False)
    assert greedy.best[0].tolist() == [1, 1]
    assert greedy.logprobs[0, 0] == pytest.approx(math.log(0.5 * 0.34))
    beam = search(TableStepper(trap_table()), prefix, beam_size=2, max_new_tokens=2, eos_id=EOS,
                       length_penalty=0.0, n_best=2, force_eos_at_max_len=False)
    assert [h.tolist() for h in beam.tokens[0]] == [[2, EOS], [1, 1]]
    assert beam.logprobs[0].tolist() == pytest.approx([math.log(0.36), math.log(0.17)])
    check_well_formed(beam, EOS, 0.0)


def test_scores_are_fairseq_length_normalized():
    res = search(TableStepper(trap_table()), torch.tensor([[START]]), beam_size=3, max_new_tokens=3,
                      eos_id=EOS, length_penalty=1.0, n_best=3)
    check_well_formed(res, EOS, 1.0)
    best = res.best[0].tolist()
    assert best == [2, EOS] and res.scores[0, 0] == pytest.approx(math.log(0.36) / 2)


@pytest.mark.parametrize("force", [True, False], ids=["force_eos", "no_eos"])
def test_finished_sentences_leave_the_batch_and_no_step_is_wasted(force):
    # row 0 starts at y (EOS 0.9, so done after one step with beam 1), row 1 at z (z again 0.9: runs to max)
    stepper = TableStepper(trap_table())
    res = search(stepper, torch.tensor([[2], [3]]), beam_size=1, max_new_tokens=4, eos_id=EOS,
                      force_eos_at_max_len=force)
    assert [h.tolist() for h in res.best] == [[EOS], [3, 3, 3, 3] + [EOS] * force]
    assert res.logprobs[1, 0] == pytest.approx(4 * math.log(0.9) + force * math.log(0.1))
    assert [len(f) for f in stepper.fed] == [1] * (3 + force)  # only row 1 is still stepped
    assert stepper.calls == 4 + force  # prefill + 3 steps for 4 tokens (+ 1 for the forced EOS's log-prob)
    assert all(EOS not in f for f in stepper.fed)  # EOS is never fed back: finished hypotheses leave the beam


def test_min_len_forbids_early_eos():
    table = trap_table()
    for min_len in (0, 1, 2, 3):
        res = search(TableStepper(table), torch.tensor([[2], [START]]), beam_size=3, max_new_tokens=6,
                          eos_id=EOS, min_len=min_len, n_best=3)
        for hyps in res.tokens:
            for h in hyps:
                if h[-1] == EOS:
                    assert len(h) >= min_len + 1  # at least min_len tokens before EOS
        if min_len == 0:
            assert res.best[0].tolist() == [EOS]
        else:
            assert len(res.best[0]) > min_len


@pytest.mark.parametrize("force", [True, False], ids=["force_eos", "no_eos"])
def test_max_len_a_b_and_src_lengths(force):
    rare_eos = [[0.01, 0.495, 0.495, 0.0, 0.0]] * 5  # EOS never in the beam: every hypothesis runs to the limit
    prefix = torch.full((3, 4), START)

    def lengths(**kw) -> list[int]:
        res = search(TableStepper(rare_eos), prefix, beam_size=2, eos_id=EOS, n_best=2,
                          force_eos_at_max_len=force, **kw)
        assert all(len(h) == len(hyps[0]) for hyps in res.tokens for h in hyps)
        assert all((h[-1] == EOS) == force and EOS not in h[:-1] for hyps in res.tokens for h in hyps)
        return [len(hyps[0]) - force for hyps in res.tokens]  # tokens before the (forced) EOS

    assert lengths(max_new_tokens=3) == [3, 3, 3]
    assert lengths(max_len_a=0.0, max_len_b=2) == [2, 2, 2]
    assert lengths(max_len_a=1.5, max_len_b=1) == [7, 7, 7]  # int(1.5 · 4 + 1), src_len = prefix length
    assert lengths(max_len_a=1.0, max_len_b=1, src_lengths=torch.tensor([1, 3, 5])) == [2, 4, 6]
    assert lengths(max_len_a=0.5, max_len_b=0, src_lengths=[2, 7, 4]) == [1, 3, 2]
    assert lengths(max_len_a=0.1, max_len_b=0) == [1, 1, 1]  # at least one token
    assert lengths() == [18, 18, 18]  # the defaults: 2 · 4 + 10
    with pytest.raises(ValueError, match="one max length >= 1 per row"):
        beam_search(TableStepper(rare_eos), prefix, DecodingOptions(beam_size=2), limits=[3, 0, 3])
    with pytest.raises(ValueError, match=r"n_best=3 is not allowed: an integer from 1 to beam_size \(2\)"):
        search(TableStepper(rare_eos), prefix, beam_size=2, n_best=3, max_new_tokens=2)


def test_without_eos_id_every_hypothesis_runs_to_max_length():
    res = search(TableStepper(trap_table()), torch.tensor([[START]]), beam_size=3, max_new_tokens=3, n_best=3)
    assert all(len(h) == 3 for h in res.tokens[0])
    assert EOS in torch.cat(res.tokens[0]).tolist()  # EOS is an ordinary token here


def test_early_stopping_false_searches_on_for_longer_better_normalized_hypotheses():
    # start: EOS 0.6, x 0.4; x -> x 0.99. Greedy stops at EOS (score log 0.6); x·8 scores (log 0.4 + 7 log 0.99)/8
    # when the limit ends it without EOS (with a forced EOS: test_forced_eos_at_the_limit_is_scored below)
    table = [[1, 0, 0, 0, 0], [0.01, 0.99, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0.6, 0.4, 0, 0, 0]]
    kw = dict(beam_size=1, max_new_tokens=8, eos_id=EOS, length_penalty=1.0, force_eos_at_max_len=False)
    fairseq = search(TableStepper(table), torch.tensor([[START]]), early_stopping=True, **kw)
    assert fairseq.best[0].tolist() == [EOS]
    full = search(TableStepper(table), torch.tensor([[START]]), early_stopping=False, **kw)
    assert full.best[0].tolist() == [1] * 8
    assert full.scores[0, 0] == pytest.approx((math.log(0.4) + 7 * math.log(0.99)) / 8)
    # with no length normalization, nothing longer can beat the finished EOS: both stop at once
    stepper = TableStepper(table)
    plain = search(stepper, torch.tensor([[START]]), early_stopping=False, **{**kw, "length_penalty": 0.0})
    assert plain.best[0].tolist() == [EOS] and stepper.calls == 1


def test_forced_eos_at_the_limit_is_scored_and_can_change_the_winner():
    """fairseq's rule: the x-run cut by the limit pays for its EOS (log 0.01) and one more length unit. At limit 8
    that makes it lose to the early EOS (which it beat without the rule); at 20 its mean log-prob wins again."""
    table = [[1, 0, 0, 0, 0], [0.01, 0.99, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0.6, 0.4, 0, 0, 0]]
    kw = dict(beam_size=1, eos_id=EOS, length_penalty=1.0, early_stopping=False, n_best=1)
    x_run = lambda n: (math.log(0.4) + (n - 1) * math.log(0.99) + math.log(0.01)) / (n + 1)  # noqa: E731
    at8 = search(TableStepper(table), torch.tensor([[START]]), max_new_tokens=8, **kw)
    assert at8.best[0].tolist() == [EOS] and x_run(8) < math.log(0.6)
    at20 = search(TableStepper(table), torch.tensor([[START]]), max_new_tokens=20, **kw)
    assert at20.best[0].tolist() == [1] * 20 + [EOS]
    assert at20.scores[0, 0] == pytest.approx(x_run(20)) and at20.logprobs[0, 0] == pytest.approx(x_run(20) * 21)
    # the limit wins over min_len: EOS is forced at the limit even where min_len still forbids it
    capped = search(TableStepper(table), torch.tensor([[START]]), max_new_tokens=3, min_len=5, **kw)
    assert capped.best[0].tolist() == [1, 1, 1, EOS]


def test_vocab_size_masks_ids_beyond_it():
    res = search(TableStepper(trap_table()), torch.tensor([[START]]), beam_size=4, max_new_tokens=3,
                      eos_id=EOS, vocab_size=2, n_best=4)  # only EOS and x allowed
    assert all(set(h.tolist()) <= {0, 1} for h in res.tokens[0])


# --------------------------------------------------------------------------------------------------------------
# a small causal LM
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("force", [True, False], ids=["force_eos", "no_eos"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_one_is_greedy(use_cache, length_penalty, force):
    V = 40
    model = make_lm(V)
    prefix = prompts(V, 6)
    free = generate(CausalLMStepper(model), prefix, SamplingOptions(10, temperature=0))[:, 5:]
    eos = int(free[0, 3])  # a token greedy really emits, so some rows stop early and some do not
    greedy = generate(CausalLMStepper(model, use_cache=use_cache), prefix, SamplingOptions(10, temperature=0),
                      eos_id=eos)[:, 5:]
    res = search(CausalLMStepper(model, use_cache=use_cache), prefix, beam_size=1, max_new_tokens=10,
                      eos_id=eos, length_penalty=length_penalty, force_eos_at_max_len=force)
    chain = greedy_search(CausalLMStepper(model, use_cache=use_cache), prefix,
                          DecodingOptions(length_penalty=length_penalty, force_eos_at_max_len=force),
                          limits=[10] * len(prefix), eos_id=eos)
    n_stopped = 0
    for row, hyp, other in zip(greedy.tolist(), res.best, chain.best):
        expected = row[: row.index(eos) + 1] if eos in row else row + [eos] * force  # the forced EOS
        assert other.tolist() == expected
        n_stopped += eos in row
        assert hyp.tolist() == expected
    assert 0 < n_stopped < len(prefix)
    check_well_formed(res, eos, length_penalty)
    torch.testing.assert_close(chain.scores, res.scores, atol=1e-5, rtol=0)  # same rule, same scores
    torch.testing.assert_close(chain.logprobs, res.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("force", [True, False], ids=["force_eos", "no_eos"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_full_width_beam_equals_exhaustive_search(length_penalty, force):
    V, L, eos = 4, 4, 0
    model = make_lm(V, scale=8.0)
    prefix = prompts(V, 2, t=3)
    res = search(CausalLMStepper(model), prefix, beam_size=V**L, max_new_tokens=L, eos_id=eos,
                      length_penalty=length_penalty, n_best=V**L, force_eos_at_max_len=force)
    # every sequence that ends in EOS, or reaches length L without one: then, under fairseq's rule (force), with
    # EOS appended, its log-prob in the sum and in the length; otherwise as it is
    space = [list(s) + [eos] for n in range(L) for s in itertools.product(range(1, V), repeat=n)]
    space += [list(s) + [eos] * force for s in itertools.product(range(1, V), repeat=L)]
    assert len(space) == 1 + 3 + 9 + 27 + 81
    for b in range(len(prefix)):
        scored = sorted(((lm_logprob(model, prefix[b], torch.tensor(s)) / len(s) ** length_penalty, s)
                         for s in space), key=lambda x: -x[0])
        found = [(sc, h.tolist()) for sc, h in zip(res.scores[b].tolist(), res.tokens[b])]
        assert len(found) == len(space)  # the beam explored the whole space; the rest of n_best is -inf
        assert math.isinf(res.scores[b, len(space)]) and res.scores[b, len(space)] < 0
        assert found[0][1] == scored[0][1]
        assert found[0][0] == pytest.approx(scored[0][0], abs=1e-4)
        assert [sc for sc, _ in found] == pytest.approx([sc for sc, _ in scored], abs=1e-4)
        assert sorted(h for _, h in found) == sorted(space)
        assert scored[0][0] - scored[1][0] > 1e-3  # the best is not a float-noise tie
    # and a narrower beam is no better than the exhaustive best
    narrow = search(CausalLMStepper(model), prefix, beam_size=2, max_new_tokens=L, eos_id=eos,
                         length_penalty=length_penalty, force_eos_at_max_len=force)
    assert (narrow.scores[:, 0] <= res.scores[:, 0] + 1e-5).all()


def test_wider_beam_finds_more_probable_outputs_than_greedy():
    V, eos = 40, 0
    model = make_lm(V, scale=6.0)
    prefix = prompts(V, 16, low=1)
    kw = dict(max_new_tokens=8, eos_id=eos, length_penalty=0.0)
    greedy = generate(CausalLMStepper(model), prefix, SamplingOptions(8, temperature=0), eos_id=eos)[:, 5:]
    greedy_lp = []
    for p, row in zip(prefix, greedy.tolist()):
        seq = row[: row.index(eos) + 1] if eos in row else row + [eos]  # EOS forced at the limit (the default)
        greedy_lp.append(lm_logprob(model, p, torch.tensor(seq)))
    one = search(CausalLMStepper(model), prefix, beam_size=1, **kw)
    assert one.logprobs[:, 0].tolist() == pytest.approx(greedy_lp, abs=1e-4)
    five = search(CausalLMStepper(model), prefix, beam_size=5, **kw)
    rescored = [lm_logprob(model, p, h) for p, h in zip(prefix, five.best)]
    assert five.logprobs[:, 0].tolist() == pytest.approx(rescored, abs=1e-4)  # reported = true log-probs
    assert five.logprobs[:, 0].mean() >= torch.tensor(greedy_lp).mean()
    assert (five.logprobs[:, 0] > torch.tensor(greedy_lp) + 1e-3).any()  # and strictly better somewhere


@pytest.mark.parametrize("max_len", [32, 10], ids=["fits", "slides"])
def test_cache_recompute_and_prefix_expansion_agree(max_len):
    V = 40
    model = make_lm(V, max_len=max_len)
    prefix = prompts(V, 3)
    eos = int(generate(CausalLMStepper(model), prefix, SamplingOptions(6, temperature=0))[1, -1])
    runs = [search(CausalLMStepper(model, use_cache=c), prefix, beam_size=4, max_new_tokens=12, eos_id=eos,
                        n_best=4, expand_prefix=e) for c, e in [(True, False), (False, False), (True, True)]]
    for other in runs[1:]:
        assert [[h.tolist() for h in hyps] for hyps in other.tokens] == \
            [[h.tolist() for h in hyps] for hyps in runs[0].tokens]
        torch.testing.assert_close(other.scores, runs[0].scores, atol=1e-4, rtol=0)
        torch.testing.assert_close(other.logprobs, runs[0].logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_n_best_distinct_and_sorted(length_penalty):
    V, eos = 40, 0
    model = make_lm(V, scale=6.0)
    prefix = prompts(V, 4, low=1)
    res = search(CausalLMStepper(model), prefix, beam_size=6, n_best=5, max_new_tokens=8, eos_id=eos,
                      length_penalty=length_penalty)
    assert res.scores.shape == res.logprobs.shape == (4, 5)
    for b, hyps in enumerate(res.tokens):
        assert len(hyps) == 5
        assert len({tuple(h.tolist()) for h in hyps}) == 5
        for h, lp in zip(hyps, res.logprobs[b].tolist()):
            assert lp == pytest.approx(lm_logprob(model, prefix[b], h), abs=1e-4)
    check_well_formed(res, eos, length_penalty)
    one = search(CausalLMStepper(model), prefix, beam_size=6, max_new_tokens=8, eos_id=eos,
                      length_penalty=length_penalty)
    assert [h.tolist() for h in one.best] == [hyps[0].tolist() for hyps in res.tokens]


def test_nan_logits_give_an_empty_hypothesis_not_a_crash():
    """A diverged model (NaN everywhere) finishes no hypothesis: each sentence gets an empty output scored -inf,
    so validation of a broken run reports BLEU 0 instead of raising IndexError mid-training."""
    table = [[float("nan")] * 5 for _ in range(5)]
    res = search(TableStepper(table), torch.tensor([[START], [START]]), beam_size=3, max_new_tokens=4,
                      eos_id=EOS)
    assert [t.numel() for t in res.best] == [0, 0]
    assert torch.isinf(res.scores[:, 0]).all() and (res.scores[:, 0] < 0).all()
