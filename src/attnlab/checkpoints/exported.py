"""A model exported from its checkpoint as a folder that holds no pickle (``python -m attnlab.export``): attnlab's
own (``format=safetensors``, every family), or a Hugging Face ``transformers`` folder (``format=hf``: the layouts
of :mod:`.hf_layouts`; :func:`read_hf` reads one the library wrote).

``format=safetensors``, what the inference entry points need, in formats any tool reads:

    model.safetensors   the task's weights (``net.*``: the state dict a checkpoint holds), in the dtype asked
    attnlab.json        the task class, its hyper-parameters (the net's config), the data settings, the dtype,
                        the epoch and step the weights are from
    tokenizer.json      the tokenizer, as the ``tokenizers`` library saves it (a model with one)

:func:`read_exported` turns the folder back into the dictionary a checkpoint read gives (without the training
state: no optimizer, loop or random-number state), so :func:`attnlab.checkpoints.read.read_trusted` checks it as
it checks a ``.ckpt`` (the task class and every ``_target_`` against the allow-list) and every entry point that
loads a checkpoint loads the folder too. Reading it runs no unpickler: JSON, and safetensors' header and bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointError, OptionError
from ..files.atomic import write_atomic

FORMAT = "attnlab-safetensors"
VERSION = 1
WEIGHTS, SETTINGS, TOKENIZER = "model.safetensors", "attnlab.json", "tokenizer.json"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # (torch's names: this module imports torch only to write)
INSTALL = 'pip install -e ".[weights]"'

# not settings: the training state (loops, optimizer, schedule, callbacks, random-number state), and what has a
# file of its own (the weights, the tokenizer); the epoch and step the weights are from stay (the explorer shows them)
NOT_SETTINGS = {"pytorch-lightning_version", "optimizer_states", "lr_schedulers", "callbacks", "loops", "rng_states",
                "state_dict", "hparams_name", "datamodule_hparams_name", "tokenizer"}


def is_exported(path: str | Path) -> bool:
    """``path`` is a folder holding an export's settings file."""
    path = Path(path).expanduser()
    return path.is_dir() and (path / SETTINGS).is_file()


def _safetensors_torch():
    try:
        import safetensors.torch
    except ImportError:
        raise CheckpointError(f"reading or writing model.safetensors needs the safetensors package: {INSTALL}") \
            from None
    return safetensors.torch


def exported_settings(ckpt: dict, dtype: str) -> dict:
    """The JSON of ``attnlab.json`` for checkpoint ``ckpt``: every entry but the training state and the data
    module's own loop state (Lightning keeps it under the data module's class name)."""
    kept = {k: v for k, v in ckpt.items() if k not in NOT_SETTINGS and not k[:1].isupper()}
    return {"format": FORMAT, "version": VERSION, "dtype": dtype, **kept}


def _tensors(state: dict, dtype: str) -> dict:
    """``state``'s tensors in ``dtype`` (floating ones), each its own contiguous copy: tied weights share a tensor,
    which safetensors refuses to store twice."""
    import torch

    kind = getattr(torch, DTYPES[dtype])
    return {k: v.detach().to(kind if v.is_floating_point() else v.dtype).clone().contiguous() for k, v in state.items()}


