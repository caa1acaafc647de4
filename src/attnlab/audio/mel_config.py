"""The numbers the log-mel features depend on (:mod:`attnlab.audio.features` computes them), torch-free: the speech
data's files are read at its sample rate before train.py imports Lightning (:mod:`attnlab.runs.data_check`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MelConfig:
    """Every number the features depend on; stored in checkpoints so synthesis inverts exactly what was learned.

    ``mean``/``std`` normalize the log-mel (natural log of the mel-filtered STFT magnitude) to roughly zero mean and
    unit scale; the defaults were measured on the eSpeak corpus (silence sits at ln(1e-5) = -11.5).
    """

    sample_rate: int = 22050
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float | None = 8000.0
    log_floor: float = 1e-5
    mean: float = -5.0
    std: float = 2.5

    @classmethod
    def from_cfg(cls, cfg) -> "MelConfig":
        if isinstance(cfg, cls):
            return cfg
        return cls(**dict(cfg or {}))

    def to_dict(self) -> dict:
        return asdict(self)
