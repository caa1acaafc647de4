"""E9: RMSNorm vs LayerNorm in a pre-norm GPT: validation loss at equal steps over seeds, and what a norm costs.

"As good": the 95% interval of RMSNorm − LayerNorm validation loss (Welch, over the seeds) lies below the tolerance
(non-inferiority). "Cheaper": the norm layer itself, forward + backward at the training step's shape, timed by the
performance bench P9 (``bench/p9_norms.py``, CPU time of one thread). The deciding pair is both norms compiled by
``torch.compile``: the same compiler fuses each, so the times compare the algorithms (RMSNorm drops the mean and its
subtraction). In eager mode they compare kernels instead: LayerNorm is one fused native kernel on CPU and torch's
RMSNorm about ten, so eager RMSNorm is slower whatever the algorithm; the page shows those rows and the project's
own eager RMSNorm too, and the training step times of the seeds (eager, where the norm is a small share). With
``--quick`` the bench has no compiled rows and the eager pair decides. A part holds when its interval lies on the
claimed side and leans when its mean does (``interval_rule``): reproduced when both hold, partly when one leans.
"""

from __future__ import annotations

import json
from statistics import mean

from attnlab.cli.compare import welch

from .base import QUICK_LM, STEP_TIMES, Claim, Context, Result, fmt, interval, interval_rule, reading, verdict
from .plots import figure, save

SETTINGS = {"pre": "LayerNorm (pre)", "rms": "RMSNorm (pre)"}
TOLERANCE = 0.02  # nats: RMSNorm is "as good" unless it may trail LayerNorm's validation loss by more than this


def norm_costs(ctx: Context) -> tuple[dict, dict[str, dict[str, list[float]]], str]:
    """Bench P9's record (machine, threads, clock), its rounds in ms per (shape/kernels) and norm, and the key that
    decides: the training shape compiled, or eager where the bench ran without compiling (--quick)."""
    bench = json.loads((ctx.dir / "1" / "bench.json").read_text())
    rounds = bench["comparisons"]["P9"]["tables"][0]["meta"]["rounds_ms"]
    compiled = [k for k in rounds if k.endswith("/compiled")]
    return bench, rounds, compiled[0] if compiled else next(iter(rounds))