def _write_folder(out: Path, files: dict[str, bytes | str]) -> list[Path]:
    """``files`` (name -> content, written in this order) as the new folder ``out`` (absent or empty): written
    beside it and renamed into place whole, so a failure (a full disk) leaves no folder and nothing in ``out`` is
    ever overwritten."""
    import os
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        for name, content in files.items():
            write_atomic(partial / name, content)
        if out.is_dir():
            out.rmdir()  # empty (the caller checked): fails rather than replace anything put there since
        os.rename(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return [out / name for name in files]


def write_exported(ckpt: dict, out: Path, dtype: str = "fp32") -> list[Path]:
    """Write checkpoint ``ckpt`` (a trusted read's contents) as an export folder ``out`` (new, or empty); the files
    written."""
    st = _safetensors_torch()
    if dtype not in DTYPES:
        raise OptionError(f"dtype={dtype}: choose one of {', '.join(DTYPES)}")
    settings = json.dumps(exported_settings(ckpt, dtype), indent=1, sort_keys=True)  # (fails on a non-JSON value)
    # (one metadata key: safetensors writes a map's keys in no fixed order, and an export's bytes should repeat)
    files: dict[str, bytes | str] = {WEIGHTS: st.save(_tensors(ckpt["state_dict"], dtype), metadata={"format": "pt"})}
    if isinstance(ckpt.get("tokenizer"), str):
        files[TOKENIZER] = ckpt["tokenizer"]
    files[SETTINGS] = settings + "\n"
    return _write_folder(out, files)


def hf_layout(net: dict, layout: str = "auto") -> str:
    """The Hugging Face layout ``net`` (a net config in today's form) is written in: ``layout``, or with ``auto``
    the first of :data:`~.hf_layouts.LAYOUTS` its parts fit. One line naming the parts that do not fit and the
    layouts that would (torch-free: the export command asks before it loads the model)."""
    from .hf_layouts import fitting_layouts, layouts_for, misfits

    kinds = layouts_for(net)
    if not kinds:
        raise OptionError(f"format=hf takes a causal language model (model=causal_lm), a masked one "
                          f"(model=masked_lm) or a ViT (model=vit); this is "
                          f"{str(net.get('_target_')).rsplit('.', 1)[-1]}: format=safetensors takes every model")
    fits = fitting_layouts(net)
    if layout == "auto":
        if not fits:
            why = "; ".join(f"{name}: {', '.join(misfits(net, name))}" for name in kinds)
            raise OptionError(f"format=hf: this model fits none of the layouts ({why}); format=safetensors takes "
                              f"every model")
        return fits[0]
    if layout not in kinds:
        raise OptionError(f"layout={layout} holds another kind of model; this one's: {', '.join(kinds)}")
    if problems := misfits(net, layout):
        raise OptionError(f"layout={layout} does not fit this model: {'; '.join(problems)}; it fits "
                          f"{' and '.join(fits) if fits else 'no Hugging Face layout (format=safetensors does)'}")
    return layout


def write_hf(ckpt: dict, out: Path, layout: str = "auto", dtype: str = "fp32") -> tuple[list[Path], str]:
    """Write a causal language model's or a ViT's checkpoint as a Hugging Face ``transformers`` folder in
    ``layout`` (``auto``: the first of :data:`~.hf_layouts.LAYOUTS` its parts fit); the files written and the
    layout. A model whose parts do not fit is one line naming them and the layouts they do fit; nothing is
    written."""
    from .hf_layouts import hf_config, hf_tensors

    st = _safetensors_torch()
    net = (ckpt.get("hyper_parameters") or {}).get("net") or {}
    layout = hf_layout(net, layout)
    state = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    tokenizer = ckpt.get("tokenizer")
    if layout == "bert" and isinstance(tokenizer, str) and net.get("mask_id") is None:
        tokenizer = _with_mask_token(tokenizer, int(state["embed.weight"].shape[0]) - 1)
    names = _special_names(tokenizer) if layout != "vit" else {}
    ids = {f"{role}_token_id": i for role, (_, i) in names.items() if role not in ("unk", "mask")}
    files: dict[str, bytes | str] = {
        WEIGHTS: st.save(_tensors(hf_tensors(net, state, layout), dtype), metadata={"format": "pt"}),
        "config.json": json.dumps(hf_config(net, state, layout, dtype, ids), indent=1, sort_keys=True) + "\n",
    }
    if ids:
        files["generation_config.json"] = json.dumps(ids, indent=1) + "\n"
    if isinstance(tokenizer, str):
        tokens = {f"{role}_token": name for role, (name, _) in names.items()}
        files[TOKENIZER] = tokenizer
        files["tokenizer_config.json"] = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **tokens,
                                                     "model_max_length": int(net["max_len"])}, indent=1) + "\n"
    return _write_folder(out, files), layout


