"""E9: RMSNorm vs LayerNorm in a pre-norm GPT: validation loss at equal steps over seeds, and the measured step time.

The verdict reads intervals, not single differences: "as good" holds when the 95% interval of RMSNorm − LayerNorm
validation loss (Welch, over the seeds) lies below the tolerance (non-inferiority), "cheaper" when the interval of
the step-time difference lies below zero; a part leans when only its mean does (``interval_rule``): reproduced when
both hold, partly when one leans. With one seed per setting there is no interval, and the rule falls back to the
point differences (the evidence says so).
"""

from __future__ import annotations

from statistics import mean

from attnlab.compare import welch

from .base import QUICK_LM, STEP_TIMES, Claim, Context, Result, fmt, interval, interval_rule, reading, verdict
from .plots import figure, save

SETTINGS = {"pre": "LayerNorm (pre)", "rms": "RMSNorm (pre)"}
TOLERANCE = 0.02  # nats: RMSNorm is "as good" unless it may trail LayerNorm's validation loss by more than this


def analyze(ctx: Context) -> Result:
    loss = ctx.compare("norm", "val/loss", baseline="pre")  # the code of `python -m attnlab.compare`
    fig, (ax_loss, ax_time) = figure(ncols=2)
    loss.plot(ax=ax_loss, labels=SETTINGS)
    loss.plot(ax=ax_time, key="perf/step_time_ms", labels=SETTINGS)
    ax_loss.set(title="validation loss (mean ± std over seeds)")
    ax_time.set(ylabel="ms / training step", title="step time")
    save(fig, ctx.figure_path, "E9: RMSNorm vs LayerNorm")

    step_ms = {norm: [j.median_step_ms() for j in loss.jobs[norm]] for norm in SETTINGS}
    d_time, time_low, time_high, time_p = welch(step_ms["rms"], step_ms["pre"], loss.confidence)
    rows = []
    for norm, label in SETTINGS.items():
        r = loss.row(norm)
        rows.append({"norm": label, "seeds": r.n, "val loss": fmt(r.mean), "± std": fmt(r.std),
                     "Δ val loss": fmt(r.diff), "95% CI": interval(r.ci_low, r.ci_high), "p": fmt(r.p_value),
                     "test ppl": fmt(mean(j.metric("test/ppl") for j in loss.jobs[norm]), 2),
                     "median step ms": fmt(mean(step_ms[norm]), 1)})
    rms = loss.row("rms")
    speedup = mean(step_ms["pre"]) / mean(step_ms["rms"])
    # claimed: RMSNorm's loss below LayerNorm's + the tolerance (non-inferiority), its step time below LayerNorm's
    as_good, good_leans = interval_rule(rms.diff, rms.ci_low, rms.ci_high, sign=-1, bound=TOLERANCE)
    cheaper, cheaper_leans = interval_rule(d_time, time_low, time_high, sign=-1)
    n = min(r.n for r in loss.rows)
    loss_text = "RMSNorm − LayerNorm validation loss is " + reading(
        rms.diff, rms.ci_low, rms.ci_high, rms.p_value, as_good, good_leans, f"below +{TOLERANCE}",
        f"RMSNorm may trail by at most {TOLERANCE}")
    time_text = (f"its median training step is {speedup:.2f}× as fast, step-time difference "
                 + reading(d_time, time_low, time_high, time_p, cheaper, cheaper_leans, "below zero",
                           "RMSNorm's step is faster", digits=1))
    with_intervals = rms.ci_low is not None
    return Result(
        rows=rows,
        headline=(f"RMSNorm val loss {rms.mean:.3f} vs LayerNorm {loss.row('pre').mean:.3f} over {n} seeds"
                  + (f" (Δ {interval(rms.ci_low, rms.ci_high)})" if with_intervals else "")
                  + f"; step time ×{speedup:.2f}"),
        verdict=verdict(as_good and cheaper, partly=good_leans or cheaper_leans),
        evidence=(f"Same data and steps, {n} seed{'s' if n > 1 else ''} per setting, "
                  f"{len(loss.jobs['pre'][0].curve('val/loss')[0])} validation points per run. {loss_text}; "
                  f"{time_text}. The rule: a part holds when its interval lies on the claimed side, leans when its "
                  f"mean does; reproduced when both hold, partly when one leans. The norm is a small share of a "
                  f"step at this size, so the time gain is small."),
        notes="Step times are wall-clock on a shared 2-core CPU; the interval is over seeds, not over repeats of "
              "the timing." if with_intervals else "",
    )


CLAIM = Claim(
    id="E9",
    title="RMSNorm vs LayerNorm",
    statement="RMSNorm (no re-centering, rescale by the root mean square) is cheaper than LayerNorm and as good or better.",
    commands=["python train.py -m experiment=e09_rmsnorm norm=pre,rms"],
    analyze=analyze,
    quick=[*QUICK_LM, *STEP_TIMES],
    seeds=3,
    minutes=25,  # measured 2 Dec: 6 jobs of 600 steps at ~0.31 s a step, OMP_NUM_THREADS=2 on 2 idle Xeon cores
)
