"""TransformerNAT: length prediction, uniform copy of source embeddings, one decoder pass for all positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.decoding import DecodingOptions
from attnlab.models.transformer_nat import TransformerNAT
from attnlab.tasks.translation_nat import NATTranslationTask

V, BOS, EOS = 40, 1, 2

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: a second thread only contends


def tiny_task(**kw) -> NATTranslationTask:
    torch.manual_seed(0)
    net = dict(_target_="attnlab.models.transformer_nat.TransformerNAT", vocab_size=V, d_model=32, n_layers=2,
               n_heads=4, max_len=24, dropout=0.0, max_length_offset=8)
    return NATTranslationTask(net={**net, **kw})


def data(n=16, seed=0):
    """src = random tokens of length 3..6 (+ <eos>); tgt = each token twice: |tgt| = 2|src| - 1 with <eos> slots."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 7, (n,), generator=g)
    S, T = int(lens.max()) + 1, 2 * int(lens.max()) + 1
    src, tgt_in, tgt_out = torch.zeros(n, S, dtype=torch.long), torch.zeros(n, T, dtype=torch.long), torch.zeros(n, T, dtype=torch.long)
    for i, L in enumerate(lens.tolist()):
        toks = torch.randint(4, V, (L,), generator=g)
        src[i, : L + 1] = torch.cat([toks, torch.tensor([EOS])])
        twice = toks.repeat_interleave(2)
        tgt_in[i, : 2 * L + 1] = torch.cat([torch.tensor([BOS]), twice])
        tgt_out[i, : 2 * L + 1] = torch.cat([twice, torch.tensor([EOS])])
    return src, src != 0, tgt_in, tgt_out


def test_uniform_copy_and_length_offsets():
    net = tiny_task().net
    src_mask = torch.tensor([[True] * 4 + [False] * 2])
    assert net.length_target(src_mask, torch.tensor([7])).item() == 8 + 3  # offset +3 -> class M + 3
    assert net.length_target(src_mask, torch.tensor([40])).item() == 16  # clamped to +M
    logits = torch.full((1, 17), -10.0)
    logits[0, 8 + 2] = 5.0
    assert net.lengths_from_logits(logits, src_mask).item() == 6
    assert net.lengths_from_logits(logits, src_mask, scale=1.5).item() == 9


def test_learns_lengths_and_decodes_every_position_in_one_pass():
    task = tiny_task()
    net = task.net.train()
    src, mask, tgt_in, tgt_out = data()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(400):
        scores, len_logits, len_target = net.forward_with_length(src, mask, tgt_in)
        loss = F.cross_entropy(scores.flatten(0, 1), tgt_out.flatten(), ignore_index=0) + F.cross_entropy(len_logits, len_target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    calls = []
    hooks = [b.register_forward_hook(lambda *a: calls.append(1)) for b in net.decoder.layers]
    res = task.translate_batch(src, mask, DecodingOptions(beam_size=2, n_best=2))
    for h in hooks:
        h.remove()
    assert len(calls) == len(net.decoder.layers)  # one pass through each decoder layer for all positions and lengths
    want = [row[row != 0].tolist() for row in tgt_out]
    got = [hyps[0].tolist() for hyps in res.tokens]
    same_len = [(g, w) for g, w in zip(got, want) if len(g) == len(w)]
    assert len(same_len) >= 14, (got, want)  # the length classifier learned |tgt| = 2|src| - 1
    tok_acc = sum(a == b for g, w in same_len for a, b in zip(g, w)) / sum(len(w) for _, w in same_len)
    assert tok_acc > 0.8, (tok_acc, got, want)
    assert (res.scores[:, 0] >= res.scores[:, 1]).all()


def test_nat_refuses_copy_scheduled_sampling_and_stepping():
    with pytest.raises(ValueError, match="copy mechanism"):
        TransformerNAT(V, copy=True)
    with pytest.raises(ValueError, match="scheduled sampling"):
        NATTranslationTask(net=tiny_task().hparams.net, scheduled_sampling={"schedule": "linear"})
    with pytest.raises(TypeError, match="one pass"):
        tiny_task().net.stepper(None, None)
