"""E2: attention learns the alignment with no supervision: argmax cross-attention vs the known number chunks.

No extra training: the models are E1's (RNN + Bahdanau attention, transformer), trained on the translation loss
only. On E1's test pairs, teacher-forced, each target token's attention row is scored as aligned when its argmax
falls on a source token of the same magnitude group (millions / thousands / hundreds / rest,
:func:`attnlab.data.numbers.word_chunks`), against chance (a uniformly random source token) and a diagonal guess
(target word i reads the proportional source word): :mod:`attnlab.analysis.alignment`.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.analysis.alignment import NO_CHUNK, AlignmentCounts, alignment_counts, token_chunks
from attnlab.data.numbers import CHUNKS
from attnlab.modules.attention import capture_attention

from .base import Claim, Context, Job, Result, fmt, verdict
from .e01_bottleneck import find, finished
from .plots import figure, grouped_bars, save
from .runs import load_run

# Verdict: the alignment is learned when the RNN's argmax beats chance by CHANCE_MARGIN; partly when its argmax or
# its attention weight on the right group beats chance by SOME_MARGIN.
CHANCE_MARGIN, SOME_MARGIN = 0.3, 0.1


def layer_label(name: str) -> str:
    """'decoder.cross_attn' -> 'attention'; 'decoder.2.cross_attn' -> 'layer 3'."""
    parts = name.split(".")
    return f"layer {int(parts[1]) + 1}" if parts[1].isdigit() else "attention"


@torch.no_grad()
def measure(job: Job) -> tuple[dict[str, AlignmentCounts], dict]:
    """Alignment counts per cross-attention layer (heads averaged) over the job's test split, teacher-forced, and
    the longest test pair's maps for the figure."""
    task, dm = load_run(job)
    tok, eos = task.tokenizer, [NO_CHUNK] if dm.hparams.src_eos else []
    counts: dict[str, AlignmentCounts] = {}
    example: dict = {}
    for batch in dm.test_dataloader():
        with capture_attention(task.net) as maps:
            task.net(batch["src"], batch["src_mask"], batch["tgt_in"])
        cross = {n: w.float().mean(dim=1) for n, w in maps.items() if n.endswith("cross_attn")}  # (B, T, S)
        for b, (src, tgt) in enumerate(zip(batch["src_text"], batch["tgt_text"])):
            sc, tc = token_chunks(tok, src, "en") + eos, token_chunks(tok, tgt, "fr") + [NO_CHUNK]
            if len(sc) != int(batch["src_mask"][b].sum()) or len(tc) != int(batch["tgt_mask"][b].sum()):
                raise RuntimeError(f"token chunks of {src!r} -> {tgt!r} do not match the batch's token counts")
            for n, w in cross.items():
                counts.setdefault(n, AlignmentCounts()).add(alignment_counts(w[b], sc, tc))
            key = (len(set(sc)), len(sc))  # the pair with the most groups, then the longest (the same for all)
            if key > example.get("key", (0, 0)):
                example = {"key": key, "sc": sc, "tc": tc,
                           "maps": {n: w[b, : len(tc), : len(sc)].numpy() for n, w in cross.items()},
                           "src": [tok.id_to_token(int(i)) for i in batch["src"][b, : len(sc)]],
                           "tgt": [tok.id_to_token(int(i)) for i in batch["tgt_out"][b, : len(tc)]]}
    return counts, example


def draw_map(ax, weights: np.ndarray, example: dict, title: str) -> None:
    """A (T, S) attention map with the magnitude groups' boundaries as lines."""
    ax.imshow(weights, cmap="Greys", vmin=0, aspect="auto")  # darkest = the largest weight of this map
    ax.set_xticks(range(len(example["src"])), example["src"], rotation=90, fontsize=6)
    ax.set_yticks(range(len(example["tgt"])), example["tgt"], fontsize=6)
    for chunks, line in ((example["sc"], ax.axvline), (example["tc"], ax.axhline)):
        for i in range(1, len(chunks)):
            if chunks[i] != chunks[i - 1]:
                line(i - 0.5, color="tab:red", lw=0.8)
    ax.set_title(title, fontsize=9)
    ax.grid(False)


