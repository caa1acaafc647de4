"""E13: a non-autoregressive decoder (C21) against the autoregressive one: speed, quality, controllable length.

Two runs of the same transformer translation setup, ``model=transformer_mt`` (decodes token by token, KV cache)
and ``model=transformer_nat`` (predicts the output length with a classifier over |tgt| - |src|, then fills every
position in one decoder pass). The analysis decodes the same test batches with both checkpoints in one process:
greedy and beam 5 for the autoregressive model, 1 and 3 candidate lengths for the NAT, timing each (fastest of
a few passes), then scales the NAT's predicted lengths by 0.5 / 1 / 1.5 (the seed's "halve the predicted length,
speak twice as fast") and measures how long the outputs get relative to the references.
"""

from __future__ import annotations

from attnlab.probes.translation import decode, score, test_batches

from .base import QUICK_MT, Claim, Context, Result, fmt, verdict_of_parts
from .plots import figure, save
from .runs import load_run

SCALES = (0.5, 1.0, 1.5)


def length_ratio(tokenizer, hyps: list[str], refs: list[str]) -> float:
    """Total output tokens / total reference tokens (the joint BPE's tokens, no <eos>)."""
    n_hyp = sum(len(tokenizer.encode(h)) for h in hyps)
    n_ref = sum(len(tokenizer.encode(r)) for r in refs)
    return n_hyp / n_ref


def analyze(ctx: Context) -> Result:
    repeats = 1 if ctx.quick else 3
    ar, _ = load_run(ctx.job(model="transformer_mt"))
    nat, dm = load_run(ctx.job(model="transformer_nat"))
    batches = test_batches(dm, limit=64 if ctx.quick else None)
    tok = nat.tokenizer

    def row(decoder: str, setting: str, out, scale: float | None = None) -> dict:
        bleu, em = score(out.hyps, out.refs)
        return {"decoder": decoder, "setting": setting, "length scale": scale, "test BLEU": fmt(bleu, 2),
                "exact match": fmt(em), "sentences/s": fmt(out.sentences_per_sec, 0),
                "output/reference length": fmt(length_ratio(tok, out.hyps, out.refs))}

    rows = [row("autoregressive", "greedy", decode(ar, batches, repeats, beam_size=1)),
            row("autoregressive", "beam 5", decode(ar, batches, 1, beam_size=5))]
    for scale in SCALES:  # repeated timing where the speed comparison needs it: greedy vs NAT at scale 1
        nat.length_scale = scale
        out = decode(nat, batches, repeats if scale == 1.0 else 1, beam_size=1)
        rows.append(row("non-autoregressive", "1 length", out, scale))
    nat.length_scale = 1.0
    rows.append(row("non-autoregressive", "3 lengths", decode(nat, batches, repeats, beam_size=3), 1.0))

    greedy, beam = rows[0], rows[1]
    by_scale = {r["length scale"]: r for r in rows[2:5]}
    nat1, nat3 = by_scale[1.0], rows[5]
    speedup = nat1["sentences/s"] / greedy["sentences/s"]
    base = nat1["output/reference length"]
    relative = {s: by_scale[s]["output/reference length"] / base for s in SCALES}

    fig, (ax_speed, ax_len) = figure(ncols=2)
    speed_rows = [greedy, beam, nat1, nat3]
    names = ["AR greedy", "AR beam 5", "NAT 1 len", "NAT 3 lens"]
    bars = ax_speed.bar(names, [r["sentences/s"] for r in speed_rows], color=["C0", "C0", "C1", "C1"])
    for b, r in zip(bars, speed_rows):
        ax_speed.annotate(f"EM {r['exact match']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                          ha="center", va="bottom", fontsize=8)
    ax_speed.set(ylabel="test sentences / s (batches of 64)", title="decoding speed and exact match")
    ax_speed.tick_params(axis="x", labelsize=8)
    ax_len.plot(SCALES, [by_scale[s]["output/reference length"] for s in SCALES], "o-", label="measured")
    ax_len.plot(SCALES, [s * base for s in SCALES], "k--", lw=1, label="scale x ratio at 1")
    for s in SCALES:
        ax_len.annotate(f"EM {by_scale[s]['exact match']:.2f}", (s, by_scale[s]["output/reference length"]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax_len.set(xlim=(0.35, 1.65), xlabel="NAT length_scale", ylabel="output / reference tokens",
               title="NAT: scaled output length")
    ax_len.legend(fontsize=8)
    save(fig, ctx.figure_path, "E13: non-autoregressive vs autoregressive decoding")

    fast = speedup >= 1.5
    controllable = all(abs(relative[s] - s) <= 0.1 * s for s in SCALES)
    return Result(
        rows=rows,
        headline=(f"NAT decodes {speedup:.1f}x faster than greedy ({nat1['sentences/s']:.0f} vs "
                  f"{greedy['sentences/s']:.0f} sentences/s) at exact match {nat1['exact match']:.3f} vs "
                  f"{greedy['exact match']:.3f}; length_scale 0.5 gives outputs {relative[0.5]:.2f}x as long"),
        verdict=verdict_of_parts(fast, controllable),
        evidence=(f"One decoder pass per sentence makes the NAT {speedup:.2f}x faster than greedy autoregressive "
                  f"decoding (needed: 1.5x) and {nat1['sentences/s'] / beam['sentences/s']:.1f}x faster than beam 5, "
                  f"at {greedy['exact match'] - nat1['exact match']:.3f} lower exact match and "
                  f"{greedy['test BLEU'] - nat1['test BLEU']:.1f} lower BLEU than greedy (3 candidate lengths: "
                  f"{nat3['exact match']:.3f} EM at {nat3['sentences/s']:.0f} sentences/s). The output length is the "
                  f"model's choice and can be overridden: scaling the predicted length by 0.5 / 1.5 gives outputs "
                  f"{relative[0.5]:.2f}x / {relative[1.5]:.2f}x as long as at 1 (needed: within 10% of the scale), "
                  f"exact match {by_scale[0.5]['exact match']:.3f} / {by_scale[1.5]['exact match']:.3f}: for text, "
                  f"a shorter output is a truncated sentence, not a faster one."),
        notes=(f"{sum(len(b['src']) for b in batches)} test sentences in {len(batches)} length-sorted batches of up "
               f"to 64; speed = the fastest of {repeats} passes (greedy, NAT) or one (the rest) in one process, "
               f"encoder included. "
               f"Both models trained alike (same data, steps, size); the NAT without distillation or iterative "
               f"refinement, which is where its quality gap usually closes. E17 reuses the autoregressive run."),
    )


CLAIM = Claim(
    id="E13",
    title="Non-autoregressive vs autoregressive decoding",
    statement=("A non-autoregressive decoder predicts the output length with a classifier and emits all positions in "
               "parallel; the output length is controllable (TTS: halve the predicted length, speak twice as fast)."),
    commands=["python train.py -m experiment=e13_nat model=transformer_mt,transformer_nat"],
    analyze=analyze,
    quick=QUICK_MT,
    minutes=6,
)
