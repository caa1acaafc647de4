"""E11: a mixture of experts decouples parameters from compute.

Three GPTs that differ only in their feed-forward slot:
  dense 4d                hidden 4d                      the baseline
  MoE 8 × 2d, top-2       8 experts of hidden 2d         active parameters (per token) = dense 4d's
  dense 16d               hidden 16d = 8 · 2d            total parameters = the MoE's
Parameter counts (total and active, non-embedding) and training FLOPs per token are counted from each job's built
net (:meth:`CausalLM.num_params`, :meth:`CausalLM.active_params`, :meth:`CausalLM.flops_per_token`). Time is
measured twice: the median ``perf/step_time_ms`` of each run's throughput callback (wall clock, but the three runs
happen one after the other, so a change in the machine's load between them shows up as a difference), and, for the
verdict, a controlled re-measurement in the analysis: forward + backward of the three built nets on the same batch,
interleaved round-robin and timed in process CPU time, so that all three see the same machine.
"""

from __future__ import annotations

import time
from statistics import median

import torch

from attnlab.tasks.causal_lm import lm_loss

from .base import QUICK_LM, STEP_TIMES, Claim, Context, Job, Result, fmt, verdict
from .plots import curve, figure, grouped_bars, save
from .runs import built_net

ACTIVE_TOL = 0.05  # MoE active params within 5% of dense 4d's: "equal compute"
TIME_TOL = 1.25  # MoE step time at most 1.25× dense 4d's (routing and dispatch cost something)


def describe(job: Job, net: torch.nn.Module) -> dict:
    """Parameter and FLOP counts of the job's net, built from its own config."""
    return {"total": net.num_params(), "active": net.active_params(),
            "with embeddings": net.num_params(non_embedding=False),
            "flops": net.flops_per_token(int(job.config.data.seq_len))}


def interleaved_ms(nets: dict[str, torch.nn.Module], batch: int, seq_len: int, rounds: int = 6) -> dict[str, float]:
    """Median CPU ms of one forward + backward per net, the nets taking turns (after one warm-up round)."""
    gen = torch.Generator().manual_seed(0)
    vocab = next(iter(nets.values())).vocab_size
    ids, labels = (torch.randint(0, vocab, (batch, seq_len), generator=gen) for _ in range(2))
    times = {name: [] for name in nets}
    for r in range(rounds + 1):
        for name, net in nets.items():
            start = time.process_time()
            lm_loss(net, ids, labels).backward()
            if r:
                times[name].append(1000 * (time.process_time() - start))
            net.zero_grad(set_to_none=True)
    return {name: median(t) for name, t in times.items()}


