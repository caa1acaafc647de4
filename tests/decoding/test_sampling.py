"""Decoding: logit filtering (top-k, nucleus), temperature/greedy sampling, the generate loop (eos, early stop),
and the causal-LM stepper (KV cache == recomputation, sliding window past max_len, reorder)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attnlab.decoding import CausalLMStepper, SamplingOptions, Stepper, filter_logits, generate, sample_next
from attnlab.models.causal_lm import CausalLM
from attnlab.builders import load_part

V = 40
MOE_ON = load_part("moe", "on", num_experts=4, top_k=2)


pytestmark = pytest.mark.usefixtures("one_thread")


def finite_count(x: Tensor) -> Tensor:
    return torch.isfinite(x).sum(dim=-1)


# --------------------------------------------------------------------------------------------------------------
# filter_logits
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_top_k_keeps_exactly_k_largest(k):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 10, generator=g)  # continuous: no ties
    out = filter_logits(logits, top_k=k)
    assert finite_count(out).tolist() == [k] * 4
    top = logits.topk(k, dim=-1).indices
    kept = torch.isfinite(out)
    assert kept.gather(-1, top).all()
    # the kept logits are unchanged, the others are -inf
    assert torch.equal(out[kept], logits[kept])
    assert (out[~kept] == float("-inf")).all()


@pytest.mark.parametrize("k", [None, 0, 10, 50])
def test_top_k_off_or_at_least_vocab_keeps_all(k):
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(filter_logits(logits, top_k=k), logits)


# probs [0.5, 0.3, 0.15, 0.05]: cumulative 0.5, 0.8, 0.95, 1.0
@pytest.mark.parametrize("p, n_kept", [(0.01, 1), (0.4, 1), (0.7, 2), (0.75, 2), (0.85, 3), (0.9, 3), (0.97, 4)])
def test_top_p_keeps_smallest_prefix_reaching_p(p, n_kept):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    # several rows with the tokens in different orders, so the sort/scatter back is exercised
    perms = torch.stack([torch.tensor(q) for q in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2])])
    logits = probs.log()[perms]
    out = filter_logits(logits, top_p=p)
    assert finite_count(out).tolist() == [n_kept] * len(perms)
    for row, perm in zip(out, perms):
        kept_probs = sorted(probs[perm][torch.isfinite(row)].tolist(), reverse=True)
        assert kept_probs == pytest.approx(probs[:n_kept].tolist())  # the most probable n_kept tokens
        assert sum(kept_probs) >= p
        assert torch.isfinite(row[perm.argsort()[0]])  # the argmax (prob 0.5) is always kept


def test_top_p_always_keeps_argmax_even_when_it_alone_exceeds_p():
    logits = torch.tensor([[0.0, 8.0, 1.0, -2.0], [3.0, 3.1, 2.9, 0.0]])
    out = filter_logits(logits, top_p=1e-6)
    assert finite_count(out).tolist() == [1, 1]
    assert out.argmax(-1).tolist() == [1, 1]
    assert torch.isfinite(out.gather(-1, logits.argmax(-1, keepdim=True))).all()


@pytest.mark.parametrize("p", [None, 0.0, 1.0])
def test_top_p_off_keeps_all(p):
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(2))
    assert torch.equal(filter_logits(logits, top_p=p), logits)


def test_top_k_and_top_p_compose():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = filter_logits(probs.log(), top_k=2, top_p=0.99)  # top-p alone keeps 4, top-k cuts to 2
    assert finite_count(out).tolist() == [2]
    out = filter_logits(probs.log(), top_k=3, top_p=0.7)  # top-k keeps 3, top-p (of the renormalized 3) 2
    assert finite_count(out).tolist() == [2]


def test_filter_does_not_modify_input():
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
    before = logits.clone()
    filter_logits(logits, top_k=2, top_p=0.5)
    assert torch.equal(logits, before)


# --------------------------------------------------------------------------------------------------------------
# sample_next
# --------------------------------------------------------------------------------------------------------------
def test_temperature_zero_is_argmax():
    logits = torch.randn(16, V, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(0)
    out = sample_next(logits, SamplingOptions(temperature=0.0, top_k=3, top_p=0.5), g)
    assert torch.equal(out, logits.argmax(-1))
    assert out.shape == (16,) and out.dtype == torch.long


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(5))

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.stack([sample_next(logits, SamplingOptions(temperature=1.0), g) for _ in range(5)])

    a, b, c = draw(123), draw(123), draw(124)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def frequencies(logits: Tensor, n: int = 5000, seed: int = 0, **kw) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    draws = sample_next(logits.expand(n, -1), SamplingOptions(**kw), g)
    return torch.bincount(draws, minlength=logits.shape[-1]).float() / n


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    freq = frequencies(probs.log()[None])
    assert (freq - probs).abs().max() < 0.03, freq


def test_temperature_and_top_k_reshape_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    # temperature 2: p ∝ sqrt(p)
    hot = probs.sqrt() / probs.sqrt().sum()
    freq = frequencies(probs.log()[None], temperature=2.0)
    assert (freq - hot).abs().max() < 0.03, freq
    # top-k 2 renormalizes over the two kept tokens and never draws the third
    freq = frequencies(probs.log()[None], top_k=2)
    assert freq[2] == 0
    assert (freq[:2] - torch.tensor([2 / 3, 1 / 3])).abs().max() < 0.03, freq
    # top-p 0.7 keeps {0.6, 0.3}, same thing
    freq = frequencies(probs.log()[None], top_p=0.7)
    assert freq[2] == 0
    assert (freq[:2] - torch.tensor([2 / 3, 1 / 3])).abs().max() < 0.03, freq


# --------------------------------------------------------------------------------------------------------------
# generate() with a scripted stepper: eos handling and early stop
# --------------------------------------------------------------------------------------------------------------
class ScriptedStepper:
    """A test double of the :class:`Stepper` protocol: call i returns logits whose argmax for row r is
    ``script[r][i]`` (by a wide margin), and records the tokens the loop feeds back."""

    def __init__(self, script: list[list[int]], vocab: int = 6):
        self.script, self.vocab = script, vocab
        self.calls = 0
        self.fed: list[list[int]] = []
        self.prefix: Tensor | None = None

    def _logits(self) -> Tensor:
        logits = torch.zeros(len(self.script), self.vocab)
        for r, row in enumerate(self.script):
            logits[r, row[min(self.calls, len(row) - 1)]] = 30.0
        self.calls += 1
        return logits

    def prefill(self, prefix: Tensor) -> Tensor:
        self.prefix = prefix
        return self._logits()

    def step(self, token: Tensor) -> Tensor:
        self.fed.append(token.tolist())
        return self._logits()

    def reorder(self, index: Tensor) -> None:
        self.script = [self.script[i] for i in index.tolist()]


EOS = 2


def test_scripted_stepper_satisfies_protocol():
    s: Stepper = ScriptedStepper([[1]])  # type-checks structurally; and has the three methods
    assert all(callable(getattr(s, m)) for m in ("prefill", "step", "reorder"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_after_eos_keep_emitting_eos_and_loop_stops_when_all_done(temperature):
    # row 0 emits eos first, then the model "wants" 4; row 1 emits 1, 3, then eos
    stepper = ScriptedStepper([[EOS, 4, 4, 4, 4], [1, 3, EOS, 5, 5]])
    prefix = torch.tensor([[5, 5], [4, 4]])
    out = generate(stepper, prefix, SamplingOptions(max_new_tokens=10, temperature=temperature), eos_id=EOS,
                   generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[5, 5, EOS, EOS, EOS], [4, 4, 1, 3, EOS]]
    assert torch.equal(stepper.prefix, prefix)
    # after the last row finished, no further step is taken; done rows are fed eos, not the model's choice
    assert stepper.fed == [[EOS, 1], [EOS, 3]]
    assert stepper.calls == 3


def test_unfinished_rows_run_to_max_new_tokens():
    stepper = ScriptedStepper([[3, EOS, 4, 4, 4, 4, 4], [1, 1, 1, 1, 1, 1, 1]])
    out = generate(stepper, torch.tensor([[0], [0]]), SamplingOptions(max_new_tokens=6, temperature=0), eos_id=EOS)
    assert out.tolist() == [[0, 3, EOS, EOS, EOS, EOS, EOS], [0, 1, 1, 1, 1, 1, 1]]
    assert stepper.calls == 6  # prefill + 5 steps: no wasted step after the last token


def test_without_eos_id_eos_is_an_ordinary_token():
    stepper = ScriptedStepper([[EOS, 4, EOS, 1]])
    out = generate(stepper, torch.tensor([[0]]), SamplingOptions(max_new_tokens=4, temperature=0))
    assert out.tolist() == [[0, EOS, 4, EOS, 1]]


def test_one_new_token_takes_no_step():
    stepper = ScriptedStepper([[1]])
    prefix = torch.tensor([[3, 4, 5]])
    assert generate(stepper, prefix, SamplingOptions(max_new_tokens=1, temperature=0)).tolist() == [[3, 4, 5, 1]]
    assert stepper.fed == [] and stepper.calls == 1  # the prefill's logits give the token; nothing is fed back


# --------------------------------------------------------------------------------------------------------------
# CausalLMStepper: KV cache == recomputation
# --------------------------------------------------------------------------------------------------------------
def make_lm(pos: str = "learned", moe: dict | None = None, max_len: int = 16, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(V, d_model=32, n_layers=2, n_heads=4, max_len=max_len, dropout=0.0,
                     pos=load_part("pos", pos), moe=moe, tie_embeddings=False)
    with torch.no_grad():
        # Sharpen the logits: init std 0.02 leaves them almost uniform, so argmaxes would be near-ties decided by
        # float noise. Untied, so that a large embedding does not just make every token predict itself.
        model.embed.weight.mul_(20)
        model.head.weight.mul_(20)
    return model.eval()


def prompt(b: int = 3, t: int = 5, seed: int = 1) -> Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def run_both(model: CausalLM, prefix: Tensor, n: int, **kw) -> tuple[Tensor, Tensor]:
    outs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(7)
        stepper = CausalLMStepper(model, use_cache=use_cache)
        outs.append(generate(stepper, prefix, SamplingOptions(n, **kw), generator=g))
    return outs[0], outs[1]


CONFIGS = [("learned", None), ("rotary", None), ("learned", MOE_ON), ("rotary", MOE_ON)]
CONFIG_IDS = ["learned", "rotary", "learned-moe", "rotary-moe"]


@pytest.mark.parametrize("pos, moe", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, top_k=20, top_p=0.95)],
                         ids=["greedy", "sampled"])
def test_cache_equals_recompute_token_for_token(pos, moe, sampling):
    model = make_lm(pos, moe)
    prefix = prompt()
    cached, full = run_both(model, prefix, 10, **sampling)  # 5 + 10 <= max_len 16: no sliding
    assert cached.shape == (3, 15)
    assert torch.equal(cached[:, :5], prefix)
    assert torch.equal(cached, full)
    if sampling["temperature"] == 0:
        # greedy is a deterministic function of the model: the seed does not matter
        again = generate(CausalLMStepper(model), prefix, SamplingOptions(10, temperature=0.0),
                         generator=torch.Generator().manual_seed(999))
        assert torch.equal(again, cached)


@pytest.mark.parametrize("pos, moe", CONFIGS, ids=CONFIG_IDS)
def test_step_logits_match_full_forward(pos, moe):
    """The stepper's logits (not just the argmax) equal a full forward over the sequence so far."""
    model = make_lm(pos, moe)
    x = prompt(2, 12)
    stepper = CausalLMStepper(model, use_cache=True)
    got = [stepper.prefill(x[:, :4])]
    for t in range(4, 12):
        got.append(stepper.step(x[:, t]))
    with torch.no_grad():
        full = model(x)[:, 3:]  # logits at positions 3..11
    torch.testing.assert_close(torch.stack(got, dim=1), full, atol=1e-4, rtol=0)


