"""An explorer record from a checkpoint and any input (``python -m attnlab.explore``), per family.

Each function runs the same capture as the attention-map callback (:func:`~attnlab.modules.attention.
capture_attention` around the task's ``attention_forward``) on the user's input instead of the fixed validation
sample, and returns a one-epoch :class:`~attnlab.explorer.record.ExplorerRecord`. Input the model cannot read is an
:class:`~attnlab.cli_input.InputError` (one line, exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..decoding import DecodingOptions
from ..errors import InputError
from ..modules.attention import capture_attention, is_attention_module
from ..tasks.protocols import AttentionSample
from .record import ExplorerRecord

__all__ = ["record_for_input"]


def _capture(task, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    with torch.no_grad(), capture_attention(task) as maps:
        task.attention_forward(**inputs)
    return dict(maps)


def _record(title: str, ckpt: dict, maps, sample: AttentionSample, view=None) -> ExplorerRecord:
    record = ExplorerRecord(title)
    record.add(int(ckpt.get("epoch", 0) or 0), int(ckpt.get("global_step", 0) or 0), maps, sample, view)
    return record


def _text(text: Any, what: str) -> str:
    if text is None or not str(text).strip():
        raise InputError(f"text= is empty: give the {what} to look at (text=\"...\")")
    return str(text)


def _too_long(n: int, limit: int | None, unit: str) -> None:
    if limit is not None and n > limit:
        raise InputError(f"the input has {n} {unit}; this model reads at most {limit}: shorten text=")


def translation(task, ckpt: dict, text: Any, target: Any, title: str) -> ExplorerRecord:
    """Source ``text``; decoder side ``target`` (teacher-forced), or the model's own greedy translation."""
    from ..translate import encode_sources

    tok = task.tokenizer
    src, mask = encode_sources(task, [_text(text, "source sentence")])
    limit = getattr(task.net, "max_len", None)
    _too_long(src.shape[1], limit, "source tokens")
    if target is None:
        res = task.translate_batch(src, mask, DecodingOptions(beam_size=1, n_best=1))
        tgt = [int(i) for i in res.tokens[0][0] if int(i) != tok.eos_id]
    else:
        tgt = list(tok.encode(str(target)))
    tgt_in = torch.tensor([[tok.bos_id] + tgt], device=task.device)
    _too_long(tgt_in.shape[1], limit, "target tokens (with <bos>)")
    s = [tok.id_to_token(int(i)) for i in src[0]]
    t = [tok.id_to_token(int(i)) for i in tgt_in[0]]
    labels = {"net.encoder": (s, s), "net.decoder": (t, t)}
    labels.update({n: (t, s) for n, m in task.named_modules() if "cross_attn" in n and is_attention_module(m)})
    sample = AttentionSample({"src": src, "src_mask": mask, "tgt_in": tgt_in}, queries=t, keys=s, labels=labels)
    return _record(title, ckpt, _capture(task, sample.inputs), sample)


def language_model(task, ckpt: dict, text: Any, title: str) -> ExplorerRecord:
    tok = task.tokenizer  # restored from the checkpoint when the task was loaded
    ids = tok.encode(_text(text, "text"))
    if not ids:
        raise InputError("text= encodes to no tokens")
    _too_long(len(ids), getattr(task.net, "max_len", None), "tokens")
    names = [tok.id_to_token(int(i)) for i in ids]
    sample = AttentionSample({"ids": torch.tensor([ids], device=task.device)}, names, names)
    return _record(title, ckpt, _capture(task, sample.inputs), sample)


