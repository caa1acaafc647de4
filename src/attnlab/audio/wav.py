"""WAV files through ``soundfile`` (libsndfile): 16-bit PCM out; any PCM/float WAV in, with one-line errors."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..files.atomic import write_atomic
from ..core.errors import AudioFileError


def write_wav(path: str | Path, wave, sample_rate: int) -> Path:
    """Write a mono waveform (float in [-1, 1] or int16) as 16-bit PCM; returns the path."""
    import soundfile as sf

    data = wave.detach().cpu().numpy() if hasattr(wave, "detach") else np.asarray(wave)
    if data.dtype != np.int16:
        data = (np.clip(data.astype(np.float32), -1.0, 1.0) * 32767).astype(np.int16)
    return write_atomic(path, lambda f: sf.write(f, data, sample_rate, format="WAV", subtype="PCM_16"),
                        durable=False)


def wav_data_sizes(path: str | Path) -> tuple[int, int] | None:
    """(bytes of audio the header's ``data`` chunk promises, bytes of it present in the file), or None where that
    cannot be told: not a RIFF/WAVE file (RF64, other formats: libsndfile judges those), no ``data`` chunk in the
    header, or a streaming writer's placeholder size (0 or 0xFFFFFFFF: "until the end of the file").

    libsndfile reads a truncated file without complaint, returning only the frames present; this is how
    :func:`read_wav` notices that half an utterance is missing (a partial copy or download).
    """
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        offset = 12
        while offset + 8 <= size:  # chunks: 4-byte id, little-endian 4-byte size, data, a pad byte if odd
            f.seek(offset)
            chunk_id, chunk_size = struct.unpack("<4sI", f.read(8))
            if chunk_id == b"data":
                if chunk_size in (0, 0xFFFFFFFF):
                    return None
                return chunk_size, size - (offset + 8)
            offset += 8 + chunk_size + (chunk_size & 1)
    return None


def read_wav(path: str | Path, expected_rate: int) -> np.ndarray:
    """A mono WAV at ``expected_rate`` -> float32 samples in [-1, 1].

    Refused with :class:`AudioFileError` (one line, the file named): a missing or unreadable file, a truncated one
    (fewer bytes of audio than its header promises), more than one channel, another sample rate. Nothing is
    resampled silently: a wrong rate would shift every mel bin.
    """
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise AudioFileError(f"audio file not found: {path}")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile's messages are one line already
        raise AudioFileError(f"cannot read audio file {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    sizes = wav_data_sizes(path)
    if sizes is not None and sizes[1] < sizes[0]:
        promised, present = sizes
        raise AudioFileError(f"{path}: truncated: its header promises {promised} bytes of audio, the file holds "
                             f"{present} (an interrupted copy or download? copy the file again)")
    if data.shape[1] != 1:
        raise AudioFileError(f"{path}: {data.shape[1]} channels; expected mono (mix it down, e.g. "
                             f"`sox in.wav -c 1 out.wav`)")
    if rate != expected_rate:
        raise AudioFileError(f"{path}: sample rate {rate} Hz; expected {expected_rate} Hz (resample the corpus, "
                             f"e.g. `sox in.wav -r {expected_rate} out.wav`, or set data.mel.sample_rate={rate})")
    return data[:, 0]
