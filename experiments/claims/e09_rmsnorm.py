"""E9: RMSNorm vs LayerNorm in a pre-norm GPT: validation loss at equal steps over seeds, and the measured step time.

The verdict reads intervals, not single differences: "as good" holds when the 95% interval of RMSNorm − LayerNorm
validation loss (Welch, over the seeds) lies below the tolerance (non-inferiority), "cheaper" when the interval of
the step-time difference lies below zero. With one seed per setting there is no interval, and the rule falls back
to the point differences (the evidence says so).
"""

from __future__ import annotations

from statistics import mean

from attnlab.compare import welch

from .base import QUICK_LM, STEP_TIMES, Claim, Context, Result, fmt, interval, verdict_of_parts
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
    with_intervals = rms.ci_low is not None
    as_good = rms.non_inferior(TOLERANCE, loss.mode) if with_intervals else rms.diff <= TOLERANCE
    cheaper = time_high < 0 if time_high is not None else speedup > 1.0
    n = min(r.n for r in loss.rows)
    if with_intervals:
        loss_text = (f"RMSNorm − LayerNorm validation loss is {rms.diff:+.3f} nats, 95% interval "
                     f"{interval(rms.ci_low, rms.ci_high)} (Welch, p = {rms.p_value:.2g}): the interval "
                     f"{'rules out' if as_good else 'does not rule out'} RMSNorm trailing by more than {TOLERANCE}")
        time_text = (f"its median training step is {speedup:.2f}× as fast, step-time difference "
                     f"{d_time:+.1f} ms, interval {interval(time_low, time_high, 1)}: "
                     f"{'significantly faster' if cheaper else 'not significantly faster'}")
    else:
        loss_text = (f"One seed per setting, so no interval: RMSNorm {'matches or beats' if as_good else 'trails'} "
                     f"LayerNorm by {rms.diff:+.3f} nats (tolerance {TOLERANCE})")
        time_text = f"its median training step is {speedup:.2f}× {'faster' if cheaper else 'as fast or slower'}"
    return Result(
        rows=rows,
        headline=(f"RMSNorm val loss {rms.mean:.3f} vs LayerNorm {loss.row('pre').mean:.3f} over {n} seeds"
                  + (f" (Δ {interval(rms.ci_low, rms.ci_high)})" if with_intervals else "")
                  + f"; step time ×{speedup:.2f}"),
        verdict=verdict_of_parts(as_good, cheaper),
        evidence=(f"Same data and steps, {n} seed{'s' if n > 1 else ''} per setting, "
                  f"{len(loss.jobs['pre'][0].curve('val/loss')[0])} validation points per run. {loss_text}; "
                  f"{time_text}. The norm is a small share of a step at this size, so the time gain is small."),
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
    minutes=51,  # measured for one seed: 600 steps × 2 jobs at ~0.66 s a step on 2 idle cores (17 min); × 3 seeds
)
