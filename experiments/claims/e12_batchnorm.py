"""E12: BatchNorm vs LayerNorm in a pre-norm GPT: validation loss at equal steps."""

from __future__ import annotations

from .base import QUICK_LM, Claim, Context, Result, fmt, verdict
from .plots import curve, figure, save

SETTINGS = {"pre": "LayerNorm (pre)", "batch": "BatchNorm (pre)"}
MARGIN = 0.05  # nats: a gap smaller than this is within run-to-run noise at this size


def analyze(ctx: Context) -> Result:
    fig, (ax_train, ax_val) = figure(ncols=2)
    rows, last_drop = [], {}
    for norm, label, job in ctx.settings("norm", SETTINGS):
        _, loss = curve(ax_train, job, "train/loss", label=label, lw=1)
        v_steps, v_loss = curve(ax_val, job, "val/loss", marker="o", ms=3, label=label)
        last_drop[norm] = (v_loss[-2] - v_loss[-1], v_steps[-1] - v_steps[-2]) if len(v_loss) > 1 else (0.0, 0)
        rows.append({"norm": label, "final train loss": fmt(loss[-1]), "val loss": fmt(v_loss[-1]),
                     "best val loss": fmt(min(v_loss)), "test ppl": fmt(job.metric("test/ppl"), 2)})
    ax_train.set(xlabel="step", ylabel="train loss", title="training loss (batch statistics)")
    ax_val.set(xlabel="step", ylabel="val loss", title="validation loss (running statistics)")
    ax_val.legend()
    save(fig, ctx.figure_path, "E12: BatchNorm vs LayerNorm")
    ln, bn = rows
    gap = bn["best val loss"] - ln["best val loss"]
    cfg = ctx.job(norm="pre").config
    return Result(
        rows=rows,
        headline=f"BatchNorm best val loss {bn['best val loss']:.3f} vs LayerNorm {ln['best val loss']:.3f} "
                 f"({gap:+.3f} nats)",
        verdict=verdict(gap > MARGIN, partly=gap > 0),
        evidence=(f"Same data, seed and {cfg.trainer.max_steps} steps; only the norm kind differs. BatchNorm's best "
                  f"validation loss is {gap:+.3f} nats from LayerNorm's ({bn['best val loss']:.3f} vs "
                  f"{ln['best val loss']:.3f}; test perplexity {bn['test ppl']:.1f} vs {ln['test ppl']:.1f}). The "
                  f"rule: worse by more than {MARGIN} nats reproduces the claim, worse by less partly, no worse does "
                  f"not."),
        notes=(f"An early-training comparison: over the last {last_drop['pre'][1]} steps the validation loss still "
               f"fell by {last_drop['pre'][0]:.3f} (LayerNorm) and {last_drop['batch'][0]:.3f} nats (BatchNorm); the "
               f"paper's gap is at convergence, on translation with padded batches. "
               f"{cfg.model.net.n_layers} layers, d={cfg.model.net.d_model}, context {cfg.data.seq_len}, batch "
               f"{cfg.data.batch_size} ({cfg.data.seq_len * cfg.data.batch_size} positions per BatchNorm statistic). "
               f"BatchNorm's training loss uses batch statistics, its validation loss the running ones; in training "
               f"a position's normalization also depends on later positions of the batch (a faint leak of the "
               f"future, gone in evaluation). Power normalization (PowerNorm), the paper's fix, is not implemented."),
    )


CLAIM = Claim(
    id="E12",
    title="BatchNorm vs LayerNorm",
    statement="BatchNorm does worse than LayerNorm in transformers (power normalization is about as good as LN or better).",
    commands=["python train.py -m experiment=e12_batchnorm norm=pre,batch"],
    analyze=analyze,
    quick=QUICK_LM,
    minutes=4,
)
