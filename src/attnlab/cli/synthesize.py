"""Speak text with a trained text-to-speech checkpoint: ``python synthesize.py ckpt=... text="twenty one"``.

The checkpoint carries everything: the task class, the model's hyper-parameters and the mel settings (the alphabet
is fixed in :mod:`attnlab.data.characters`). Text comes from ``text=`` or, with ``text=-``, from stdin (one utterance
per non-empty line). For each utterance it decodes autoregressively with the KV cache until the stop token fires
(or ``max_frames_per_char`` × characters + 20 frames), turns the mel into a waveform with Griffin-Lim and writes, in
this command's run directory (or ``out_dir``):

    utt_NN.wav             16-bit mono at the model's sample rate
    utt_NN_mel.png         the generated mel spectrogram (one panel per piece, see below)
    utt_NN_alignment.png   the cross-attention (characters across, decoder steps up)

An utterance longer than the model's character positions (``max_text_len``, 256 by default, less one for the ``<eos>``
the model appends with ``text_eos``) is spoken in pieces, the
way TTS toolkits read long text: split into sentences (at . ! ?), a sentence still too long at ; , : and then
between words, each piece synthesized on its own and the waveforms joined with ``piece_silence`` seconds of silence.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..runs import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from ..audio.features import MelExtractor
from ..audio.wav import write_wav
from ..checkpoints.read import checkpoint_file
from ..runs.load import load_task
from .input import (
    DEVICE_HELP,
    THREADS_HELP,
    apply_threads,
    check,
    check_output,
    is_device,
    is_int,
    is_number,
    is_seed,
    is_threads,
    read_lines,
)
from ..data.characters import CharVocab, normalize_text
from ..core.errors import InputError, one_line_errors
from .hydra_errors import one_line_hydra_errors
from ..core.paths import CONF_DIR

log = logging.getLogger(__name__)


def load_tts(ckpt_path: str | Path, device: str = "cpu"):
    """The TTSTask of a checkpoint written by train.py model=tts; one-line errors for a missing, unsafe or
    other-family file (the loader every entry point uses)."""
    task, _ = load_task(ckpt_path, "attnlab.tasks.tts.TTSTask", "text-to-speech", device)
    return task


def read_texts(text: str, input_errors: str = "strict") -> list[str]:
    lines = read_lines(None, input_errors)[0] if text == "-" else [text]
    texts = [normalize_text(t) for t in lines if t.strip()]
    if not texts:
        raise InputError("no text to speak (give text=\"...\" or text=- with lines on stdin)")
    return texts


def _fit(text: str, limit: int, separators: list[str]) -> list[str]:
    """``text`` cut at the first separator pattern into pieces of at most ``limit`` characters, packing neighbours
    back together while they fit; a part still too long is cut at the next pattern (the last resort: every
    ``limit`` characters, for a "word" longer than the model reads)."""
    if len(text) <= limit:
        return [text]
    if not separators:
        return [text[i : i + limit] for i in range(0, len(text), limit)]
    pieces: list[str] = []
    current = ""
    for part in re.split(separators[0], text):
        for piece in _fit(part.strip(), limit, separators[1:]):
            if current and len(current) + 1 + len(piece) <= limit:
                current = f"{current} {piece}"
            else:
                if current:
                    pieces.append(current)
                current = piece
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


def split_text(text: str, limit: int) -> list[str]:
    """A text the model can read in one go as itself; a longer one as sentences, then clauses, then word runs, each
    at most ``limit`` characters."""
    if len(text) <= limit:
        return [text]
    pieces = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        pieces += _fit(sentence.strip(), limit, [r"(?<=[;,:])\s+", r"\s+"])
    return [p for p in pieces if p]


def block_alignment(alignments: list[torch.Tensor]) -> torch.Tensor:
    """Each piece's (steps, chars) attention on the diagonal of one matrix, a blank column between pieces (the
    space that joined them): what the whole utterance's alignment looks like."""
    steps = sum(a.shape[0] for a in alignments)
    chars = sum(a.shape[1] for a in alignments) + len(alignments) - 1
    out = torch.zeros(steps, chars)
    s = c = 0
    for a in alignments:
        out[s : s + a.shape[0], c : c + a.shape[1]] = a
        s, c = s + a.shape[0], c + a.shape[1] + 1
    return out


