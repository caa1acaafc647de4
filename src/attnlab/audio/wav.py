"""WAV files through ``soundfile`` (libsndfile): 16-bit PCM out; any PCM/float WAV in, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ..errors import UserError


class AudioFileError(UserError, ValueError):
    """A WAV file that cannot be used as it is; the message is one line naming the file."""


def write_wav(path: str | Path, wave, sample_rate: int) -> Path:
    """Write a mono waveform (float in [-1, 1] or int16) as 16-bit PCM; returns the path."""
    import soundfile as sf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = wave.detach().cpu().numpy() if hasattr(wave, "detach") else np.asarray(wave)
    if data.dtype != np.int16:
        data = (np.clip(data.astype(np.float32), -1.0, 1.0) * 32767).astype(np.int16)
    sf.write(str(path), data, sample_rate, subtype="PCM_16")
    return path


def read_wav(path: str | Path, expected_rate: int) -> np.ndarray:
    """A mono WAV at ``expected_rate`` -> float32 samples in [-1, 1].

    Refused with :class:`AudioFileError` (one line, the file named): a missing or unreadable file, more than one
    channel, another sample rate. Nothing is resampled silently: a wrong rate would shift every mel bin.
    """
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise AudioFileError(f"audio file not found: {path}")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile's messages are one line already
        raise AudioFileError(f"cannot read audio file {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if data.shape[1] != 1:
        raise AudioFileError(f"{path}: {data.shape[1]} channels; expected mono (mix it down, e.g. "
                             f"`sox in.wav -c 1 out.wav`)")
    if rate != expected_rate:
        raise AudioFileError(f"{path}: sample rate {rate} Hz; expected {expected_rate} Hz (resample the corpus, "
                             f"e.g. `sox in.wav -r {expected_rate} out.wav`, or set data.mel.sample_rate={rate})")
    return data[:, 0]
