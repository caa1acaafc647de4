"""RNN seq2seq (claims C1, C2, C23, C24): padding invariance, attention maps, scheduled sampling, the stepper against
teacher forcing and beam search, every variant overfitting a tiny batch, and the copy mechanism on unseen names."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.decoding import DecodingOptions, beam_search
from attnlab.models.seq2seq_rnn import Seq2SeqRNN
from attnlab.modules.attention import capture_attention

PAD, BOS, EOS = 0, 1, 2
V = 24
VARIANTS = [(c, a) for c in ("gru", "lstm") for a in ("none", "bahdanau", "luong_dot", "luong_general")]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(cell="gru", attention="bahdanau", **kw) -> Seq2SeqRNN:
    torch.manual_seed(0)
    args = dict(vocab_size=V, d_emb=16, d_hidden=32, n_layers=1, cell=cell, attention=attention, dropout=0.0)
    return Seq2SeqRNN(**{**args, **kw})


def make_batch(rows: list[tuple[list[int], list[int]]]) -> dict:
    """(source, target) id lists -> a batch as the data module collates it (src + <eos>, <bos> + tgt, tgt + <eos>)."""
    B = len(rows)
    S, T = max(len(s) for s, _ in rows) + 1, max(len(t) for _, t in rows) + 1
    src, tgt_in, tgt_out = (torch.full((B, n), PAD) for n in (S, T, T))
    for b, (s, t) in enumerate(rows):
        src[b, : len(s) + 1] = torch.tensor(s + [EOS])
        tgt_in[b, : len(t) + 1] = torch.tensor([BOS] + t)
        tgt_out[b, : len(t) + 1] = torch.tensor(t + [EOS])
    return {"src": src, "src_mask": src != PAD, "tgt_in": tgt_in, "tgt_out": tgt_out}


def reversal_batch(lengths=(3, 4, 5, 6, 7, 3, 5, 7), seed=0) -> dict:
    """Random sources; each target is its source reversed; every target starts with a different token."""
    g = torch.Generator().manual_seed(seed)
    firsts = (torch.randperm(V - 4, generator=g)[: len(lengths)] + 4).tolist()
    rows = []
    for n, first in zip(lengths, firsts):
        tgt = [first] + torch.randint(4, V, (n - 1,), generator=g).tolist()
        rows.append((tgt[::-1], tgt))
    return make_batch(rows)


def loss_of(scores, batch) -> torch.Tensor:
    return F.cross_entropy(scores.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD)


def greedy(net, batch, max_new=12) -> list[list[int]]:
    bos = torch.full((batch["src"].shape[0], 1), BOS)
    # the argmax chain as is: a row cut by the limit keeps its last argmax token (no EOS forced after it)
    res = beam_search(net.stepper(batch["src"], batch["src_mask"]), bos,
                      DecodingOptions(max_new_tokens=max_new, force_eos_at_max_len=False, early_stopping=True),
                      eos_id=EOS)
    return [h.tolist() for h in res.best]


# --------------------------------------------------------------------------------------------------------------
# shapes, padding, attention maps
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell,attention", VARIANTS)
def test_padding_a_batch_does_not_change_a_row(cell, attention):
    net = tiny(cell, attention, n_layers=2).eval()
    short = ([5, 6, 7], [8, 9])
    alone = make_batch([short])
    padded = make_batch([short, ([4] * 9, [10] * 6)])  # a longer row pads the short one in src and tgt
    assert padded["src"].shape[1] > alone["src"].shape[1]
    with torch.no_grad():
        a = net(alone["src"], alone["src_mask"], alone["tgt_in"])
        b = net(padded["src"], padded["src_mask"], padded["tgt_in"])
    assert a.shape == (1, 3, V) and b.shape == (2, 7, V)
    torch.testing.assert_close(b[:1, :3], a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong_dot", "luong_general"])
def test_attention_maps_are_captured_per_step(attention):
    net = tiny("lstm", attention).eval()
    batch = make_batch([([5, 6, 7, 8, 9], [10, 11, 12]), ([5, 6], [10, 11, 12, 13, 14])])
    with torch.no_grad(), capture_attention(net) as maps:
        net(batch["src"], batch["src_mask"], batch["tgt_in"])
    assert list(maps) == ["decoder.cross_attn"]  # "cross_attn" in the name: the task labels it (target, source)
    w = maps["decoder.cross_attn"]
    assert w.shape == (2, 1, 6, 6)  # (B, 1 head, T, S)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 6))
    assert (w[1, :, :, 3:] == 0).all()  # source row 1 is 2 tokens + <eos>: no weight on its padding
    assert net.cross_attn.weights is None  # released after capture


def test_no_attention_is_the_fixed_context_baseline():
    net = tiny("gru", "none").eval()
    assert not hasattr(net.decoder, "cross_attn") and net.cross_attn is None
    batch = make_batch([([5, 6, 7, 8, 9], [10, 11, 12])])
    with torch.no_grad(), capture_attention(net) as maps:
        net(batch["src"], batch["src_mask"], batch["tgt_in"])
    assert len(maps) == 0
    # C1: the decoder reads the source only through c, a fixed-size vector whatever the source length
    mem, _ = net.encode(batch["src"], batch["src_mask"])
    assert mem.fixed.shape == (1, 32)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="copy=true needs an attention"):
        tiny(attention="none", copy=True)
    with pytest.raises(ValueError, match="unknown attention 'luong'"):
        tiny(attention="luong")
    with pytest.raises(ValueError, match="unknown cell 'rnn'"):
        tiny(cell="rnn")
    with pytest.raises(ValueError, match="d_hidden must be even"):
        tiny(d_hidden=31)
    with pytest.raises(ValueError, match=r"sampling_ratio must be in \[0, 1\]"):
        b = reversal_batch()
        tiny()(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=1.5)


# --------------------------------------------------------------------------------------------------------------
# scheduled sampling (C23)
# --------------------------------------------------------------------------------------------------------------
def test_sampling_ratio_zero_is_teacher_forcing_exactly():
    net = tiny("lstm", "bahdanau", n_layers=2, dropout=0.3).train()
    b = reversal_batch()
    torch.manual_seed(1)
    plain = net(b["src"], b["src_mask"], b["tgt_in"])
    torch.manual_seed(1)
    zero = net(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=0.0)
    assert torch.equal(plain, zero)  # same dropout masks too: ratio 0 draws no random numbers
    # and teacher forcing is feeding the gold tokens one by one through the incremental stepper
    net.eval()
    with torch.no_grad():
        tf = net(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=0.0)
        st = net.stepper(b["src"], b["src_mask"])
        steps = [st.prefill(b["tgt_in"][:, :1])] + [st.step(b["tgt_in"][:, t]) for t in range(1, b["tgt_in"].shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), tf, atol=1e-6, rtol=1e-6)


def test_sampling_ratio_one_feeds_the_models_own_argmax():
    net = tiny("gru", "luong_general").eval()
    b = reversal_batch()
    with torch.no_grad():
        free = net(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=1.0)
        tf = net(b["src"], b["src_mask"], b["tgt_in"])
        own_in = torch.cat([b["tgt_in"][:, :1], free.argmax(-1)[:, :-1]], dim=1)  # <bos> + its own predictions
        again = net(b["src"], b["src_mask"], own_in)
    assert not torch.allclose(free, tf)  # an untrained net's argmax is not the reference
    torch.testing.assert_close(free, again, atol=1e-6, rtol=1e-6)  # ratio 1 = teacher forcing on its own output


def test_sampling_ratio_half_samples_each_row_independently():
    # one step after <bos>: each row's scores at t=1 are either the teacher-forced ones or the free-running ones
    net = tiny("gru", "bahdanau").eval()
    g = torch.Generator().manual_seed(3)
    b = make_batch([(torch.randint(4, V, (4,), generator=g).tolist(), torch.randint(4, V, (2,), generator=g).tolist())
                    for _ in range(400)])  # fmt: skip
    with torch.no_grad():
        tf = net(b["src"], b["src_mask"], b["tgt_in"])[:, 1]
        free = net(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=1.0)[:, 1]
        torch.manual_seed(0)
        half = net(b["src"], b["src_mask"], b["tgt_in"], sampling_ratio=0.5)[:, 1]
    differ = ~torch.isclose(tf, free).all(-1)  # rows whose own prediction differs from the gold token
    is_free = torch.isclose(half, free).all(-1) & differ
    is_tf = torch.isclose(half, tf).all(-1) & differ
    assert bool((is_free | is_tf)[differ].all())
    share = is_free.sum() / differ.sum()
    assert differ.sum() > 300 and 0.4 < share < 0.6  # binomial(≥300, 0.5): ±0.1 is > 3.4 standard deviations


# --------------------------------------------------------------------------------------------------------------
# the stepper and beam search
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell,attention,copy", [("gru", "none", False), ("lstm", "bahdanau", True),
                                                 ("gru", "luong_dot", False)])  # fmt: skip
def test_greedy_decoding_is_the_teacher_forced_argmax_of_its_own_output(cell, attention, copy):
    net = tiny(cell, attention, copy=copy, n_layers=2).eval()
    b = reversal_batch()
    hyps = greedy(net, b, max_new=10)
    for row, hyp in enumerate(hyps):
        tgt_in = torch.tensor([[BOS] + hyp[:-1]])
        with torch.no_grad():
            scores = net(b["src"][row : row + 1], b["src_mask"][row : row + 1], tgt_in)
        assert scores.argmax(-1)[0].tolist() == hyp


@pytest.mark.parametrize("cell,attention", [("lstm", "luong_general"), ("gru", "bahdanau")])
def test_beam_one_is_greedy_and_a_batch_equals_each_sentence_alone(cell, attention):
    net = tiny(cell, attention).eval()
    b = reversal_batch()
    bos = torch.full((8, 1), BOS)
    # greedy by hand: argmax of teacher-forced scores, one token at a time (no stepper)
    tokens = bos
    with torch.no_grad():
        for _ in range(9):
            tokens = torch.cat([tokens, net(b["src"], b["src_mask"], tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    for row, hyp in enumerate(greedy(net, b, max_new=9)):
        manual = tokens[row, 1:].tolist()
        assert hyp == (manual[: manual.index(EOS) + 1] if EOS in manual else manual)
    # beam 4 over the batch (rows dropping out, reorder every step) == beam 4 on each sentence alone
    four = DecodingOptions(beam_size=4, n_best=2, max_len_a=1.5, max_len_b=2, early_stopping=True)
    together = beam_search(net.stepper(b["src"], b["src_mask"]), bos, four, limits=four.limits(b["src_mask"].sum(1)),
                           eos_id=EOS)
    for row in range(8):
        s = slice(row, row + 1)
        alone = beam_search(net.stepper(b["src"][s], b["src_mask"][s]), bos[s], four,
                            limits=four.limits(b["src_mask"][s].sum(1)), eos_id=EOS)
        assert [h.tolist() for h in together.tokens[row]] == [h.tolist() for h in alone.tokens[0]]
        torch.testing.assert_close(together.scores[row], alone.scores[0], atol=1e-5, rtol=1e-5)


def test_stepper_without_cache_matches_the_cached_one_and_keeps_maps():
    net = tiny("lstm", "bahdanau", n_layers=2).eval()
    b = reversal_batch()
    bos = torch.full((8, 1), BOS)
    options = DecodingOptions(beam_size=3, max_len_a=1.5, max_len_b=2, early_stopping=True)
    kw = dict(limits=options.limits(b["src_mask"].sum(1)), eos_id=EOS)
    cached = beam_search(net.stepper(b["src"], b["src_mask"], use_cache=True), bos, options, **kw)
    fresh = beam_search(net.stepper(b["src"], b["src_mask"], use_cache=False), bos, options, **kw)
    assert [h.tolist() for h in cached.best] == [h.tolist() for h in fresh.best]
    torch.testing.assert_close(cached.scores, fresh.scores, atol=1e-5, rtol=1e-5)
    # greedy decoding under capture_attention: one weight row per generated token, for the rows decoded
    with capture_attention(net) as maps:
        hyps = greedy(net, b, max_new=6)
    w = maps["decoder.cross_attn"]
    assert w.shape[1] == 1 and w.shape[3] == b["src"].shape[1]
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:3]))
    assert min(len(h) for h in hyps) <= w.shape[2] <= 6


# --------------------------------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------------------------------
def train(net, batch, max_steps, target, lr=1e-2) -> float:
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    for _ in range(max_steps):
        loss = loss_of(net(batch["src"], batch["src_mask"], batch["tgt_in"]), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < target:
            break
    return loss.item()


# the 10-minute budget: every cell and every attention once by default, the other pairs with -m slow
DEFAULT_VARIANTS = {("gru", "none"), ("gru", "bahdanau"), ("lstm", "luong_dot"), ("lstm", "luong_general")}


@pytest.mark.parametrize("cell,attention", [v if v in DEFAULT_VARIANTS else pytest.param(*v, marks=pytest.mark.slow)
                                            for v in VARIANTS])
def test_every_variant_overfits_a_tiny_batch(cell, attention):
    b = reversal_batch()
    n_tokens = int(b["tgt_out"].ne(PAD).sum())
    # Threshold: a decoder that ignored the source could not know the first target token (8 rows, 8 different
    # first tokens), which costs it >= ln 8 nats per row: a mean loss >= 8·ln 8 / 48 tokens ≈ 0.35. Reaching
    # 0.02 means the source went through (for attention=none: through the fixed context c alone).
    floor = 8 * math.log(8) / n_tokens
    assert floor > 0.3
    net = tiny(cell, attention)
    assert train(net, b, max_steps=300, target=0.02) < 0.02
    net.eval()
    assert greedy(net, b) == [row[row != PAD].tolist() for row in b["tgt_out"]]


def test_copy_distribution_is_normalized_and_puts_mass_on_source_tokens():
    net = tiny("gru", "bahdanau", copy=True).eval()
    b = reversal_batch()
    with torch.no_grad():
        logp = net(b["src"], b["src_mask"], b["tgt_in"])
        torch.nn.init.constant_(net.decoder.p_gen.bias, -30.0)  # p_gen ≈ 0: copy only
        torch.nn.init.zeros_(net.decoder.p_gen.weight)
        copy_only = net(b["src"], b["src_mask"], b["tgt_in"]).exp()
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(8, b["tgt_in"].shape[1]))
    # with p_gen = 0 every bit of probability sits on the row's own source tokens
    on_src = torch.zeros(8, V, dtype=torch.bool).scatter(1, b["src"], True) & (torch.arange(V) != PAD)
    mass = (copy_only * on_src[:, None, :]).sum(-1)
    torch.testing.assert_close(mass, torch.ones_like(mass), atol=1e-4, rtol=0)


# the copy task's vocabulary: "<name> has <d…>" -> "<name> a <f(d)…>", "<d…> for <name>" -> "<f(d)…> pour <name>"
HAS, A, FOR, POUR = 4, 5, 6, 7
DIGITS = list(range(8, 18))  # source digits d; target digits f(d) = d + 10 (18..27)
NAMES = list(range(28, 68))
TRAIN_NAMES, HELD_OUT = NAMES[:30], NAMES[30:]  # the held-out ids never occur in training, on either side


def copy_pairs(seed=0) -> list[tuple[list[int], list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for name in TRAIN_NAMES:
        for template in (0, 1):
            ds = [DIGITS[i] for i in torch.randint(0, 10, (int(torch.randint(1, 3, (1,), generator=g)),), generator=g)]
            fd = [d + 10 for d in ds]
            src, tgt = ([name, HAS, *ds], [name, A, *fd]) if template == 0 else ([*ds, FOR, name], [*fd, POUR, name])
            out.append((src, tgt, name))
    return out


def copy_task() -> tuple[dict, list[tuple[list[int], list[int]]], list[int]]:
    """60 training pairs with 30 names; the first 20 of them again with the name swapped for one of 10 unseen
    names (each in both templates), so the only new thing in a test pair is the name."""
    pairs = copy_pairs()
    names = [HELD_OUT[i // 2] for i in range(2 * len(HELD_OUT))]
    test_rows = [([new if x == name else x for x in s], [new if x == name else x for x in t])
                 for (s, t, name), new in zip(pairs, names)]  # fmt: skip
    return make_batch([(s, t) for s, t, _ in pairs]), test_rows, names


def names_copied(copy: bool) -> int:
    """Train on the copy task to loss < 0.01; how many of the 20 test pairs get their unseen name in its place."""
    train_batch, test_rows, names = copy_task()
    net = tiny("gru", "bahdanau", vocab_size=NAMES[-1] + 1, copy=copy, tie_embeddings=False)
    assert train(net, train_batch, max_steps=500, target=0.01) < 0.01  # it fits the training pairs
    hyps = greedy(net.eval(), make_batch(test_rows))
    # the name in the right place: the first word, or the last before <eos>
    return sum(len(h) > t.index(n) and h[t.index(n)] == n for h, (_, t), n in zip(hyps, test_rows, names))


def test_copy_model_copies_names_it_never_saw():
    """C24/E15: the pointer-generator puts an unseen name where it belongs (its id never occurs in training, on
    either side, so generating it is impossible in practice: its output row is untrained; copying is the way)."""
    assert names_copied(copy=True) >= 18  # of 20 (measured: 20)


@pytest.mark.slow
def test_without_copy_the_same_net_never_produces_an_unseen_name():
    assert names_copied(copy=False) == 0  # of 20: the same net and training, without the copy gate