def vision(task, ckpt: dict, image: Any, title: str) -> ExplorerRecord:
    """An image file, resized to the model's size and standardized by its own per-channel mean and std (the
    training set's statistics are not in the checkpoint)."""
    from PIL import Image, UnidentifiedImageError

    from .views import image_view

    if image is None or not str(image).strip():
        raise InputError("image= is missing: give an image file (image=digit.png) for a Vision Transformer")
    path = Path(str(image)).expanduser()
    if not path.is_file():
        raise InputError(f"image={image}: no such file")
    net = task.net
    try:
        with Image.open(path) as im:
            im = im.convert("L" if net.in_channels == 1 else "RGB").resize((net.image_size, net.image_size),
                                                                          Image.BILINEAR)
            x = torch.tensor(list(im.getdata()), dtype=torch.float32)
    except (UnidentifiedImageError, OSError) as e:
        raise InputError(f"image={image} is not an image this can read ({type(e).__name__})") from None
    x = x.view(net.image_size, net.image_size, -1).permute(2, 0, 1) / 255.0  # (C, H, W) in [0, 1]
    mean, std = x.mean(dim=(1, 2), keepdim=True), x.std(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    images = ((x - mean) / std)[None].to(task.device)
    grid, prefix = net.grid, net.prefix
    labels = (["cls"] if prefix else []) + [f"r{i // grid}c{i % grid}" for i in range(net.num_patches)]
    sample = AttentionSample({"images": images}, labels, labels)
    maps = _capture(task, sample.inputs)
    pred = getattr(task, "_sample_pred", None)
    view = image_view(maps, x, grid, prefix, net.pool, f"{path.name}, predicted class {pred}")
    return _record(title, ckpt, maps, sample, view)


def speech(task, ckpt: dict, text: Any, title: str, griffin_lim_iters: int = 32,
           max_frames_per_char: float = 12.0, seed: int = 0) -> ExplorerRecord:
    """The free-running cross-attention of every decoder layer while the model speaks ``text``, and the audio."""
    from ..audio.features import MelExtractor
    from ..data.characters import CharVocab
    from ..decoding.tts import generate_mel
    from .views import speech_view

    ids = CharVocab().encode(_text(text, "text to speak"))
    if not ids:
        raise InputError("text= has no character this model speaks")
    _too_long(len(ids), int(getattr(task.net, "max_chars", 0)) or None, "characters")
    torch.manual_seed(seed)  # the prenet's inference dropout
    x = torch.tensor([ids], device=task.device)
    gen = generate_mel(task.net, x, torch.tensor([len(ids)], device=task.device),
                       max_frames_per_char=max_frames_per_char)
    steps, n = int(gen.steps[0]), int(gen.lengths[0])
    maps = {f"net.decoder.layers.{i}.cross_attn": a[:, :, :steps] for i, a in enumerate(gen.attention)}
    chars = task.net.char_labels(x[0], len(ids))
    sample = AttentionSample({}, keys=chars)
    wave = MelExtractor(task.mel_cfg).griffin_lim(gen.mel[0, :n].cpu(), n_iter=griffin_lim_iters, seed=seed)
    guided = getattr(task, "guided", {}) or {}
    view = speech_view(guided.get("sigma") if guided.get("enabled", True) else None, wave, task.mel_cfg.sample_rate,
                       f"{str(text)!r}: free-running, Griffin-Lim ({griffin_lim_iters} iterations)")
    return _record(title, ckpt, maps, sample, view)


def record_for_input(task, ckpt: dict, *, text: Any = None, target: Any = None, image: Any = None,
                     title: str = "attention") -> ExplorerRecord:
    """Dispatch on the checkpoint's family."""
    from ..tasks.causal_lm import CausalLMTask
    from ..tasks.translation import TranslationTask
    from ..tasks.tts import TTSTask
    from ..tasks.vit import ImageClassificationTask

    if isinstance(task, ImageClassificationTask):
        return vision(task, ckpt, image, title)
    if image is not None:
        raise InputError(f"image= is for a Vision Transformer checkpoint; this one is {type(task).__name__}: "
                         "give text=")
    if isinstance(task, TranslationTask):
        return translation(task, ckpt, text, target, title)
    if target is not None:
        raise InputError("target= is for a translation checkpoint")
    if isinstance(task, CausalLMTask):
        return language_model(task, ckpt, text, title)
    if isinstance(task, TTSTask):
        return speech(task, ckpt, text, title)
    raise InputError(f"{type(task).__name__} checkpoints have no explorer input yet (translation, language model, "
                     "ViT and TTS do)")
