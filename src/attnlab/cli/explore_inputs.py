"""An explorer record from a checkpoint and any input (``python -m attnlab.explore``), per family.

Each function runs the same capture as the attention-map callback (:func:`~attnlab.modules.attention.
capture_attention` around the task's ``attention_forward``) on the user's input instead of the fixed validation
sample, and returns a one-epoch :class:`~attnlab.explorer.record.ExplorerRecord`. Input the model cannot read is an
:class:`~attnlab.cli.input.InputError` (one line, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..decoding import DecodingOptions
from ..core.errors import InputError
from ..modules.attention import capture_attention, is_attention_module
from ..tasks.protocols import AttentionSample
from ..explorer.record import ExplorerRecord

__all__ = ["INPUTS", "record_for_input"]


def _capture(task, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    with torch.no_grad(), capture_attention(task) as maps:
        task.attention_forward(**inputs)
    if not maps:  # an RNN or CNN encoder, a seq2seq model without attention (model.attention=none)
        raise InputError(f"this {type(task.net).__name__} has no attention to show")
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
    from .translate import encode_sources

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
    # the model's vocabulary can be larger than the tokenizer's (data.vocab_size is an upper bound): an undertrained
    # model may emit an id no token has
    t = [tok.id_to_token(int(i)) if int(i) < tok.vocab_size else f"<{int(i)}>" for i in tgt_in[0]]
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

    from ..plots.views import image_view

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
    view = image_view(maps, x, grid, prefix, net.pool, f"{path.name}, predicted class {pred}",
                      patch=getattr(task, "attention_patch", None))
    return _record(title, ckpt, maps, sample, view)


def speech(task, ckpt: dict, text: Any, title: str, griffin_lim_iters: int = 32,
           max_frames_per_char: float = 12.0, seed: int = 0) -> ExplorerRecord:
    """The free-running cross-attention of every decoder layer while the model speaks ``text``, and the audio."""
    from ..audio.features import MelExtractor
    from ..data.characters import CharVocab
    from ..decoding.tts import generate_mel
    from ..plots.views import speech_view

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
                       f"{str(text)!r}: free-running, Griffin-Lim ({griffin_lim_iters} iterations)",
                       maps="free-running")
    return _record(title, ckpt, maps, sample, view)


def token_ids(task, ckpt: dict, text: Any, title: str) -> ExplorerRecord:
    """Token ids as text (``"3 17 5 9"``), for a model that reads ids with no tokenizer (the sequence classifier);
    labelled as its training page labels them where the checkpoint names its data, else by id."""
    net = task.net
    if getattr(net, "encoder_kind", "attention") != "attention":
        raise InputError(f"this {type(net).__name__} has an encoder of kind {net.encoder_kind} (model.encoder="
                         f"{net.encoder_kind}): it has no attention to show; only model.encoder=attention has")
    words = _text(text, "token ids (text=\"3 17 5 9\")").split()
    vocab = int(net.vocab_size)
    for word in words:
        if not (word.isascii() and word.isdigit() and int(word) < vocab):
            raise InputError(f"text=: {word!r} is not a token id of this model (whole numbers 0 to {vocab - 1}, "
                             "separated by spaces)")
    ids = [int(w) for w in words]
    _too_long(len(ids), getattr(net, "max_len", None), "token ids")
    names = _id_names(ckpt, ids)
    sample = AttentionSample({"ids": torch.tensor([ids], device=task.device)}, names, names)
    return _record(title, ckpt, _capture(task, sample.inputs), sample)


def _id_names(ckpt: dict, ids: list[int]) -> list[str]:
    """The names the training page gave the ids: its data module's, when the checkpoint says which (the data
    module's state is saved under its class name) and holds what names them; else the ids."""
    from ..data.needle_recall import NeedleRecallDataModule, needle_names

    hp = ckpt.get("datamodule_hyper_parameters")
    if NeedleRecallDataModule.__name__ in ckpt and isinstance(hp, dict):
        try:
            return needle_names(ids, int(hp["num_classes"]), int(hp["num_fillers"]))
        except (KeyError, TypeError, ValueError):
            pass
    return [str(i) for i in ids]


# Each kind of input (attnlab.families.EXPLORER_INPUTS): its function and the options it reads.
INPUTS: dict[str, tuple[Callable[..., ExplorerRecord], tuple[str, ...]]] = {
    "translation": (translation, ("text", "target")),
    "text": (language_model, ("text",)),
    "image": (vision, ("image",)),
    "speech": (speech, ("text",)),
    "ids": (token_ids, ("text",)),
}


def record_for_input(task, ckpt: dict, *, text: Any = None, target: Any = None, image: Any = None,
                     title: str = "attention") -> ExplorerRecord:
    """The record of the input the checkpoint's family reads (its ``explorer_input`` in the registry); an option
    that family does not read is refused, naming those it reads."""
    from .. import families

    cls = type(task)
    family = families.for_task(f"{cls.__module__}.{cls.__qualname__}")
    if family is None or family.explorer_input is None:
        served = sorted({f.what for f in families.families() if f.explorer_input})
        raise InputError(f"{cls.__name__} checkpoints have no explorer input (those of {', '.join(served)} have)")
    build, reads = INPUTS[family.explorer_input]
    given = {"text": text, "target": target, "image": image}
    for option, value in given.items():
        if value is not None and option not in reads:
            own = f"{reads[0]}=" + "".join(f" (and {o}=)" for o in reads[1:])
            raise InputError(f"{option}= is not an input of {family.what} ({cls.__name__}): give {own}")
    return build(task, ckpt, *(given[o] for o in reads), title=title)
