"""Batched beam search over any :class:`~attnlab.decoding.step.Stepper` (fairseq's sequence_generator, readable).

The ``n`` unfinished sentences × ``beam_size`` hypotheses are the ``n·beam`` rows of the stepper. Each step:

1. candidates: the running sum of log-probs of every row plus each next token's log-prob, flattened per
   sentence to ``beam·V`` and cut to the best ``2·beam`` (a top-k, no loop over the vocabulary). Twice the beam,
   so that candidates ending in EOS, which leave the beam, never leave it with fewer than ``beam`` live ones.
2. finalize: EOS candidates ranked in the first ``beam`` (further down they would not have been in the beam)
   go to their sentence's finished list. At a sentence's max length (``force_eos_at_max_len``, fairseq's rule)
   one more step allows EOS only, so every hypothesis that reached the limit ends in a scored EOS; without it the
   first ``beam`` candidates at the limit are finished as they are, without EOS.
3. the first ``beam`` non-EOS candidates become the live hypotheses; finished sentences drop out of the batch;
   ``stepper.reorder(flat_index)`` makes the caches follow the surviving hypotheses, then ``stepper.step``.

Scores (fairseq): ``score = sum log p / len ** length_penalty``, ``len`` counting the generated tokens including
EOS (a forced one too). ``length_penalty`` 0 is the plain sum (favours short outputs), 1 the mean log-prob; >1
favours long ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .options import DecodingOptions
from .step import Stepper


@dataclass
class BeamResult:
    tokens: list[list[Tensor]]  # [B][n_best] generated ids (prefix excluded), ending in EOS when one was emitted
    scores: Tensor  # (B, n_best) length-penalized scores, best first; -inf where fewer hypotheses exist
    logprobs: Tensor  # (B, n_best) sums of the tokens' log-probs

    @property
    def best(self) -> list[Tensor]:
        return [hyps[0] for hyps in self.tokens]


@torch.no_grad()
def beam_search(
    stepper: Stepper,
    prefix: Tensor,
    options: DecodingOptions,
    *,
    limits: Sequence[int] | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
    expand_prefix: bool = False,
) -> BeamResult:
    """prefix (B, T) -> the ``n_best`` best continuations of each row (see the module docstring).

    ``options``: ``beam_size``, ``n_best``, ``length_penalty``, ``force_eos_at_max_len``, ``min_len``,
    ``early_stopping`` and the length limit. Max length L per row: ``limits`` (e.g. from a translation's source
    lengths, :meth:`~attnlab.decoding.options.DecodingOptions.limits`), else the options' limit for the prefix length T.
    ``force_eos_at_max_len`` True (fairseq's rule): a hypothesis may have L tokens before its EOS; one that reaches L
    without EOS gets EOS forced at step L + 1 (the only token allowed there), its log-prob added to the sum and
    counted in the length (L + 1), so hypotheses cut by the limit compete on the same footing as finished ones.
    False: at most L tokens, EOS included; a hypothesis that reaches L is finished there, as it is, without EOS
    (scored over its L tokens). Without ``eos_id`` there is nothing to force: hypotheses end at L either way.
    ``min_len``: EOS is forbidden (log-prob -inf, as fairseq) until ``min_len`` tokens have been generated (a
    forced EOS at the limit wins).
    ``vocab_size``: ids ≥ it are masked before the softmax (the distribution is renormalized over the others).
    ``early_stopping`` True (fairseq's default; the options' is False): a sentence is done once it has
    ``beam_size`` finished hypotheses; then ``beam_size=1`` is greedy decoding whatever the length penalty. False: it goes on until its
    best live hypothesis, even at its most favourable future length, cannot beat its ``beam_size``-th best finished.
    ``expand_prefix``: prefill the B·beam expanded prefix instead of prefilling B rows then ``reorder`` (same result).
    """
    B, k, dev = prefix.shape[0], options.beam_size, prefix.device
    n_best, length_penalty, min_len = options.n_best, options.length_penalty, options.min_len
    limit = list(limits) if limits is not None else options.limits([prefix.shape[1]] * B)
    if len(limit) != B or min(limit) < 1:
        raise ValueError(f"need one max length >= 1 per row, got {limit}")
    if expand_prefix:
        logits = stepper.prefill(prefix.repeat_interleave(k, dim=0))
    else:
        logits = stepper.prefill(prefix).repeat_interleave(k, dim=0)
        stepper.reorder(torch.arange(B, device=dev).repeat_interleave(k))
    force = options.force_eos_at_max_len and eos_id is not None
    # each sentence's last step: with force, the EOS-only step after L tokens
    last = [n_max + force - 1 for n_max in limit]
    sums = torch.full((B, k), float("-inf"), device=dev)
    sums[:, 0] = 0.0  # the beams start identical: only the first may expand, or the beam fills with copies
    hyps = prefix.new_empty(B * k, 0)  # (n·k, t) tokens generated so far by each live row
    sent = list(range(B))  # the original index of each sentence still in the batch
    finished: list[list[tuple[float, float, Tensor]]] = [[] for _ in range(B)]  # (score, logprob, tokens)

    for t in range(max(last) + 1):
        n = len(sent)
        logits = logits.float()
        if vocab_size is not None and vocab_size < logits.shape[-1]:
            logits = logits.index_fill(-1, torch.arange(vocab_size, logits.shape[-1], device=dev), float("-inf"))
        lp = logits.log_softmax(dim=-1)
        capped = None
        if force and any(last[s] == t for s in sent):  # sentences at their limit: EOS is the only token left
            capped = torch.tensor([last[s] == t for s in sent], device=dev).repeat_interleave(k)  # (n·k,)
            lp.masked_fill_(capped[:, None] & (torch.arange(lp.shape[1], device=dev) != eos_id), float("-inf"))
        if eos_id is not None and t < min_len:  # no EOS yet, except where the limit forces it
            lp[:, eos_id] = float("-inf") if capped is None else lp[:, eos_id].masked_fill(~capped, float("-inf"))
        V = lp.shape[-1]
        top, idx = (sums.view(-1, 1) + lp).view(n, k * V).topk(min(2 * k, k * V), dim=1)  # (n, 2k) best first
        tok = idx % V
        src = idx // V + torch.arange(n, device=dev)[:, None] * k  # the stepper row each candidate extends
        is_eos = tok == eos_id if eos_id is not None else torch.zeros_like(tok, dtype=torch.bool)
        at_max = torch.tensor([not force and last[s] == t for s in sent], device=dev)[:, None]
        final = top.isfinite() & (is_eos | at_max)
        final[:, k:] = False
        if final.any():
            f_lp = top[final]
            f_score = (f_lp / (t + 1) ** length_penalty).tolist()
            for (i, _), r, tk, lp_i, sc in zip(final.nonzero().tolist(), src[final].tolist(), tok[final].tolist(),
                                               f_lp.tolist(), f_score):
                finished[sent[i]].append((sc, lp_i, torch.cat([hyps[r], hyps.new_tensor([tk])])))

        # the live beam: the first k candidates that do not end in EOS, in rank order
        keep = (is_eos.long() * top.shape[1] + torch.arange(top.shape[1], device=dev)).argsort(dim=1)[:, :k]
        sums, src, tok = top.gather(1, keep), src.gather(1, keep), tok.gather(1, keep)

        best_live = sums.max(dim=1).values
        if not options.early_stopping:  # best live score at its most favourable final length (sums ≤ 0 only decrease)
            length = [last[s] + 1 if length_penalty >= 0 else t + 2 for s in sent]
            future = (best_live / torch.tensor(length, device=dev, dtype=torch.float) ** length_penalty).tolist()
        live_any = best_live.isfinite().tolist()
        remaining = []
        for i, s in enumerate(sent):
            done = last[s] == t or not live_any[i]
            if not done and len(finished[s]) >= k:
                done = options.early_stopping or future[i] <= heapq.nlargest(k, (h[0] for h in finished[s]))[-1]
            if not done:
                remaining.append(i)
        if not remaining:
            break
        if len(remaining) < n:
            rows = torch.tensor(remaining, device=dev)
            sums, src, tok, sent = sums[rows], src[rows], tok[rows], [sent[i] for i in remaining]
        index, tok = src.flatten(), tok.flatten()
        hyps = torch.cat([hyps.index_select(0, index), tok[:, None]], dim=1)
        stepper.reorder(index)
        logits = stepper.step(tok)

    scores = torch.full((B, n_best), float("-inf"), device=dev)
    logprobs = torch.full((B, n_best), float("-inf"), device=dev)
    tokens = []
    for s in range(B):
        best = sorted(finished[s], key=lambda h: -h[0])[:n_best]
        # no finite hypothesis at all (a diverged model's NaN logits): an empty output scored -inf, not a crash
        tokens.append([h[2] for h in best] or [prefix.new_empty(0)])
        for j, (sc, lp_j, _) in enumerate(best):
            scores[s, j], logprobs[s, j] = sc, lp_j
    return BeamResult(tokens, scores, logprobs)


@torch.no_grad()
def greedy_search(
    stepper: Stepper,
    prefix: Tensor,
    options: DecodingOptions,
    *,
    limits: Sequence[int],
    eos_id: int | None = None,
    vocab_size: int | None = None,
) -> BeamResult:
    """The argmax chain (what the LM's ``generate`` emits at temperature 0), as a :class:`BeamResult` with one
    hypothesis per row: row b stops at EOS or after ``limits[b]`` new tokens. What ``beam_size=1`` means in
    translation: a beam of one without early stopping may end on another hypothesis.

    ``options``: ``length_penalty``, and ``force_eos_at_max_len`` as in :func:`beam_search`: True, a row that
    reaches its limit without EOS gets EOS
    appended, its log-prob added and counted in the length (the same rule and scores as a beam); its first
    ``limits[b]`` tokens are the argmax chain either way (EOS is the only token allowed after them). False: the row
    ends at its limit without EOS."""
    B, dev = prefix.shape[0], prefix.device
    limit = torch.tensor(limits, device=dev)
    tokens, logprob = prefix.new_empty(B, 0), torch.zeros(B, device=dev)
    length = torch.zeros(B, dtype=torch.long, device=dev)  # tokens generated while the row was live
    live = torch.ones(B, dtype=torch.bool, device=dev)
    logits = stepper.prefill(prefix)
    force = options.force_eos_at_max_len and eos_id is not None
    for t in range(max(limits) + force):
        logits = logits.float()
        if vocab_size is not None and vocab_size < logits.shape[-1]:
            logits = logits.index_fill(-1, torch.arange(vocab_size, logits.shape[-1], device=dev), float("-inf"))
        lp = logits.log_softmax(dim=-1)
        tok = lp.argmax(dim=-1)  # (B,)
        if force:  # rows at their limit: EOS, scored like any other token (rows past it are no longer live)
            tok = torch.where(limit == t, eos_id, tok)
        logprob += torch.where(live, lp.gather(1, tok[:, None]).squeeze(1), 0.0)
        length += live.long()
        tokens = torch.cat([tokens, tok[:, None]], dim=1)
        if not force:
            live &= limit > t + 1
        if eos_id is not None:
            live &= tok != eos_id
        if not bool(live.any()):
            break
        logits = stepper.step(tok)
    best = [[tokens[b, : int(length[b])]] for b in range(B)]
    scores = (logprob / length.clamp_min(1).float() ** options.length_penalty)[:, None]
    return BeamResult(best, scores, logprob[:, None])