def analyze(ctx: Context) -> Result:
    loss = ctx.compare("norm", "val/loss", baseline="pre")  # the code of `python -m attnlab.compare`
    bench, rounds, key = norm_costs(ctx)
    fig, (ax_loss, ax_time, ax_norm) = figure(ncols=3, width=3.8)
    loss.plot(ax=ax_loss, labels=SETTINGS)
    loss.plot(ax=ax_time, key="perf/step_time_ms", labels=SETTINGS)
    ax_loss.set(title="validation loss (mean ± std over seeds)")
    ax_time.set(ylabel="ms / training step", title="training step (eager)")
    for j, (name, label) in enumerate((("RMSNorm", "torch.nn.RMSNorm"), ("RMSNorm (attnlab)", "norm=rms's RMSNorm"))):
        at = [(i, mean(r[name]) / mean(r["LayerNorm"])) for i, r in enumerate(rounds.values()) if name in r]
        bars = ax_norm.bar([i + (j - 0.5) * 0.38 for i, _ in at], [v for _, v in at], 0.38, label=label)
        ax_norm.bar_label(bars, [f"{v:.2f}" for _, v in at], fontsize=7, padding=2)
    ax_norm.axhline(1.0, color="grey", lw=0.8, ls=":")  # LayerNorm's time
    ax_norm.set_xticks(range(len(rounds)), [k.replace("/", "\n") for k in rounds], fontsize=7)
    ax_norm.set(ylabel="time / LayerNorm's (fwd + bwd)", title="the norm layer alone (bench P9)")
    ax_norm.set_ylim(0, 1.3 * max(b.get_height() for b in ax_norm.patches))
    ax_norm.legend(fontsize=7, loc="upper right")
    save(fig, ctx.figure_path, "E9: RMSNorm vs LayerNorm")

    step_ms = {norm: [j.median_step_ms() for j in loss.jobs[norm]] for norm in SETTINGS}
    d_time, time_low, time_high, time_p = welch(step_ms["rms"], step_ms["pre"], loss.confidence)
    rows = []
    for norm, label in SETTINGS.items():
        r = loss.row(norm)
        name = {"pre": "LayerNorm", "rms": "RMSNorm"}[norm]
        rows.append({"norm": label, "seeds": r.n, "val loss": fmt(r.mean), "± std": fmt(r.std),
                     "Δ val loss": fmt(r.diff), "95% CI": interval(r.ci_low, r.ci_high), "p": fmt(r.p_value),
                     "test ppl": fmt(mean(j.metric("test/ppl") for j in loss.jobs[norm]), 2),
                     "median step ms": fmt(mean(step_ms[norm]), 1),
                     **{f"norm ms, {k}": fmt(mean(r_[name]), 3) for k, r_ in rounds.items()}})
    rms = loss.row("rms")
    # claimed: RMSNorm's loss below LayerNorm's + the tolerance (non-inferiority), the norm's time below LayerNorm's
    as_good, good_leans = interval_rule(rms.diff, rms.ci_low, rms.ci_high, sign=-1, bound=TOLERANCE)
    d_norm, norm_low, norm_high, norm_p = welch(rounds[key]["RMSNorm"], rounds[key]["LayerNorm"], loss.confidence)
    cheaper, cheaper_leans = interval_rule(d_norm, norm_low, norm_high, sign=-1)
    ratio = mean(rounds[key]["RMSNorm"]) / mean(rounds[key]["LayerNorm"])
    eager = {k: mean(r["RMSNorm"]) / mean(r["LayerNorm"]) for k, r in rounds.items() if k.endswith("/eager")}
    ours = {k: mean(r["RMSNorm (attnlab)"]) / mean(r["LayerNorm"]) for k, r in rounds.items()
            if "RMSNorm (attnlab)" in r}
    n = min(r.n for r in loss.rows)
    loss_text = "RMSNorm − LayerNorm validation loss is " + reading(
        rms.diff, rms.ci_low, rms.ci_high, rms.p_value, as_good, good_leans, f"below +{TOLERANCE}",
        f"RMSNorm may trail by at most {TOLERANCE}")
    norm_text = (f"the norm layer at {key} (bench P9, {bench['clock']} clock, {bench['threads']} thread) takes "
                 f"{ratio:.2f}× LayerNorm's time, difference " + reading(
                     d_norm, norm_low, norm_high, norm_p, cheaper, cheaper_leans, "below zero",
                     "RMSNorm is faster", digits=3).replace("Welch over the seeds", "Welch over the timing rounds"))
    kernels_text = ("In eager mode torch's RMSNorm takes " + ", ".join(f"{v:.1f}×" for v in eager.values())
                    + " LayerNorm's time (" + ", ".join(eager) + "): LayerNorm is one fused CPU kernel and torch's "
                    "RMSNorm about ten; the project's RMSNorm (what norm=rms builds) takes "
                    + ", ".join(f"{v:.1f}×" for v in ours.values()) + ".")
    step_holds, step_leans = interval_rule(d_time, time_low, time_high, sign=-1)  # shown, not deciding
    step_text = (f"RMSNorm's training step (eager, {n} seeds) is {mean(step_ms['pre']) / mean(step_ms['rms']):.2f}× "
                 "as fast, difference " + reading(d_time, time_low, time_high, time_p, step_holds, step_leans,
                                                  "below zero", "RMSNorm's step is faster", digits=1))
    with_intervals = rms.ci_low is not None
    return Result(
        rows=rows,
        headline=(f"RMSNorm val loss {rms.mean:.3f} vs LayerNorm {loss.row('pre').mean:.3f} over {n} seeds"
                  + (f" (Δ {interval(rms.ci_low, rms.ci_high)})" if with_intervals else "")
                  + f"; the norm layer {ratio:.2f}× LayerNorm's time ({key.split('/')[1]})"),
        verdict=verdict(as_good and cheaper, partly=good_leans or cheaper_leans),
        evidence=(f"Same data and steps, {n} seed{'s' if n > 1 else ''} per setting, "
                  f"{len(loss.jobs['pre'][0].curve('val/loss')[0])} validation points per run. {loss_text}; "
                  f"{norm_text}. {kernels_text} {step_text}. The rule: a part holds when its interval lies on the "
                  f"claimed side, leans when its mean does; reproduced when both hold, partly when one leans."),
        notes=("The training runs of this page used torch.nn.RMSNorm (before the project's faster CPU path; the "
               "same values to float rounding). " if _runs_used_torch_rmsnorm(loss) else "")
              + "Step times are wall-clock on a shared 2-core CPU; the seed interval is over seeds, not over repeats "
                "of the timing.",
    )


def _runs_used_torch_rmsnorm(loss) -> bool:
    return any(j.config.norm.layer.get("_target_") == "torch.nn.RMSNorm" for j in loss.jobs["rms"])


CLAIM = Claim(
    id="E9",
    title="RMSNorm vs LayerNorm",
    statement="RMSNorm (no re-centering, rescale by the root mean square) is cheaper than LayerNorm and as good or better.",
    commands=["python train.py -m experiment=e09_rmsnorm norm=pre,rms",
              "python -m bench --only P9 --clock cpu --json {dir}/bench.json --markdown {dir}/bench.md"],
    analyze=analyze,
    quick=[*QUICK_LM, *STEP_TIMES],
    quick_other=["--quick"],
    seeds=3,
    minutes=26,  # measured 2 Dec: 6 jobs of 600 steps at ~0.31 s a step, OMP_NUM_THREADS=2 on 2 idle Xeon cores,
    # and the bench (~30 s)
)
