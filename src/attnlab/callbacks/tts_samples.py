"""Listening material of a text-to-speech model after every validation: mels, alignment, audio.

For a task with ``listening_sample() -> ListeningSample`` (:class:`~attnlab.tasks.protocols.ListeningSampleSource`:
the TTS task); others are left alone. On global rank zero, never for the sanity check, it writes into
``<run dir>/tts_samples/``

* ``epochNNN_mel.png``: target, teacher-forced and free-running mel spectrograms of one fixed validation utterance;
* ``epochNNN_alignment.png``: the free-running cross-attention (characters across, decoder steps up);
* ``epochNNN.wav``: Griffin-Lim audio of the free-running mel,

and logs them to W&B as ``tts/mel``, ``tts/alignment`` and ``tts/audio``. ``last_paths`` holds the files of the last
call.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from ..audio.wav import write_wav
from ..tasks.protocols import ListeningSampleSource
from ..plots.figures import save_figure
from .media import run_dir, step_caption, wandb_loggers, writes_now


class TTSSamplesCallback(L.Callback):
    def __init__(self, dirname: str = "tts_samples"):
        super().__init__()
        self.dirname = dirname
        self.last_paths: list[Path] = []

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if writes_now(trainer) and isinstance(pl_module, ListeningSampleSource):
            self.last_paths = self.write(trainer, pl_module, run_dir(trainer) / self.dirname,
                                         f"epoch{trainer.current_epoch:03d}")

    @staticmethod
    def write(trainer: L.Trainer, pl_module: ListeningSampleSource, out_dir: Path, stem: str) -> list[Path]:
        from ..plots.tts import alignment_figure, mel_figure

        sample = pl_module.listening_sample()
        text, step = sample.text, step_caption(trainer)
        fig = mel_figure([m for _, m in sample.mels], [t for t, _ in sample.mels], title=f"{text!r} — {step}")
        mel_png = save_figure(fig, out_dir / f"{stem}_mel.png")
        del fig
        fig = alignment_figure(sample.alignment, sample.labels or text, title=f"free-running alignment — {step}")
        align_png = save_figure(fig, out_dir / f"{stem}_alignment.png")
        del fig
        wav = write_wav(out_dir / f"{stem}.wav", sample.wave, sample.sample_rate)
        for lg in wandb_loggers(trainer):
            lg.log_image(key="tts/mel", images=[str(mel_png)], step=trainer.global_step, caption=[text])
            lg.log_image(key="tts/alignment", images=[str(align_png)], step=trainer.global_step, caption=[text])
            lg.log_audio(key="tts/audio", audios=[str(wav)], step=trainer.global_step, caption=[text],
                         sample_rate=[sample.sample_rate])
        return [mel_png, align_png, wav]
