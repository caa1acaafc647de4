"""What the image and speech families add to an explorer page: the picture, the rollout, the guide, the audio.

Tasks call these from their ``explorer_view(maps, sample)`` (the optional protocol
:class:`~attnlab.tasks.protocols.ExplorerViewSource`); everything is inlined as ``data:`` URIs, so the page still
requests nothing.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any

import numpy as np

from torch import Tensor

__all__ = ["png_data_uri", "wav_data_uri", "audio_note", "image_view", "speech_view"]


def natural_key(name: str) -> list:
    """``blocks.2`` before ``blocks.10``: digits compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def png_data_uri(image: Tensor | np.ndarray) -> str:
    """(C, H, W) or (H, W) image, any range (min-max scaled like the PNG figures) -> a PNG ``data:`` URI."""
    from PIL import Image

    from .vision import image_to_display

    arr = (np.asarray(image_to_display(image), dtype=np.float32) * 255).round().clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


AUDIO_RATE = 16000  # the page's audio rate: holds everything up to 8 kHz, the mel features' fmax in conf/data


def wav_data_uri(wave: Tensor | np.ndarray, sample_rate: int, max_rate: int = AUDIO_RATE) -> str:
    """A mono waveform -> a compact WAV ``data:`` URI: resampled to at most ``max_rate`` Hz and stored as 8-bit
    mu-law (G.711: telephone quality, 1 byte per sample, which every browser's WAV reader decodes), about 21 kB of
    page per second of speech. The full-quality WAV stays in the run folder (``tts_samples/``)."""
    import soundfile as sf

    w = wave.detach().float().cpu().numpy() if isinstance(wave, Tensor) else np.asarray(wave, dtype=np.float32)
    w, rate = w.reshape(-1).astype(np.float64), int(sample_rate)
    if rate > max_rate and w.size:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(int(max_rate), rate)
        w, rate = resample_poly(w, int(max_rate) // g, rate // g), int(max_rate)
    buf = io.BytesIO()
    sf.write(buf, np.clip(w, -1, 1), rate, format="WAV", subtype="ULAW")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def audio_note(wave: Tensor | np.ndarray, sample_rate: int, caption: str) -> dict[str, str]:
    """An epoch's audio for the page's slider: ``{"audio": data URI, "audio_caption": caption}``; no ``audio`` when
    the wave is empty (a model that stops at its first step says nothing)."""
    if np.asarray(wave.detach().cpu() if isinstance(wave, Tensor) else wave).size == 0:
        return {"audio_caption": f"{caption}: no audio (the model stopped at once)"}
    return {"audio": wav_data_uri(wave, sample_rate), "audio_caption": caption}


def image_view(maps: dict[str, Tensor], image: Tensor, grid: int, prefix: int, pool: str,
               caption: str = "", patch_px: float = 1.0, patch: int | None = None) -> dict[str, Any]:
    """The ViT's page: the image, its patch grid, and the rollout through every layer as one more map.
    ``patch``: the query patch the page opens on (row-major, the prefix not counted; the task's
    ``attention_patch``, the one its PNGs draw); None: the centre patch."""
    from ..analysis.rollout import attention_rollout

    names = sorted(maps, key=natural_key)
    rollout = attention_rollout([maps[n][:1].float() for n in names])[:, None]  # (1, 1, T, T)
    grid = int(grid)
    patch = (grid // 2) * grid + grid // 2 if patch is None else int(patch)
    return {"family": "image", "image": png_data_uri(image), "grid": grid, "prefix": int(prefix),
            "pool": pool, "patch_px": float(patch_px), "patch": patch, "whole": True, "maps": {"rollout": rollout},
            "epoch": {"caption": caption}}


SPEECH_MAPS = ("teacher-forced", "free-running")


def speech_view(guide_sigma: float | None = None, wave: Tensor | None = None, sample_rate: int | None = None,
                caption: str = "", *, maps: str) -> dict[str, Any]:
    """The TTS page: the cross-attention only (what the PNG callback draws; the decoder's frames x frames
    self-attention would be most of the page's size), whole (every frame), the guide's width, and the audio (of
    this epoch: the slider plays each epoch's) when there is some.

    ``maps``: how the decoder ran when the maps were captured, which the page says above the map: "teacher-forced"
    (a training run's maps: the decoder reads the utterance's recorded frames) or "free-running" (it reads its own,
    as when it speaks: ``python -m attnlab.explore``). The page's audio is always free-running (a synthesis) and
    says so: a training page's map and audio come from two different runs of the decoder."""
    if maps not in SPEECH_MAPS:
        raise ValueError(f"maps={maps!r}: one of {', '.join(SPEECH_MAPS)}")
    view: dict[str, Any] = {"family": "speech", "whole": True, "keep": "cross_attn", "maps_mode": maps,
                            "audio_mode": "free-running"}
    if guide_sigma is not None:
        view["guide_g"] = float(guide_sigma)
    if wave is not None and sample_rate:
        view["epoch"] = audio_note(wave, sample_rate, caption)
    return view