def analyze(ctx: Context) -> Result:
    e1 = ctx.other("E1")
    rnn_counts, rnn_example = measure(find(e1, "seq2seq_attention"))
    tr_job = finished(e1, "transformer_mt")  # the extra model: E2's verdict is the RNN's
    tr_counts, tr_example = measure(tr_job) if tr_job is not None else ({}, {})
    rnn = next(iter(rnn_counts.values())).rates()
    tr_layers = {layer_label(n): c.rates() for n, c in sorted(tr_counts.items())}
    chance, diagonal = rnn["chance"], rnn["diagonal"]  # the same test pairs for every model

    fig, axes = figure(ncols=3, width=3.6, height=3.6)
    draw_map(axes[0], next(iter(rnn_example["maps"].values())), rnn_example, "RNN: Bahdanau weights")
    if tr_layers:
        last = list(tr_layers)[-1]
        best = max(tr_layers, key=lambda k: tr_layers[k]["argmax"])
        tr_name = sorted(tr_example["maps"])[-1]
        draw_map(axes[1], tr_example["maps"][tr_name], tr_example,
                 f"transformer: {layer_label(tr_name)} (head mean)")
        tr_head = (f", transformer last layer {tr_layers[last]['argmax']:.2f} (best, {best}: "
                   f"{tr_layers[best]['argmax']:.2f})")
        tr_text = (f" The transformer's last layer (heads averaged) scores {tr_layers[last]['argmax']:.0%} (weight "
                   f"{tr_layers[last]['mass']:.0%}), its {best} {tr_layers[best]['argmax']:.0%}.")
    else:
        axes[1].axis("off")
        tr_head, tr_text = "", " E1's transformer run did not finish, so only the RNN is scored."
    names = ["RNN", *(f"TF {k.split()[-1]}" for k in tr_layers)]
    scores = [rnn, *tr_layers.values()]
    x = np.arange(len(names))
    colors = ["tab:blue"] + ["tab:orange"] * len(tr_layers)
    grouped_bars(axes[2], {"argmax": [r["argmax"] for r in scores], "weight": [r["mass"] for r in scores]},
                 styles={"argmax": {"color": colors}, "weight": {"color": colors, "alpha": 0.45, "hatch": "//"}})
    axes[2].axhline(chance, color="grey", ls=":", label=f"chance {chance:.2f}")
    axes[2].axhline(diagonal, color="black", ls="--", label=f"diagonal {diagonal:.2f}")
    axes[2].set(xticks=x, ylim=(0, 1.3), yticks=np.linspace(0, 1, 6), ylabel="share on the right chunk",
                title="test, teacher-forced")
    axes[2].set_xticklabels(names, fontsize=7)
    axes[2].legend(fontsize=6, loc="upper center", ncol=2)
    save(fig, ctx.figure_path, "E2: alignment learned without supervision (red lines: number chunks)")

    n_tokens = next(iter(rnn_counts.values())).total
    labels = ["RNN + Bahdanau", *(f"transformer {k} (head mean)" for k in tr_layers)]
    rows = [{"attention": label, "argmax on the right chunk": fmt(r["argmax"]), "weight on it": fmt(r["mass"]),
             "argmax on <eos>": fmt(r["on_eos"]), "chance": fmt(r["chance"]), "diagonal guess": fmt(r["diagonal"]), "target tokens": n_tokens}
            for label, r in zip(labels, scores)]
    aligned = rnn["argmax"] >= chance + CHANCE_MARGIN
    some = max(rnn["argmax"], rnn["mass"]) >= chance + SOME_MARGIN
    return Result(
        rows=rows,
        headline=(f"argmax attention on the source chunk of the target token: RNN {rnn['argmax']:.2f}{tr_head}; "
                  f"chance {chance:.2f}"),
        verdict=verdict(aligned, some),
        evidence=(f"Both models were trained on the translation loss only (E1's runs). The Bahdanau weights' argmax "
                  f"lands on the right magnitude group ({', '.join(CHUNKS[1:])}) for {rnn['argmax']:.0%} of "
                  f"{n_tokens} test target tokens and {rnn['mass']:.0%} of their weight is there, against "
                  f"{chance:.0%} for a uniformly random source token: {rnn['argmax'] - chance:+.2f} (argmax) and "
                  f"{rnn['mass'] - chance:+.2f} (weight) above chance, where {CHANCE_MARGIN} counts as learned and "
                  f"{SOME_MARGIN} as partly learned. A guess that reads the source at a constant pace, knowing "
                  f"both lengths, scores {diagonal:.0%}. {rnn['on_eos']:.0%} of the RNN's argmaxes are on the source "
                  f"<eos> (whose forward encoder state has read the whole sentence); of the others, "
                  f"{rnn['argmax'] / max(1e-9, 1 - rnn['on_eos']):.0%} are on the right group.{tr_text}"),
        notes=("The chunks are coarse (the 3 words of 'deux cent trente-quatre mille' are one group), so this "
               "scores group-level alignment, not word-level. <eos> rows are not scored; an argmax on the source "
               "<eos> counts as a miss. The diagonal guess is a reference, not a bar: it knows the target length and "
               "that the groups come in the same order on both sides. Transformer heads are averaged; single heads may align better or worse."),
    )


CLAIM = Claim(
    id="E2",
    title="Alignment learned without supervision",
    statement=("Attention learns which source words each target word comes from (the alignment) with no "
               "supervision, only from the translation loss."),
    commands=[],
    analyze=analyze,
    uses=("E1",),
    minutes=1,
)
