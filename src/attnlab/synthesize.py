"""Speak text with a trained text-to-speech checkpoint: ``python synthesize.py ckpt=... text="twenty one"``.

The checkpoint carries everything: the task class, the model's hyper-parameters and the mel settings (the alphabet
is fixed in :mod:`attnlab.data.characters`). Text comes from ``text=`` or, with ``text=-``, from stdin (one utterance
per non-empty line). For each utterance it decodes autoregressively with the KV cache until the stop token fires
(or ``max_frames_per_char`` × characters + 20 frames), turns the mel into a waveform with Griffin-Lim and writes, in
this command's run directory (or ``out_dir``):

    utt_NN.wav             16-bit mono at the model's sample rate
    utt_NN_mel.png         the generated mel spectrogram
    utt_NN_alignment.png   the cross-attention (characters across, decoder steps up)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from .audio.features import MelExtractor
from .audio.wav import write_wav
from .data.characters import CharVocab, normalize_text
from .paths import CONF_DIR

log = logging.getLogger(__name__)

TTS_TASK = "attnlab.tasks.tts.TTSTask"


def load_tts(ckpt_path: str | Path, device: str = "cpu"):
    """The TTSTask of a checkpoint written by train.py model=tts; one-line errors for a wrong file."""
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path.absolute()}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise ValueError(f"{path} is not a PyTorch checkpoint ({type(e).__name__})") from None
    task_class = ckpt.get("task_class") if isinstance(ckpt, dict) else None
    if task_class != TTS_TASK:
        family = f"a {task_class.rsplit('.', 1)[-1]} checkpoint" if task_class else "not written by attnlab's train.py"
        raise ValueError(f"{path} is not a text-to-speech checkpoint ({family}); train one with "
                         f"`python train.py model=tts`")
    task_cls = hydra.utils.get_class(task_class)
    task = task_cls.load_from_checkpoint(path, map_location=device, weights_only=False)
    return task.eval()


def read_texts(text: str) -> list[str]:
    lines = sys.stdin.read().splitlines() if text == "-" else [text]
    texts = [normalize_text(t) for t in lines if t.strip()]
    if not texts:
        raise ValueError("no text to speak (give text=\"...\" or text=- with lines on stdin)")
    return texts


@torch.no_grad()
def synthesize(task, texts: list[str], out_dir: Path, *, max_frames_per_char: float = 12.0,
               griffin_lim_iters: int = 60, seed: int = 0) -> list[dict]:
    """Write one WAV (+ mel and alignment PNGs) per text; returns per utterance its paths, frames and whether the
    stop token fired."""
    from .decoding.tts import generate_mel
    from .utils.plotting import save_figure
    from .utils.tts_plots import alignment_figure, mel_figure

    vocab = CharVocab()
    extract = MelExtractor(task.mel_cfg)
    torch.manual_seed(seed)  # the prenet's inference dropout
    results = []
    for i, text in enumerate(texts):
        ids = torch.tensor([vocab.encode(text)], device=task.device)
        gen = generate_mel(task.net, ids, torch.tensor([ids.shape[1]], device=task.device),
                           max_frames_per_char=max_frames_per_char)
        n = int(gen.lengths[0])
        mel = gen.mel[0, :n].cpu()
        stem = f"utt_{i:02d}"
        wav = write_wav(out_dir / f"{stem}.wav", extract.griffin_lim(mel, n_iter=griffin_lim_iters, seed=seed),
                        task.mel_cfg.sample_rate)
        fig = mel_figure([mel], [f"{n} frames ({n * task.mel_cfg.hop_length / task.mel_cfg.sample_rate:.2f} s)"
                                 f"{'' if bool(gen.stopped[0]) else ', stop token never fired'}"], title=repr(text))
        mel_png = save_figure(fig, out_dir / f"{stem}_mel.png")
        align = torch.cat([a[0] for a in gen.attention], dim=0).mean(0)[: int(gen.steps[0])]  # all layers, heads
        fig = alignment_figure(align, vocab.decode(ids[0]), title="cross-attention, all decoder layers and heads")
        align_png = save_figure(fig, out_dir / f"{stem}_alignment.png")
        results.append({"text": text, "wav": wav, "mel_png": mel_png, "alignment_png": align_png, "frames": n,
                        "stopped": bool(gen.stopped[0])})
    return results


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="synthesize")
def _main(cfg: DictConfig) -> None:
    try:
        task = load_tts(cfg.ckpt, cfg.device)
        texts = read_texts(str(cfg.text))
    except (FileNotFoundError, ValueError) as e:
        log.error(str(e))
        sys.exit(2)
    out_dir = Path(cfg.out_dir) if cfg.get("out_dir") else Path(HydraConfig.get().runtime.output_dir)
    for r in synthesize(task, texts, out_dir, max_frames_per_char=cfg.max_frames_per_char,
                        griffin_lim_iters=cfg.griffin_lim_iters, seed=cfg.seed):
        stop = "" if r["stopped"] else " (stop token never fired: cut at the maximum length)"
        print(f"{r['text']!r} -> {r['wav']} ({r['frames']} frames){stop}")


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
