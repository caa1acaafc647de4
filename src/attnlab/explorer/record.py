"""The maps an explorer page holds: every logged epoch's captured maps, 8-bit quantized per row.

Storage: each map (heads, queries, keys) of the first sample is stored as one byte per weight, ``round(255 * w /
row max)``, plus the row's maximum as a float32, both base64 in the page's JSON. A weight reads back within
``row max / 510`` (0.2 % of the row's largest weight: small weights of a long row keep their relative precision,
which absolute 8-bit steps of 1/255 would not) at about 1 byte per weight (4/3 with base64). Only the captured
heads and the positions the PNG callback draws (``max_tokens``) are kept; image, speech and the sequence
classifier's maps are kept whole (their PNGs draw them so).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..plots.views import natural_key
from ..tasks.protocols import AttentionSample

__all__ = ["ExplorerRecord", "quantize", "dequantize", "natural_key", "module_order"]


def module_order(name: str) -> tuple:
    """The page's order: the encoder before the decoder (the way the data flows), then by layer number."""
    return (0 if "encoder" in name else 1 if "decoder" in name else 2, natural_key(name))


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def quantize(w: Tensor) -> dict[str, Any]:
    """(H, Tq, Tk) non-negative weights -> {"shape", "q": uint8 bytes, "scale": float32 row maxima}, base64."""
    w = w.detach().float().cpu().clamp_min(0)
    scale = w.amax(-1, keepdim=True)  # (H, Tq, 1)
    q = torch.where(scale > 0, w / scale.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(w))
    q = (q * 255).round().clamp(0, 255).to(torch.uint8)
    return {"shape": list(w.shape), "q": _b64(q.numpy()), "scale": _b64(scale[..., 0].numpy().astype("<f4"))}


def dequantize(entry: Mapping[str, Any]) -> np.ndarray:
    """The weights a page shows for a stored map (the page's JavaScript computes the same)."""
    h, tq, tk = entry["shape"]
    q = np.frombuffer(base64.b64decode(entry["q"]), dtype=np.uint8).reshape(h, tq, tk).astype(np.float32)
    scale = np.frombuffer(base64.b64decode(entry["scale"]), dtype="<f4").reshape(h, tq, 1)
    return q / 255.0 * scale


def _fit(labels: Sequence[str] | None, n: int) -> list[str]:
    """Names for n positions: the given ones when they match, else their indices."""
    labels = list(labels or [])[:n]
    return [str(x) for x in labels] if len(labels) == n else [str(i) for i in range(n)]


class ExplorerRecord:
    """Every logged epoch's maps of one fixed sample (the page's epoch slider), and what the family adds.

    Args:
        title: the page's heading (the run folder's name).
        max_tokens: keep the first ``max_tokens`` queries and keys of token maps (the PNG callback's crop); maps the
            family marks ``whole`` (image patches, speech frames, the sequence classifier's readout and needle)
            are kept whole. None: every position.
        max_epochs: keep the last N epochs only (None: all).
        max_audio_epochs: keep the audio (an epoch's ``audio`` note) of the last N epochs only (None: all); the
            older epochs keep their maps and a caption that says so.
    """

    def __init__(self, title: str = "attention", max_tokens: int | None = None, max_epochs: int | None = None,
                 max_audio_epochs: int | None = None):
        self.title = title
        self.max_tokens = max_tokens
        self.max_epochs = max_epochs
        self.max_audio_epochs = max_audio_epochs
        self.modules: dict[str, dict[str, Any]] = {}
        self.epochs: list[dict[str, Any]] = []
        self.view: dict[str, Any] = {"family": "tokens"}

    def add(self, epoch: int, step: int, maps: Mapping[str, Tensor], sample: AttentionSample | None = None,
            view: Mapping[str, Any] | None = None) -> None:
        """Record the captured maps (module name -> (B, H, Tq, Tk); the first sample is kept) of one epoch.

        ``view``: what the task adds for its family (:meth:`explorer_view`): ``family`` ("tokens", "image",
        "speech"), ``maps`` (extra maps such as the rollout, recorded like modules), ``whole`` (keep uncropped),
        ``keep`` (record only the modules whose name contains it),
        ``epoch`` (per-epoch notes: a caption), and anything else the page reads (image, grid, audio).
        """
        view = dict(view or {})
        extra = view.pop("maps", {}) or {}
        per_epoch = view.pop("epoch", {}) or {}
        whole = bool(view.pop("whole", False))
        keep = view.pop("keep", None)  # a substring: only those modules (the TTS keeps its cross-attention)
        self.view.update(view)
        entry: dict[str, Any] = {"epoch": int(epoch), "step": int(step), "maps": {}, **per_epoch}
        all_maps = {**dict(maps), **dict(extra)}
        names = [n for n in sorted(maps, key=module_order) if keep is None or keep in n] + list(extra)
        for name in names:
            w = all_maps[name][0]
            if self.max_tokens is not None and not whole:
                w = w[:, : self.max_tokens, : self.max_tokens]
            ql, kl = sample.labels_for(name) if sample is not None else (None, None)
            self.modules[name] = {
                "name": name,
                "kind": "cross" if "cross" in name else ("derived" if name in extra else "self"),
                "queries": _fit(ql, w.shape[-2]),
                "keys": _fit(kl, w.shape[-1]),
            }
            entry["maps"][name] = quantize(w)
        self.epochs = [e for e in self.epochs if e["epoch"] != entry["epoch"]] + [entry]
        if self.max_epochs is not None:
            self.epochs = self.epochs[-self.max_epochs:]
        if self.max_audio_epochs is not None:
            for e in self.epochs[:max(0, len(self.epochs) - self.max_audio_epochs)]:
                if e.pop("audio", None) is not None:
                    e["audio_caption"] = f"audio not kept (the page keeps the last {self.max_audio_epochs} epochs')"

    @classmethod
    def from_page(cls, path, before_epoch: int, **kwargs) -> ExplorerRecord:
        """A record holding the epochs before ``before_epoch`` of an earlier page (a resumed run continues its
        page); an unreadable page is ignored (a new one is started)."""
        from .page import read_payload

        record = cls(**kwargs)
        try:
            data = read_payload(path)
            epochs = [e for e in data["epochs"] if int(e["epoch"]) < before_epoch]
            modules = {m["name"]: m for m in data["modules"]}
            view = dict(data.get("view") or {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return record
        record.epochs, record.modules = [_inlined(e) for e in epochs], modules
        record.view = _inlined(view) or record.view
        return record

    def payload(self) -> dict[str, Any]:
        """The JSON the page embeds."""
        return {"title": self.title, "view": self.view, "modules": list(self.modules.values()), "epochs": self.epochs}

    def __bool__(self) -> bool:
        return bool(self.epochs)


# what an earlier page may hand on to the next: images and sounds inlined as the views write them, never a URL
_INLINE = {"image": "data:image/png;base64,", "audio": "data:audio/wav;base64,"}


def _inlined(entry: dict[str, Any]) -> dict[str, Any]:
    """An epoch or view read back from a page (a file of the run folder, which may come from anyone) without an
    ``image`` or ``audio`` that is not inlined data: a URL there would make the new page request it."""
    return {k: v for k, v in entry.items()
            if k not in _INLINE or (isinstance(v, str) and v.startswith(_INLINE[k]))}
