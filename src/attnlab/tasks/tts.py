"""Text-to-speech task: Transformer-TTS losses (mel L1 before/after the postnet, stop BCE, guided attention; claim
C25), alignment metrics, and listening material (mels, alignments, Griffin-Lim audio) at every validation.

Logged (stage = train / val / test):

* ``{stage}/loss``: mel L1 before + after the postnet + stop BCE — the guided-attention term is left out of
  val/test so runs with it on and off compare on the same number (train/loss includes it);
  ``{stage}/mel_l1`` (after the postnet), ``{stage}/mel_l1_before``, ``{stage}/stop_bce``, ``train/guided``;
* ``{stage}/stop_acc``: stop token right (threshold 0.5) over the real frames;
* ``{stage}/focus_rate_tf``, ``{stage}/diagonal_rate_tf``: of the teacher-forced cross-attention of the guided
  layers and heads (the same ones whether or not the loss is on, so on/off compare);
* free-running, on the first ``free_running_samples`` utterances of the first val/test batch:
  ``focus_rate_fr``, ``diagonal_rate_fr``, ``skipped_chars`` and ``repeats`` per utterance (see
  :func:`~attnlab.modules.guided_attention.skips_and_repeats`), ``stop_rate`` (share that stopped before the
  maximum length), ``length_ratio`` (generated / true frames).

Listening material of one fixed validation utterance (target, teacher-forced and free-running mel, the free-running
alignment, Griffin-Lim audio of the free-running mel: :meth:`TTSTask.listening_sample`) is written after every
validation by :mod:`attnlab.callbacks.tts_samples` to ``<run dir>/tts_samples/`` and W&B.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ..audio.features import MelConfig, MelExtractor
from ..data.characters import CharVocab
from ..decoding.tts import generate_mel
from ..modules.guided_attention import diagonal_rate, focus_rate, guided_attention_loss, skips_and_repeats
from ..plots.figures import attention_heatmap_figure
from .base import Task
from .protocols import AttentionFigure, AttentionSample, ListeningSample, StepOutput

log = logging.getLogger(__name__)


def frame_mask(lengths: Tensor, t: int) -> Tensor:
    return torch.arange(t, device=lengths.device)[None] < lengths[:, None]  # (B, T)


class TTSTask(Task):
    """Args:
        guided_attention: ``enabled``, ``sigma`` (ESPnet 0.4, DC-TTS 0.2; conf/model/tts.yaml: 0.2), ``weight`` λ,
            ``layers`` (decoder layer indices; default the last two), ``heads`` (the first k heads of each),
            ``half_life`` (steps after which λ has halved; null = constant).
        stop_pos_weight: BCE weight of the one positive (last) frame against the many negatives.
        mel_loss: l1 or l2.
        mel: the feature settings (``${data.mel}``), kept in the checkpoint for synthesis.
        free_running_samples: utterances decoded free-running at each val/test (alignment metrics).
        max_frames_per_char: free-running length limit (× characters, + 20 frames).
        griffin_lim_iters: iterations for the audio of the listening sample.
    """

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, guided_attention=None,
                 stop_pos_weight: float = 5.0, mel_loss: str = "l1", mel=None, free_running_samples: int = 4,
                 max_frames_per_char: float = 12.0, griffin_lim_iters: int = 32):
        super().__init__(net, optimizer, scheduler, compile)
        ga = {"enabled": True, "sigma": 0.4, "weight": 1.0, "layers": [-2, -1], "heads": 2, "half_life": None,
              **(dict(guided_attention) if guided_attention else {})}
        n_dec = len(self.net.decoder.layers)
        ga["layers"] = sorted({int(i) % n_dec for i in ga["layers"]})
        ga["heads"] = max(1, min(int(ga["heads"]), self.net.n_heads))
        self.guided = ga
        if mel_loss not in ("l1", "l2"):
            raise ValueError(f"mel_loss must be l1 or l2, got {mel_loss!r}")
        self.mel_loss, self.stop_pos_weight = mel_loss, stop_pos_weight
        self.mel_cfg = MelConfig.from_cfg(mel)
        if self.mel_cfg.n_mels != self.net.n_mels:
            raise ValueError(f"data has {self.mel_cfg.n_mels} mel bins, the model {self.net.n_mels}")
        self.free_running_samples, self.max_frames_per_char = free_running_samples, max_frames_per_char
        self.griffin_lim_iters = griffin_lim_iters
        self.vocab = CharVocab()
        self._sample: dict | None = None
        self._listening: tuple[tuple, ListeningSample] | None = None  # (trainer step, sample): see listening_sample

    # --- losses ---------------------------------------------------------------------------------------------
    def guided_weight(self) -> float:
        if not self.guided["enabled"]:
            return 0.0
        hl = self.guided["half_life"]
        return self.guided["weight"] * (0.5 ** (self.global_step / hl) if hl else 1.0)

    def losses(self, batch: dict, out: dict) -> dict[str, Tensor]:
        mel, lengths = batch["mel"], batch["mel_lengths"]
        t = mel.shape[1]
        mask = frame_mask(lengths, t)[..., None].float()  # (B, T, 1)
        dist = F.l1_loss if self.mel_loss == "l1" else F.mse_loss
        n = mask.sum() * mel.shape[2]

        def mel_term(pred: Tensor) -> Tensor:
            return (dist(pred[:, :t], mel, reduction="none") * mask).sum() / n

        stop_target = F.one_hot(lengths - 1, out["stop_logits"].shape[1]).float()  # 1 at each last real frame
        valid = frame_mask(lengths, out["stop_logits"].shape[1]).float()
        bce = F.binary_cross_entropy_with_logits(
            out["stop_logits"], stop_target, reduction="none",
            pos_weight=torch.tensor(self.stop_pos_weight, device=mel.device))
        stop_bce = (bce * valid).sum() / valid.sum()
        stop_acc = (((out["stop_logits"] > 0).float() == stop_target).float() * valid).sum() / valid.sum()
        return {"mel_l1_before": mel_term(out["mel_before"]), "mel_l1": mel_term(out["mel_after"]),
                "stop_bce": stop_bce, "stop_acc": stop_acc}

    def guided_maps(self, out: dict) -> list[Tensor]:
        return [a[:, : self.guided["heads"]] for a in out["attention"]]

    def forward(self, text, text_lengths, mel, mel_lengths=None):
        return self._forward(text, text_lengths, mel, mel_lengths, attention_layers=self.guided["layers"])

    # --- steps ----------------------------------------------------------------------------------------------
    def step(self, batch: dict, stage: str) -> StepOutput:
        train = stage == "train"
        with_maps = self.guided["enabled"] or not train  # val/test: the alignment metrics read the same maps
        # The guided layers' cross-attention comes back in out["attention"] (only those layers leave SDPA).
        out = self._forward(batch["text"], batch["text_lengths"], batch["mel"], batch["mel_lengths"],
                            attention_layers=self.guided["layers"] if with_maps else ())
        parts = self.losses(batch, out)
        loss = parts["mel_l1_before"] + parts["mel_l1"] + parts["stop_bce"]
        metrics = {k: parts[k] for k in ("mel_l1", "mel_l1_before", "stop_bce", "stop_acc")}
        if train:
            if with_maps:
                # W on the N (+ 1 <eos>) positions the attention reads: out["text_lengths"], not the batch's
                guided = guided_attention_loss(self.guided_maps(out), out["text_lengths"], out["dec_lengths"],
                                               self.guided["sigma"])
                metrics["guided"] = guided
                loss = loss + self.guided_weight() * guided
            return StepOutput(loss, {"loss": loss, **metrics})
        maps = torch.cat(self.guided_maps(out), dim=1)  # (B, layers·heads, G, N)
        tl, dl = out["text_lengths"], out["dec_lengths"]
        metrics["focus_rate_tf"] = focus_rate(maps, tl, dl).mean()
        metrics["diagonal_rate_tf"] = diagonal_rate(maps, tl, dl).mean()
        # loss: without the guided term, so runs with it on and off compare on the same number
        return StepOutput(loss, {"loss": loss, **metrics}, ("loss", "mel_l1", "diagonal_rate_tf"),
                          batch_size=batch["text"].shape[0])

    def generate_step(self, batch: dict, batch_idx: int, stage: str) -> None:
        if batch_idx == 0 and self.free_running_samples > 0:
            self.log_free_running(batch, stage)

    def free_running(self, text: Tensor, text_lengths: Tensor):
        return generate_mel(self.net, text, text_lengths, max_frames_per_char=self.max_frames_per_char)

    def alignment_maps(self, gen) -> Tensor:
        """Free-running cross-attention of the guided layers and heads: (B, layers·heads, steps, N)."""
        return torch.cat([gen.attention[i][:, : self.guided["heads"]] for i in self.guided["layers"]], dim=1)

    def log_free_running(self, batch: dict, stage: str) -> None:
        k = min(self.free_running_samples, batch["text"].shape[0])
        gen = self.free_running(batch["text"][:k], batch["text_lengths"][:k])
        maps, tl = self.alignment_maps(gen), gen.text_lengths  # tl: N (+ 1 <eos>), the attention's width
        skips, repeats = zip(*(skips_and_repeats(maps[i], int(tl[i]), int(gen.steps[i])) for i in range(k)))
        kw = dict(on_epoch=True, batch_size=k)
        self.log(f"{stage}/focus_rate_fr", focus_rate(maps, tl, gen.steps).mean(), **kw)
        self.log(f"{stage}/diagonal_rate_fr", diagonal_rate(maps, tl, gen.steps).mean(), **kw)
        self.log(f"{stage}/skipped_chars", float(sum(skips)) / k, **kw)
        self.log(f"{stage}/repeats", float(sum(repeats)) / k, **kw)
        self.log(f"{stage}/stop_rate", gen.stopped.float().mean(), **kw)
        self.log(f"{stage}/length_ratio", (gen.lengths.float() / batch["mel_lengths"][:k].float()).mean(), **kw)

    # --- listening material -----------------------------------------------------------------------------------
    def _example(self) -> dict:
        if self._sample is None:
            self._sample = self.trainer.datamodule.example("val")
        return {k: v.to(self.device) for k, v in self._sample.items()}

    @torch.no_grad()
    def listening_sample(self) -> ListeningSample:
        """The fixed validation utterance: target, teacher-forced and free-running mels, the free-running
        alignment (mean of the guided heads) and Griffin-Lim audio of the free-running mel.

        Computed once per training step while a trainer is attached (the weights do not change within one): the
        attention explorer's audio and the tts_samples callback, both at a validation's end, share one synthesis
        (and one draw of the prenet's inference dropout)."""
        key = (id(self._trainer), self.global_step) if self._trainer is not None else None
        if key is not None and self._listening is not None and self._listening[0] == key:
            return self._listening[1]
        ex = self._example()
        was_training = self.training
        self.eval()
        try:
            tf = self(ex["text"], ex["text_lengths"], ex["mel"], ex["mel_lengths"])
            gen = self.free_running(ex["text"], ex["text_lengths"])
        finally:
            self.train(was_training)
        t, n = int(ex["mel_lengths"][0]), int(gen.lengths[0])
        mels = [("target", ex["mel"][0, :t]), ("teacher-forced prediction", tf["mel_after"][0, :t]),
                (f"free-running ({n} frames{'' if bool(gen.stopped[0]) else ', no stop'})", gen.mel[0, :n])]
        alignment = self.alignment_maps(gen)[0].mean(0)[: int(gen.steps[0])]  # (steps, N)
        wave = MelExtractor(self.mel_cfg).griffin_lim(gen.mel[0, :n].cpu(), n_iter=self.griffin_lim_iters)
        sample = ListeningSample(self.vocab.decode(ex["text"][0]), mels, alignment, wave, self.mel_cfg.sample_rate,
                                 labels=self.net.char_labels(ex["text"][0], int(ex["text_lengths"][0])))
        self._listening = (key, sample) if key is not None else None
        return sample

    # --- protocols used by callbacks ----------------------------------------------------------------------------
    def tokens_in_batch(self, batch: dict):
        """Throughput counts mel frames (perf/tokens_per_sec = frames/s)."""
        return batch["mel_lengths"].sum()

    def attention_sample(self, max_tokens: int) -> AttentionSample:
        """The fixed validation utterance: characters across, decoder steps (unnamed) down."""
        ex = self._example()
        chars = self.net.char_labels(ex["text"][0], int(ex["text_lengths"][0]))  # + <eos>: one per column
        return AttentionSample({k: ex[k] for k in ("text", "text_lengths", "mel", "mel_lengths")}, keys=chars)

    def attention_forward(self, text, text_lengths, mel, mel_lengths):
        return self.net(text, text_lengths, mel, mel_lengths)

    def explorer_view(self, maps: dict[str, Tensor], sample: AttentionSample) -> dict:
        """The explorer page's speech view: every frame, and the guide's width (attnlab.explorer); the maps are
        teacher-forced (``attention_forward`` feeds the decoder the utterance's recorded frames), the audio the
        callback adds is the listening sample's free-running synthesis: the page labels each."""
        from ..plots.views import speech_view

        return speech_view(self.guided.get("sigma") if self.guided.get("enabled", True) else None,
                           maps="teacher-forced")

    def render_attention(self, maps: dict[str, Tensor], sample: AttentionSample) -> list[AttentionFigure]:
        """Teacher-forced cross-attention of every decoder layer, one panel per head, uncropped: characters across,
        decoder steps down (a good alignment is a diagonal from top left to bottom right)."""
        out = []
        for name in sorted(n for n in maps if "cross_attn" in n):
            w = maps[name][0]  # (H, G, N)
            fig = attention_heatmap_figure(w, x_labels=sample.keys, title=f"{name} — epoch {self.current_epoch}, "
                                                                          f"step {self.global_step}")
            out.append(AttentionFigure(name, fig))
        return out
