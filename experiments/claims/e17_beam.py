"""E17: greedy decoding can miss the most probable sentence; beam search (C26) finds more probable ones.

No training of its own: it decodes the test split with E13's autoregressive transformer (``uses=("E13",)``; the
runner runs E13 first if its runs are missing) at beam sizes 1 (greedy), 2, 3, 5, 10, scoring hypotheses by their
plain summed log-probability (``length_penalty=0``: the sentence probability itself, the quantity whose maximum
"the globally best sentence" is). For each beam it counts the sentences where the beam's translation is more
probable under the model than greedy's: each one is a sentence greedy got wrong by the model's own measure.
"""

from __future__ import annotations

from attnlab.probes.translation import decode, score, test_batches

from .base import Claim, Context, Result, fmt, verdict
from .plots import figure, save
from .runs import load_run

BEAMS = (1, 2, 3, 5, 10)
TOL = 1e-4  # log-prob differences below this are float noise


def analyze(ctx: Context) -> Result:
    job = ctx.other("E13").job(model="transformer_mt")
    task, dm = load_run(job)
    batches = test_batches(dm, limit=64 if ctx.quick else None)
    runs = {k: decode(task, batches, beam_size=k, length_penalty=0.0) for k in BEAMS}
    greedy = runs[1]
    greedy_right = [h == r for h, r in zip(greedy.hyps, greedy.refs)]
    rows, example = [], None
    for k, out in runs.items():
        bleu, em = score(out.hyps, out.refs)
        better = (out.logprobs > greedy.logprobs + TOL).tolist()
        worse = (out.logprobs < greedy.logprobs - TOL).tolist()
        right = [h == r for h, r in zip(out.hyps, out.refs)]
        rows.append({"beam": k, "test BLEU": fmt(bleu, 2), "exact match": fmt(em),
                     "mean log-prob": fmt(float(out.logprobs.mean()), 4),
                     "more probable than greedy": sum(better), "less probable than greedy": sum(worse),
                     "fixed greedy errors": sum(r and not g for r, g in zip(right, greedy_right)),
                     "broke greedy successes": sum(g and not r for r, g in zip(right, greedy_right)),
                     "sentences/s": fmt(out.sentences_per_sec, 0)})
        # an example: a more probable translation that fixes greedy's error, else one that breaks a right one
        for rank, cond in enumerate((lambda i: right[i] and not greedy_right[i],
                                     lambda i: greedy_right[i] and not right[i], lambda i: True)):
            found = [i for i, b in enumerate(better) if b and cond(i)]
            if found and (example is None or rank < example[-1]):
                i = found[0]
                example = (out.srcs[i], greedy.hyps[i], float(greedy.logprobs[i]), k, out.hyps[i],
                           float(out.logprobs[i]), out.refs[i], rank)
                break

    usual = decode(task, batches, beam_size=5, length_penalty=1.0)  # the test's setting: mean log-prob
    bleu5, em5 = score(usual.hyps, usual.refs)
    usual_right = [h == r for h, r in zip(usual.hyps, usual.refs)]
    rows.append({"beam": "5, length_penalty 1", "test BLEU": fmt(bleu5, 2), "exact match": fmt(em5),
                 "mean log-prob": fmt(float(usual.logprobs.mean()), 4),
                 "more probable than greedy": int((usual.logprobs > greedy.logprobs + TOL).sum()),
                 "less probable than greedy": int((usual.logprobs < greedy.logprobs - TOL).sum()),
                 "fixed greedy errors": sum(r and not g for r, g in zip(usual_right, greedy_right)),
                 "broke greedy successes": sum(g and not r for r, g in zip(usual_right, greedy_right)),
                 "sentences/s": fmt(usual.sentences_per_sec, 0)})
    lp0 = rows[: len(BEAMS)]

    fig, (ax_bleu, ax_lp) = figure(ncols=2)
    ax_bleu.plot(BEAMS, [r["test BLEU"] for r in lp0], "o-", color="C0")
    ax_bleu.set(xlabel="beam size", ylabel="test BLEU", xscale="log", xticks=BEAMS, xticklabels=BEAMS,
                title="BLEU (line) and exact match (dashed)")
    ax_em = ax_bleu.twinx()
    ax_em.plot(BEAMS, [r["exact match"] for r in lp0], "s--", color="C2")
    ax_em.set_ylabel("exact match", color="C2")
    ax_lp.plot(BEAMS, [r["mean log-prob"] for r in lp0], "o-", color="C1")
    for r in lp0[1:]:
        ax_lp.annotate(str(r["more probable than greedy"]), (r["beam"], r["mean log-prob"]),
                       textcoords="offset points", xytext=(0, -12), ha="center", fontsize=8)
    ax_lp.set(xlabel="beam size", ylabel="mean sentence log-prob", xscale="log", xticks=BEAMS, xticklabels=BEAMS,
              title="log-prob (labels: # beating greedy)")
    save(fig, ctx.figure_path, "E17: beam search vs greedy (length penalty 0)")

    first, last, usual_row = lp0[0], lp0[-1], rows[-1]
    n = len(greedy.hyps)
    missed = last["more probable than greedy"]
    gain = last["mean log-prob"] - first["mean log-prob"]
    shown = ("" if example is None else
             f" E.g. '{example[0]}': greedy '{example[1]}' (log-prob {example[2]:.3f}), beam {example[3]} "
             f"'{example[4]}' ({example[5]:.3f}); reference '{example[6]}'.")
    return Result(
        rows=rows,
        headline=(f"beam 10 found a more probable translation than greedy for {missed} of {n} test sentences; "
                  f"mean log-prob {first['mean log-prob']:.3f} -> {last['mean log-prob']:.3f}, BLEU "
                  f"{first['test BLEU']:.2f} -> {last['test BLEU']:.2f}"),
        verdict=verdict(missed > 0 and gain > 0, partly=False),
        evidence=(f"For {missed} of {n} sentences greedy's translation is not the most probable one the model has: "
                  f"beam 10 finds a more probable one (beam 2: {rows[1]['more probable than greedy']}), so greedy "
                  f"missed the best sentence there; the mean sentence log-prob rises by {gain:+.4f} nats. Whether "
                  f"that helps the translation is another matter: beam 10 fixes {last['fixed greedy errors']} greedy "
                  f"errors and breaks {last['broke greedy successes']} correct ones (exact match "
                  f"{first['exact match']:.3f} -> {last['exact match']:.3f}): the most probable sentence is not "
                  f"always the right one. With the length normalization the test uses (mean log-prob, beam 5) "
                  f"exact match is {usual_row['exact match']:.3f} ({usual_row['fixed greedy errors']} fixed, "
                  f"{usual_row['broke greedy successes']} broken).{shown}"),
        notes=(f"E13's autoregressive checkpoint, {n} test sentences, no early stopping (a "
               f"sentence ends when no live hypothesis can beat its k-th finished one). Beam search is itself "
               f"approximate: beam 10's count is a lower bound on greedy's misses."),
    )


CLAIM = Claim(
    id="E17",
    title="Beam search vs greedy decoding",
    statement="Beam search keeps the k best partial outputs at every step; greedy decoding can miss the globally best "
              "sentence.",
    commands=[],  # reads E13's autoregressive run
    analyze=analyze,
    uses=("E13",),
    minutes=1,
)
