"""TransformerMT: teacher forcing, incremental decoding with caches, padding, block groups, overfitting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.decoding import DecodingOptions, beam_search
from attnlab.models.transformer_mt import TransformerMT
from attnlab.modules.block import DecoderBlock
from attnlab.modules.moe import MixtureOfExperts
from attnlab.builders import load_part

V, BOS, EOS, PAD = 40, 1, 2, 0

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: a second thread only contends


def tiny(**kw) -> TransformerMT:
    torch.manual_seed(0)
    args = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_len=24, dropout=0.0)
    return TransformerMT(**{**args, **kw}).eval()


def batch(B=3, S=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    lens = torch.tensor([S, S - 2, S - 4][:B])
    mask = torch.arange(S)[None] < lens[:, None]
    return src.masked_fill(~mask, PAD), mask


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary", "none"])
def test_cached_and_recomputed_steps_equal_teacher_forcing(pos):
    net = tiny(pos=load_part("pos", pos))
    src, mask = batch()
    tgt = torch.cat([torch.full((3, 1), BOS), torch.randint(4, V, (3, 6))], dim=1)
    full = net(src, mask, tgt)  # (B, T, V)
    for use_cache in (True, False):
        st = net.stepper(src, mask, use_cache=use_cache)
        steps = [st.prefill(tgt[:, :1])] + [st.step(tgt[:, t]) for t in range(1, tgt.shape[1])]
        torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-4)


def test_source_padding_does_not_change_a_row():
    net = tiny()
    src, mask = batch()
    tgt = torch.tensor([[BOS, 5, 6, 7]] * 3)
    together = net(src, mask, tgt)
    alone = net(src[2:, : int(mask[2].sum())], mask[2:, : int(mask[2].sum())], tgt[2:])
    torch.testing.assert_close(together[2:], alone, atol=1e-5, rtol=1e-4)


def test_beam_one_equals_greedy_argmax_loop():
    net = tiny()
    src, mask = batch()
    res = beam_search(net.stepper(src, mask), torch.full((3, 1), BOS),
                      DecodingOptions(max_new_tokens=8, early_stopping=True), eos_id=EOS)
    for b in range(3):
        ids = [BOS]
        for _ in range(8):
            nxt = int(net(src[b : b + 1], mask[b : b + 1], torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if nxt == EOS:
                break
        else:  # the limit reached without EOS: fairseq's rule (force_eos_at_max_len, the default) appends it
            ids.append(EOS)
        assert res.best[b].tolist() == ids[1:]


def test_groups_reach_encoder_and_decoder_and_embeddings_are_tied():
    net = tiny(norm=load_part("norm", "rms"), ffn=load_part("ffn", "swiglu"),
               moe=load_part("moe", "on", num_experts=4, top_k=2))
    assert all(isinstance(b, DecoderBlock) for b in net.decoder.layers)
    assert not any(isinstance(b, DecoderBlock) for b in net.encoder.layers)
    for b in [*net.encoder.layers, *net.decoder.layers]:
        assert isinstance(b.ffn, MixtureOfExperts) and isinstance(b.sa_norm, torch.nn.RMSNorm)
    assert isinstance(net.encoder.final_norm, torch.nn.RMSNorm) and isinstance(net.decoder.final_norm, torch.nn.RMSNorm)
    assert net.head.weight is net.embed.weight
    assert tiny(tie_embeddings=False).head.weight is not tiny(tie_embeddings=False).embed.weight
    deep = tiny(n_encoder_layers=1, n_decoder_layers=3)
    assert len(deep.encoder.layers) == 1 and len(deep.decoder.layers) == 3


def fit(net, src, mask, tgt, steps: int) -> float:
    """Teacher-forced AdamW steps on one batch (<bos> + tgt -> tgt + <eos>); the last loss."""
    B = len(src)
    tgt_in = torch.cat([torch.full((B, 1), BOS), tgt], 1)
    tgt_out = torch.cat([tgt, torch.full((B, 1), EOS)], 1)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = F.cross_entropy(net(src, mask, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("norm", ["pre", pytest.param("post", marks=pytest.mark.slow), pytest.param("rms", marks=pytest.mark.slow)])
def test_overfits_a_tiny_reversal_batch(norm):
    """Reverse 8 random sequences: needs cross-attention to the right source position (loss from ~3.7 to < 0.1)."""
    net = tiny(norm=load_part("norm", norm)).train()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, V, (8, 6), generator=g)
    mask = torch.ones_like(src, dtype=torch.bool)
    tgt = src.flip(1)
    assert fit(net, src, mask, tgt, steps=200) < 0.1
    net.eval()
    res = beam_search(net.stepper(src, mask), torch.full((8, 1), BOS),
                      DecodingOptions(beam_size=3, max_new_tokens=8, early_stopping=True), eos_id=EOS)
    assert [r.tolist() for r in res.best] == [t + [EOS] for t in tgt.tolist()]


def test_too_long_input_is_a_clear_error():
    net = tiny()
    with pytest.raises(ValueError, match="exceeds max_len=24"):
        net(torch.ones(1, 30, dtype=torch.long), torch.ones(1, 30, dtype=torch.bool), torch.ones(1, 3, dtype=torch.long))


def test_copy_returns_normalized_log_probs_and_steps_like_teacher_forcing():
    net = tiny(copy=True)
    src, mask = batch()
    tgt = torch.cat([torch.full((3, 1), BOS), torch.randint(4, V, (3, 5))], dim=1)
    full = net(src, mask, tgt)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(3, 6), atol=1e-4, rtol=0)
    st = net.stepper(src, mask)
    steps = [st.prefill(tgt[:, :1])] + [st.step(tgt[:, t]) for t in range(1, tgt.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-4)


def _names_task(name_ids: range, n: int, seed: int):
    """src = [a, b, x] -> tgt = [a, b, x + 10]: copy a two-token name, translate one word (x in 4..13)."""
    g = torch.Generator().manual_seed(seed)
    names = torch.tensor(list(name_ids))[torch.randint(len(name_ids), (n, 2), generator=g)]
    x = torch.randint(4, 14, (n, 1), generator=g)
    src, tgt = torch.cat([names, x], 1), torch.cat([names, x + 10], 1)
    return src, torch.ones_like(src, dtype=torch.bool), tgt


def test_copy_model_copies_names_never_seen_in_training():
    """Names from ids 24..31 in training, 32..39 (never seen, untrained embeddings) at test: only pointing works."""
    net = tiny(copy=True, n_layers=1).train()
    fit(net, *_names_task(range(24, 32), 64, seed=0), steps=300)
    net.eval()
    src, mask, tgt = _names_task(range(32, 40), 32, seed=1)
    res = beam_search(net.stepper(src, mask), torch.full((32, 1), BOS),
                      DecodingOptions(max_new_tokens=5, early_stopping=True), eos_id=EOS)
    copied = sum(r[:2].tolist() == t[:2].tolist() for r, t in zip(res.best, tgt))
    assert copied >= 28, f"copied {copied}/32 unseen names"
