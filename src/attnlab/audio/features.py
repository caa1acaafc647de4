"""Log-mel spectrograms (the TTS model's target) and their inversion back to a waveform.

    waveform (T,) --torch.stft (n_fft 1024, hop 256, Hann)--> |STFT| (F=513, frames)
      --mel filterbank (80 × 513, Slaney scale and area normalization, as librosa.filters.mel's default)--> mel
      --ln(max(mel, 1e-5))--> log-mel --(x - mean) / std--> the normalized frames the model predicts (frames, 80)

The filterbank is computed here (~30 lines of numpy) rather than imported from librosa, which would pull numba
and llvmlite into every install; a test checks it equals ``librosa.filters.mel`` where librosa is installed.

Inversion (for listening to predictions; no neural vocoder): undo the normalization and the log, map the mel
spectrum back to a linear one with the filterbank's pseudo-inverse (negative values clipped), sharpen it with a
power (Tacotron's trick: reduces Griffin-Lim's "phasiness"), then Griffin-Lim (1984): alternate between imposing
the magnitude and taking the phase of the STFT of the inverse STFT.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .mel_config import MelConfig


def hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels / 200 Hz), logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> Tensor:
    """(n_mels, n_fft // 2 + 1) triangular filters, equally spaced on the Slaney mel scale, each of unit area
    ("slaney" normalization: 2 / bandwidth in Hz), as ``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)``."""
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))  # band edges, Hz
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


class MelExtractor:
    """waveform -> normalized log-mel frames, and back (see the module docstring)."""

    def __init__(self, cfg: MelConfig | dict | None = None):
        self.cfg = MelConfig.from_cfg(cfg)
        c = self.cfg
        self.basis = mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, c.fmin, c.fmax)  # (n_mels, F)
        self.window = torch.hann_window(c.win_length)

    def magnitude(self, wave: Tensor) -> Tensor:
        """(..., samples) float -> |STFT| (..., F, frames); frames = samples // hop + 1 (centered, reflect pad)."""
        c = self.cfg
        spec = torch.stft(wave, c.n_fft, c.hop_length, c.win_length, self.window.to(wave.device), center=True,
                          pad_mode="reflect", return_complex=True)
        return spec.abs()

    def __call__(self, wave: Tensor) -> Tensor:
        """(samples,) float in [-1, 1] -> (frames, n_mels) normalized log-mel."""
        mel = self.basis.to(wave.device) @ self.magnitude(wave.float())  # (n_mels, frames)
        log_mel = torch.log(torch.clamp(mel, min=self.cfg.log_floor))
        return ((log_mel - self.cfg.mean) / self.cfg.std).T.contiguous()

    def denormalize(self, frames: Tensor) -> Tensor:
        """(frames, n_mels) normalized -> log-mel (natural log of the mel magnitude)."""
        return frames.float() * self.cfg.std + self.cfg.mean

    def to_linear(self, frames: Tensor) -> Tensor:
        """(frames, n_mels) normalized log-mel -> linear magnitude (F, frames) via the filterbank's pseudo-inverse."""
        mel = torch.exp(self.denormalize(frames)).T  # (n_mels, frames)
        inv = torch.linalg.pinv(self.basis.double()).float().to(mel.device)  # (F, n_mels)
        return torch.clamp(inv @ mel, min=0.0)

    def griffin_lim(self, frames: Tensor, n_iter: int = 32, power: float = 1.3, seed: int = 0) -> Tensor:
        """(frames, n_mels) normalized log-mel -> waveform (samples,) float in [-1, 1] (peak-normalized to 0.95)."""
        c = self.cfg
        mag = self.to_linear(frames) ** power  # (F, frames)
        window = self.window.to(mag.device)
        gen = torch.Generator().manual_seed(seed)
        phase = torch.exp(2j * torch.pi * torch.rand(mag.shape, generator=gen)).to(mag.device)
        length = (mag.shape[1] - 1) * c.hop_length
        if length == 0:  # one frame: no samples between frame centres (a model that stopped at once)
            return torch.zeros(0)
        # reflect padding needs more than n_fft/2 samples: a 2-3 frame output (an untrained model that stops
        # early, seen in free-running validation) is padded with zeros instead of crashing the run
        pad_mode = "reflect" if length > c.n_fft // 2 else "constant"
        wave = torch.zeros(length)
        for _ in range(max(1, n_iter)):
            wave = torch.istft(mag * phase, c.n_fft, c.hop_length, c.win_length, window, center=True, length=length)
            spec = torch.stft(wave, c.n_fft, c.hop_length, c.win_length, window, center=True, pad_mode=pad_mode,
                              return_complex=True)
            phase = spec / spec.abs().clamp(min=1e-8)
        wave = torch.istft(mag * phase, c.n_fft, c.hop_length, c.win_length, window, center=True, length=length)
        peak = wave.abs().max()
        return wave * (0.95 / peak) if peak > 0 else wave