def analyze(ctx: Context) -> Result:
    models = {
        "dense 4d": ctx.job(0, ffn__hidden_mult=4) if len(ctx.jobs(0)) > 1 else ctx.jobs(0)[0],
        "MoE 8×2d top-2": ctx.jobs(1)[0],
        "dense 16d": ctx.job(0, ffn__hidden_mult=16) if len(ctx.jobs(0)) > 1 else ctx.jobs(0)[0],
    }
    fig, (ax_val, ax_par, ax_time) = figure(ncols=3)
    rows, info = [], {}
    colors = {"dense 4d": "tab:blue", "MoE 8×2d top-2": "tab:purple", "dense 16d": "tab:gray"}
    nets = {name: built_net(job) for name, job in models.items()}
    cfg = models["dense 4d"].config.data
    bench = interleaved_ms(nets, int(cfg.batch_size), int(cfg.seq_len), rounds=2 if ctx.quick else 6)
    for name, job in models.items():
        c = describe(job, nets[name])
        c.update(val=job.metric("val/loss"), run_ms=job.median_step_ms(), ms=bench[name])
        info[name] = c
        curve(ax_val, job, "val/loss", marker="o", ms=3, color=colors[name], label=name)
        moe = job.config.moe  # {} when off (an older run's config: enabled false)
        mixture = bool(moe) and moe.get("enabled", True)
        rows.append({"model": name, "experts (top-k)": f"{moe.num_experts} ({moe.top_k})" if mixture else "–",
                     "ffn hidden": int(job.config.ffn.hidden_mult * job.config.model.net.d_model),
                     "total params": c["total"], "active params": c["active"],
                     "total incl. embeddings": c["with embeddings"], "GFLOP / token (train)": fmt(c["flops"] / 1e9, 4),
                     "val loss": fmt(c["val"]), "test ppl": fmt(job.metric("test/ppl"), 2),
                     "run step ms (median)": fmt(c["run_ms"], 1), "fwd+bwd CPU ms (interleaved)": fmt(c["ms"], 1)})
    names = list(models)
    x = range(len(names))
    grouped_bars(ax_par, {"total": [info[n]["total"] / 1e6 for n in names],
                          "active per token": [info[n]["active"] / 1e6 for n in names]})
    base = info[names[0]]
    grouped_bars(ax_time, {"FLOPs / token": [info[n]["flops"] / base["flops"] for n in names],
                           "fwd+bwd time (interleaved)": [info[n]["ms"] / base["ms"] for n in names]})
    for ax in (ax_par, ax_time):
        ax.set_xticks(list(x), [n.replace(" top-2", "\ntop-2") for n in names], fontsize=7)
    ax_val.set(xlabel="step", ylabel="val loss", title="validation loss")
    ax_val.set_ylim(top=max(info[n]["val"] for n in names) + 0.6)
    ax_par.set(ylabel="non-embedding parameters (M)", title="parameters")
    ax_time.set(ylabel=f"× {names[0]}", title="compute per step")
    ax_time.legend(fontsize=7)
    ax_val.legend(fontsize=7)
    ax_par.legend(fontsize=7)
    save(fig, ctx.figure_path, "E11: mixture of experts vs dense")

    d4, moe, d16 = (info[n] for n in names)
    decoupled = moe["total"] >= 2.5 * moe["active"] and abs(moe["active"] / d4["active"] - 1) <= ACTIVE_TOL
    cheap = moe["ms"] <= TIME_TOL * d4["ms"] and moe["ms"] < d16["ms"]
    helps = moe["val"] < d4["val"]
    return Result(
        rows=rows,
        headline=(f"MoE: {moe['total'] / moe['active']:.1f}× as many parameters as it uses per token; step time "
                  f"{moe['ms'] / d4['ms']:.2f}× dense-4d's (dense-16d: {d16['ms'] / d4['ms']:.2f}×); val loss "
                  f"{moe['val']:.3f} vs {d4['val']:.3f} (dense 4d) and {d16['val']:.3f} (dense 16d)"),
        verdict=verdict(decoupled and cheap and helps, partly=decoupled and (cheap or helps)),
        evidence=(f"Counted from the built nets: the MoE holds {moe['total']:,} non-embedding parameters "
                  f"({moe['total'] / d16['total']:.3f}× dense 16d's {d16['total']:,}) but a token passes through "
                  f"{moe['active']:,} ({moe['active'] / d4['active']:.3f}× dense 4d's {d4['active']:,}); FLOPs per "
                  f"token {moe['flops'] / d4['flops']:.3f}× dense 4d's, while dense 16d needs "
                  f"{d16['flops'] / d4['flops']:.2f}×. Forward + backward, interleaved: dense 4d {d4['ms']:.0f} ms, "
                  f"MoE {moe['ms']:.0f} ms, dense 16d {d16['ms']:.0f} ms (in the training runs: "
                  f"{d4['run_ms']:.0f}, {moe['run_ms']:.0f}, {d16['run_ms']:.0f} ms per step; 'cheap' needs MoE "
                  f"≤ {TIME_TOL}× dense 4d and < dense 16d: {'yes' if cheap else 'no'}). Val loss at equal steps: "
                  f"MoE {moe['val']:.3f}, dense 4d {d4['val']:.3f}, dense 16d {d16['val']:.3f} (the extra parameters "
                  f"{'help' if helps else 'do not help'} at dense-4d's compute)."),
        notes=("The runs' step times are wall clock on a CPU shared with other jobs, hence the interleaved "
               "re-measurement; the MoE dispatch is a Python loop over 8 small experts, which costs more on a CPU "
               "at this size than on an accelerator. A few hundred steps on ~100k tokens: the bigger models are not "
               "trained to convergence."),
    )


CLAIM = Claim(
    id="E11",
    title="Mixture of experts: parameters decoupled from compute",
    statement=("A mixture of experts (a router sends each token to k of E expert feed-forwards) decouples the "
               "parameter count from the compute per token: many parameters, little compute per token."),
    commands=["python train.py -m experiment=e11_moe moe=off ffn.hidden_mult=4,16",
              "python train.py -m experiment=e11_moe moe=on ffn.hidden_mult=2"],
    analyze=analyze,
    quick=[*QUICK_LM, *STEP_TIMES],
    minutes=5,
)
