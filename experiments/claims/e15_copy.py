"""E15: a copy mechanism lets a translation model reproduce words it never saw in training (C24).

Two transformer translation runs with ``data.copy_names=true`` (10% extra training pairs "<name> has <number>" ->
"<name> a <nombre>" with 40 names), ``model.net.copy=false`` / ``true`` (pointer-generator: a gate p_gen mixes the
vocabulary softmax with the last decoder layer's cross-attention scattered onto the source token ids). Both are
tested on ``copy_test``: the same templates with 20 names never seen in training and numbers from training, so the
name is the only new thing. ``copy_test/name_copied`` is the share of outputs containing the name verbatim.
"""

from __future__ import annotations

from attnlab.probes.translation import decode, test_batches

from .base import QUICK_MT, Claim, Context, Result, fmt, verdict
from .plots import figure, grouped_bars, save
from .runs import load_run

SETTINGS = {False: "no copy", True: "pointer-generator copy"}  # the sweep writes them as False / True


def name_share(sources: list[str], hyps: list[str]) -> tuple[float, float]:
    """(share of outputs with a word that starts the source's name, mean share of the name's characters that the
    longest such word covers): partial copies, e.g. 'K' or 'Ken' for 'Kenji', which the full-name test misses."""
    hits, covered = 0, 0.0
    for src, hyp in zip(sources, hyps):
        name = next(w for w in src.split() if w[:1].isupper())
        best = max((len(w) for w in hyp.split() if name.startswith(w)), default=0)
        hits += best > 0
        covered += best / len(name)
    return hits / len(hyps), covered / len(hyps)


def analyze(ctx: Context) -> Result:
    rows, examples = [], {}
    for copy, label, job in ctx.settings("model.net.copy", SETTINGS):
        task, dm = load_run(job)
        out = decode(task, test_batches(dm, "copy_test", limit=64 if ctx.quick else None), beam_size=1)
        prefix, chars = name_share(out.srcs, out.hyps)
        examples[copy] = [(s, h) for s, h in zip(out.srcs, out.hyps)]
        rows.append({"model": label, "unseen names copied": fmt(job.metric("copy_test/name_copied")),
                     "name start copied": fmt(prefix), "share of name copied": fmt(chars),
                     "copy_test exact match": fmt(job.metric("copy_test/exact_match")),
                     "copy_test BLEU": fmt(job.metric("copy_test/bleu"), 2),
                     "test exact match": fmt(job.metric("test/exact_match")),
                     "test BLEU": fmt(job.metric("test/bleu"), 2)})
    plain, copy = rows
    steps = ctx.job(model__net__copy=True).curve("val/loss")[0][-1] + 1

    fig, (ax,) = figure(width=5.2)
    keys = ["unseen names copied", "share of name copied", "copy_test exact match", "test exact match"]
    for bars in grouped_bars(ax, {r["model"]: [r[k] for k in keys] for r in rows}, width=0.38):
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set(xticks=range(len(keys)), xticklabels=["whole name\ncopied", "share of the\nname copied",
                                                  "exact match\n(unseen names)", "exact match\n(numbers test)"],
           ylim=(0, 1.3))
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    save(fig, ctx.figure_path, "E15: copying names never seen in training")

    gain = copy["unseen names copied"] - plain["unseen names copied"]
    cost = plain["test exact match"] - copy["test exact match"]
    partial = copy["name start copied"] - plain["name start copied"]
    (src, hyp_copy), (_, hyp_plain) = examples[True][0], examples[False][0]
    shown = f" E.g. '{src}': with copy '{hyp_copy}', without '{hyp_plain}'."
    helps, harmless = gain >= 0.1, cost <= 0.02
    return Result(
        rows=rows,
        headline=(f"unseen names copied: {copy['unseen names copied']:.3f} with the copy mechanism vs "
                  f"{plain['unseen names copied']:.3f} without"),
        verdict=verdict(helps and harmless, partly=helps or partial >= 0.1),
        evidence=(f"On 'name has number' sentences whose 20 names never occur in training, the pointer-generator "
                  f"puts the name in {copy['unseen names copied']:.1%} of its outputs, the plain transformer in "
                  f"{plain['unseen names copied']:.1%} ({gain:+.3f}; needed: +0.1); it starts the name (an output "
                  f"word that begins it) in {copy['name start copied']:.1%} vs "
                  f"{plain['name start copied']:.1%} ({partial:+.3f}; partly reproduced from +0.1), covering "
                  f"{copy['share of name copied']:.1%} vs {plain['share of name copied']:.1%} of its characters; "
                  f"exact match "
                  f"{copy['copy_test exact match']:.3f} vs {plain['copy_test exact match']:.3f}. On the ordinary "
                  f"number test the copy model scores {copy['test exact match']:.3f} vs "
                  f"{plain['test exact match']:.3f} exact match (allowed loss: 0.02). The joint byte-level BPE has no "
                  f"unknown token, so the plain model can only reproduce an unseen name by predicting its sub-word "
                  f"pieces one by one from the tied embeddings.{shown}"),
        notes=(f"{steps} training steps each, same seed and data (10,000 number pairs + 1,000 name pairs); greedy "
               f"decoding at test; names count as copied when every capitalized source word is a word of the output."),
    )


CLAIM = Claim(
    id="E15",
    title="Copy mechanism for words never seen in training",
    statement=("A copy mechanism (pointer network) uses the attention distribution over input positions as an output "
               "distribution, so rare input words (a name in 'hello, I am Kurororo') can be copied."),
    commands=["python train.py -m experiment=e15_copy model.net.copy=false,true"],
    analyze=analyze,
    quick=QUICK_MT,
    minutes=6,
)