@torch.no_grad()
def synthesize(task, texts: list[str], out_dir: Path, *, max_frames_per_char: float = 12.0,
               griffin_lim_iters: int = 60, seed: int = 0, piece_silence: float = 0.25) -> list[dict]:
    """Write one WAV (+ mel and alignment PNGs) per text; returns per utterance its paths, frames, pieces and whether
    the stop token fired (in every piece)."""
    from ..decoding.tts import generate_mel
    from ..plots.figures import save_figure
    from ..plots.tts import alignment_figure, mel_figure

    vocab = CharVocab()
    extract = MelExtractor(task.mel_cfg)
    rate, hop = task.mel_cfg.sample_rate, task.mel_cfg.hop_length
    limit = int(getattr(task.net, "max_chars", 0)) or 10**9  # the position table, less one for the model's <eos>
    torch.manual_seed(seed)  # the prenet's inference dropout
    results = []
    for i, text in enumerate(texts):
        pieces = split_text(text, limit)
        waves, mels, aligns, stopped, labels = [], [], [], [], []
        for piece in pieces:
            ids = torch.tensor([vocab.encode(piece)], device=task.device)
            gen = generate_mel(task.net, ids, torch.tensor([ids.shape[1]], device=task.device),
                               max_frames_per_char=max_frames_per_char)
            n = int(gen.lengths[0])
            mels.append(gen.mel[0, :n].cpu())
            stopped.append(bool(gen.stopped[0]))
            if waves:
                waves.append(torch.zeros(round(piece_silence * rate)))
            waves.append(extract.griffin_lim(mels[-1], n_iter=griffin_lim_iters, seed=seed))
            aligns.append(torch.cat([a[0] for a in gen.attention], dim=0).mean(0)[: int(gen.steps[0])].cpu())
            labels += [" "] * bool(labels) + task.net.char_labels(ids[0], ids.shape[1])  # " ": block_alignment's gap
        stem = f"utt_{i:02d}"
        wav = write_wav(out_dir / f"{stem}.wav", torch.cat(waves), rate)
        frames = sum(m.shape[0] for m in mels)
        titles = [f"{m.shape[0]} frames ({m.shape[0] * hop / rate:.2f} s){'' if s else ', stop token never fired'}"
                  for m, s in zip(mels, stopped)]
        fig = mel_figure(mels, titles, title=repr(text) if len(pieces) == 1 else f"{len(pieces)} pieces of {text!r}")
        mel_png = save_figure(fig, out_dir / f"{stem}_mel.png")
        align = aligns[0] if len(aligns) == 1 else block_alignment(aligns)
        fig = alignment_figure(align, labels, title="cross-attention, all decoder layers and heads")
        align_png = save_figure(fig, out_dir / f"{stem}_alignment.png")
        results.append({"text": text, "wav": wav, "mel_png": mel_png, "alignment_png": align_png, "frames": frames,
                        "pieces": len(pieces), "stopped": all(stopped)})
    return results


def check_options(cfg: DictConfig) -> None:
    """Every option's value, before the checkpoint is read: one line naming the first bad one."""
    check(cfg, "ckpt", lambda v: isinstance(v, str) and v,
          "the path of a checkpoint (ckpt=<run>/checkpoints/last.ckpt)")
    check(cfg, "text", lambda v: isinstance(v, (str, int, float)) and str(v).strip(),
          "the text to speak (text=\"twenty one\"), or - to read one utterance per line from stdin")
    check(cfg, "max_frames_per_char", lambda v: is_number(v) and 0 < v <= 1000, "a number > 0 and <= 1000")
    check(cfg, "griffin_lim_iters", lambda v: is_int(v) and v >= 1, "an integer >= 1")
    check(cfg, "piece_silence", lambda v: is_number(v) and 0 <= v <= 10, "seconds from 0 to 10")
    check(cfg, "seed", is_seed, "an integer from -2**63 to 2**64 - 1")
    check(cfg, "input_errors", lambda v: v in ("strict", "replace"), "strict or replace")
    check_output("out_dir", cfg.get("out_dir"), folder=True)
    check(cfg, "device", is_device, DEVICE_HELP)
    check(cfg, "threads", is_threads, THREADS_HELP)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="synthesize")
def _main(cfg: DictConfig) -> None:
    global _job_started
    _job_started = True
    with one_line_errors(log):
        check_options(cfg)
        # the text before the model: a bad input fails without waiting for the model to load (seconds, most of it
        # importing Lightning); a missing checkpoint before waiting on stdin
        checkpoint_file(cfg.ckpt)
        texts = read_texts(str(cfg.text), cfg.input_errors)
        apply_threads(cfg, log)
        task = load_tts(cfg.ckpt, cfg.device)
        out_dir = Path(cfg.out_dir) if cfg.get("out_dir") else Path(HydraConfig.get().runtime.output_dir)
        for r in synthesize(task, texts, out_dir, max_frames_per_char=cfg.max_frames_per_char,
                            griffin_lim_iters=cfg.griffin_lim_iters, seed=cfg.seed, piece_silence=cfg.piece_silence):
            stop = "" if r["stopped"] else " (stop token never fired: cut at the maximum length)"
            pieces = f", {r['pieces']} pieces" if r["pieces"] > 1 else ""
            print(f"{r['text']!r} -> {r['wav']} ({r['frames']} frames{pieces}){stop}")


_job_started = False  # Hydra's errors before the job (a bad override) are one line, exit 2 (hydra_errors.py)


def main() -> None:
    one_line_hydra_errors(_main, lambda: _job_started)


if __name__ == "__main__":
    main()