def _with_mask_token(tokenizer: str, row: int) -> str:
    """attnlab's tokenizer (``tokenizer.json`` text) with a ``<mask>`` token at id ``row``, the masked LM's own
    [MASK] row, so that the folder's tokenizer names it as BERT's does. A tokenizer smaller than the model's
    vocabulary gets unused tokens in between (as BERT has them): ``tokenizers`` numbers added tokens in order."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(tokenizer)
    size = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([AddedToken(f"<unused{i}>", special=True, normalized=False) for i in range(row - size)]
                           + [AddedToken("<mask>", special=True, normalized=False)])
    assert tok.token_to_id("<mask>") == row, (tok.token_to_id("<mask>"), row)
    return tok.to_str()


def _special_names(tokenizer: Any) -> dict[str, tuple[str, int]]:
    """``role -> (token, id)`` for pad, bos, eos, unk (and mask, where it has one): the tokenizer's own (a model
    folder's, found by name), else attnlab's; a role the tokenizer has no token for (GPT-2 has no pad: its end
    token stands in) is left out."""
    from ..core.special_tokens import SPECIAL_TOKENS, mask_id, special_ids, specials_in

    try:
        specials = specials_in(tokenizer) if isinstance(tokenizer, str) else {}
    except (ValueError, KeyError, TypeError, AttributeError):
        specials = {}
    ids = special_ids(specials)
    if ids is None:  # no tokenizer (or none with an end token): attnlab's ids, which its models were built with
        specials = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        ids = special_ids(specials)
        assert ids is not None
    by_id = {i: token for token, i in specials.items()}
    stand_ins = {role for role in ("pad", "unk") if ids[role] == ids["eos"]}
    if (mask := mask_id(specials)) is not None:
        ids = {**ids, "mask": mask}
    return {role: (by_id[i], i) for role, i in ids.items() if role not in stand_ins and i in by_id}


def read_exported(folder: Path) -> dict:
    """The export in ``folder`` as a checkpoint's dictionary (``state_dict``, ``tokenizer`` text, the settings);
    a missing, unreadable or damaged file is one line naming it."""
    try:
        settings = json.loads((folder / SETTINGS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{folder / SETTINGS} cannot be read (damaged?): {e}") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise CheckpointError(f"{folder / SETTINGS} is not an attnlab export (no \"format\": \"{FORMAT}\")")
    if settings.get("version") != VERSION:
        raise CheckpointError(f"{folder / SETTINGS}: export version {settings.get('version')!r}; this attnlab reads "
                              f"version {VERSION}")
    contents: dict[str, Any] = {k: v for k, v in settings.items() if k not in ("format", "version", "dtype")}
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights} is missing: the export is incomplete")
    st = _safetensors_torch()
    from safetensors import SafetensorError

    try:
        contents["state_dict"] = st.load_file(str(weights), device="cpu")
    except (SafetensorError, OSError) as e:  # a truncated or lying file: safetensors' own error
        raise CheckpointError(f"{weights} cannot be read (damaged?): {str(e).splitlines()[0]}") from None
    if (folder / TOKENIZER).is_file():
        try:
            contents["tokenizer"] = (folder / TOKENIZER).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{folder / TOKENIZER} cannot be read: {e}") from None
    return contents


def folder_specials(folder: Path) -> dict[str, int]:
    """name -> id of the special tokens of a folder's ``tokenizer.json`` (none without one); one line for a file
    that cannot be read."""
    from ..core.special_tokens import specials_in

    path = folder / TOKENIZER
    if not path.is_file():
        return {}
    try:
        return specials_in(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path} cannot be read: {e}") from None


def read_hf(folder: Path) -> tuple[dict, dict, str]:
    """A causal language model folder that ``transformers`` wrote (``save_pretrained``, or this module's
    :func:`write_hf`) as ``(attnlab net config, its weights without the net. prefix, layout)``: ``config.json`` and
    ``model.safetensors`` (or its shards, ``model.safetensors.index.json``). One line for a missing or damaged
    file or an architecture attnlab has no counterpart for."""
    from ..files.folder_paths import plain_name
    from .hf_layouts import net_from_hf, tensors_from_hf

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{folder / 'config.json'} cannot be read: {e}") from None
    try:
        net = net_from_hf(config, folder_specials(folder))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}: {config.get('architectures') or config.get('model_type')} has no attnlab "
                              f"counterpart: {e}") from None
    index = folder / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else [WEIGHTS]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index} cannot be read: {e}") from None
    if outside := [s for s in shards if not plain_name(s)]:  # a file's names stay inside its folder
        raise CheckpointError(f"{index} names a shard outside its folder: {outside[0]!r}")
    st, theirs = _safetensors_torch(), {}
    from safetensors import SafetensorError

    for shard in shards:
        try:
            theirs.update(st.load_file(str(folder / shard), device="cpu"))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{folder / shard} cannot be read: {str(e).splitlines()[0]}") from None
    try:
        return net, tensors_from_hf(net, theirs, config["model_type"]), config["model_type"]
    except KeyError as e:
        raise CheckpointError(f"{folder}: weight {e} is missing") from None