def test_cached_stepper_feeds_one_token_per_step():
    model = make_lm()
    lengths: list[int] = []
    handle = model.register_forward_hook(lambda m, args, out: lengths.append(args[0].shape[1]))
    try:
        generate(CausalLMStepper(model, use_cache=True), prompt(2, 5), SamplingOptions(6, temperature=0))
        cached = list(lengths)
        lengths.clear()
        generate(CausalLMStepper(model, use_cache=False), prompt(2, 5), SamplingOptions(6, temperature=0))
    finally:
        handle.remove()
    assert cached == [5, 1, 1, 1, 1, 1]
    assert lengths == [5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("pos, moe", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generation_past_max_len_slides_window(pos, moe, temperature):
    model = make_lm(pos, moe, max_len=12)
    prefix = prompt(2, 5)
    cached, full = run_both(model, prefix, 30, temperature=temperature)  # 35 tokens through a 12-token window
    assert cached.shape == (2, 35)
    assert torch.equal(cached, full)
    assert int(cached.min()) >= 0 and int(cached.max()) < V


def test_prefix_longer_than_max_len_is_truncated_to_window():
    model = make_lm(max_len=8)
    long = prompt(2, 20)
    for use_cache in (True, False):
        out = generate(CausalLMStepper(model, use_cache=use_cache), long, SamplingOptions(3, temperature=0))
        assert torch.equal(out[:, :20], long) and out.shape == (2, 23)
        # the continuation only depends on the last max_len tokens
        same = generate(CausalLMStepper(model, use_cache=use_cache), long[:, -8:], SamplingOptions(3, temperature=0))
        assert torch.equal(out[:, 20:], same[:, 8:])


def test_window_slide_keeps_newest_half():
    model = make_lm(max_len=8)
    stepper = CausalLMStepper(model, use_cache=True)
    x = prompt(1, 8)
    stepper.prefill(x)
    logits = stepper.step(torch.tensor([3]))
    assert stepper.tokens.shape == (1, 4)
    assert torch.equal(stepper.tokens, torch.cat([x[:, -3:], torch.tensor([[3]])], dim=1))
    assert all(c.length == 4 for c in stepper.caches)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(stepper.tokens)[:, -1], atol=1e-4, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# CausalLMStepper.reorder
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
@pytest.mark.parametrize("pos", ["learned", "rotary"])
def test_reorder_selects_rows(use_cache, pos):
    model = make_lm(pos)
    x = prompt(2, 6)
    token = torch.tensor([7, 11])

    plain = CausalLMStepper(model, use_cache=use_cache)
    plain.prefill(x)
    reference = plain.step(token)  # rows in the original order

    swapped = CausalLMStepper(model, use_cache=use_cache)
    swapped.prefill(x)
    swapped.reorder(torch.tensor([1, 0]))
    got = swapped.step(token[[1, 0]])
    torch.testing.assert_close(got, reference[[1, 0]], atol=1e-5, rtol=0)
    assert not torch.allclose(got[0], got[1])  # the rows really differ, so the check means something

    # selecting (and duplicating) a subset of rows, as beam search does
    beams = CausalLMStepper(model, use_cache=use_cache)
    beams.prefill(x)
    beams.reorder(torch.tensor([1, 1, 0]))
    got = beams.step(token[[1, 1, 0]])
    assert got.shape == (3, V)
    torch.testing.assert_close(got, reference[[1, 1, 0]], atol=1e-5, rtol=0)


def test_test_model_is_not_degenerate():
    """The untrained (sharpened) model above has clear argmaxes and a varied greedy continuation, so the
    cache-vs-recompute comparisons compare something (and are not decided by float noise between near-ties)."""
    model = make_lm()
    out = generate(CausalLMStepper(model), prompt(1, 5), SamplingOptions(10, temperature=0))
    assert len(set(out[0, 5:].tolist())) > 1
    with torch.no_grad():
        top2 = model(prompt(4, 12)).topk(2, dim=-1).values
    assert float((top2[..., 0] - top2[..., 1]).median()) > 1e-2


def test_top_p_below_the_dtype_resolution_keeps_the_top_token():
    """top_p=1e-300 is 0 in float32: every token reached it and all were dropped (NaN probabilities, a multinomial
    traceback through generate.py); the first token always stays."""
    logits = torch.tensor([[2.0, 1.0, 0.5], [0.0, 3.0, 1.0]])
    out = filter_logits(logits, top_p=1e-300)
    assert torch.equal(torch.isfinite(out), torch.tensor([[True, False, False], [False, True, False]]))
    assert torch.equal(sample_next(logits, SamplingOptions(top_p=1e-300)), torch.tensor([0, 1]))
