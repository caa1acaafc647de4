"""Autoregressive mel generation for :class:`~attnlab.models.tts.TransformerTTS` through a stepper with KV caches.

``TTSStepper`` has the step interface of :mod:`attnlab.decoding.step` with frames instead of tokens:

    out = stepper.prefill(frames)   # frames (B, T0, M) -> the last step's (frames (B, r, M), stop logits (B, r))
    out = stepper.step(frame)       # frame (B, M)      -> the same for one more step
    stepper.reorder(index)          # keep rows ``index`` (their caches too)

The text is encoded once; each decoder layer keeps a self-attention cache that grows by one step and a
cross-attention cache filled with the encoder's keys/values on the first step. With ``record_attention`` every
step's cross-attention weights are kept (the free-running alignment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..models.tts import TransformerTTS


class TTSStepper:
    def __init__(self, model: TransformerTTS, text: Tensor, text_lengths: Tensor, max_steps: int,
                 record_attention: bool = True):
        self.model, self.record = model, record_attention
        self.memory, self.mask = model.encode(text, text_lengths)
        self.caches = model.new_caches(text.shape[0], self.memory.shape[1], max_steps, dtype=self.memory.dtype,
                                       device=text.device)  # memory: N + 1 positions with the model's <eos>
        self.attention: list[list[Tensor]] = [[] for _ in model.decoder.layers]  # per layer: (B, H, t, N) pieces

    def _run(self, frames: Tensor) -> tuple[Tensor, Tensor]:
        memory = None if self.caches[0].cross_attn.length else self.memory
        layers = range(len(self.attention)) if self.record else ()
        hidden, weights = self.model.decode_with_attention(frames, memory, self.mask, layers, self.caches)
        for i, w in weights.items():
            self.attention[i].append(w)
        mel, stop = self.model.project(hidden[:, -1:])  # (B, r, M), (B, r)
        return mel, stop

    def prefill(self, frames: Tensor) -> tuple[Tensor, Tensor]:
        return self._run(frames)

    def step(self, frame: Tensor) -> tuple[Tensor, Tensor]:
        return self._run(frame[:, None])

    def reorder(self, index: Tensor) -> None:
        self.memory, self.mask = self.memory.index_select(0, index), self.mask.index_select(0, index)
        for c in self.caches:
            c.reorder(index)
        self.attention = [[a.index_select(0, index) for a in layer] for layer in self.attention]

    def alignments(self) -> list[Tensor]:
        """Per decoder layer, the cross-attention of every step so far: (B, H, steps, N)."""
        return [torch.cat(layer, dim=2) for layer in self.attention if layer]


@dataclass
class Generated:
    mel: Tensor  # (B, T, M) after the postnet, 0 beyond each length
    mel_before: Tensor  # (B, T, M) before the postnet
    lengths: Tensor  # (B,) frames up to and including the first stop (or the maximum)
    stopped: Tensor  # (B,) bool: the stop token fired (False: cut at the maximum length)
    attention: list[Tensor]  # per decoder layer (B, H, steps, N'), N' = N + 1 with the model's text_eos
    steps: Tensor  # (B,) decoder steps per utterance (⌈length / r⌉)
    text_lengths: Tensor  # (B,) positions the attention read: characters, + 1 for <eos> with text_eos


@torch.no_grad()
def generate_mel(model: TransformerTTS, text: Tensor, text_lengths: Tensor, *, max_frames_per_char: float = 12.0,
                 min_frames: int = 20, stop_threshold: float = 0.5, record_attention: bool = True) -> Generated:
    """Free-running synthesis: feed each step's last frame back until every row's stop token fires (probability >
    ``stop_threshold`` at any of its r frames) or it reaches ``max_frames_per_char`` × characters + ``min_frames``.
    """
    r, b = model.reduction, text.shape[0]
    max_frames = (text_lengths.float() * max_frames_per_char).ceil().long() + min_frames  # (B,)
    max_steps = min(int(math.ceil(int(max_frames.max()) / r)), model.max_dec_steps)
    stepper = TTSStepper(model, text, text_lengths, max_steps, record_attention)
    frames: list[Tensor] = []
    lengths = torch.zeros(b, dtype=torch.long, device=text.device)
    stopped = torch.zeros(b, dtype=torch.bool, device=text.device)
    done = torch.zeros(b, dtype=torch.bool, device=text.device)
    mel, stop = stepper.prefill(text.new_zeros(b, 1, model.n_mels, dtype=stepper.memory.dtype))
    for g in range(max_steps):
        frames.append(mel)
        fire = torch.sigmoid(stop.float()) > stop_threshold  # (B, r)
        first = torch.where(fire.any(1), fire.float().argmax(1), torch.full_like(lengths, r))  # frame in group
        new_stop = fire.any(1) & ~done
        lengths = torch.where(new_stop, g * r + first + 1, lengths)
        stopped |= new_stop
        done |= new_stop
        cut = ~done & ((g + 1) * r >= max_frames)
        lengths = torch.where(cut, torch.minimum((g + 1) * r * torch.ones_like(lengths), max_frames), lengths)
        done |= cut
        if bool(done.all()) or g == max_steps - 1:
            break
        mel, stop = stepper.step(mel[:, -1])
    lengths = torch.where(done, lengths, torch.full_like(lengths, len(frames) * r))
    before = torch.cat(frames, dim=1)  # (B, steps·r, M)
    valid = (torch.arange(before.shape[1], device=text.device)[None] < lengths[:, None])[..., None]
    before = before * valid
    after = model.refine(before) * valid
    return Generated(after, before, lengths, stopped, stepper.alignments(), -(-lengths // r), stepper.mask.sum(1))
