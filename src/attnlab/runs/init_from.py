"""``init_from=<folder>``: a new run that starts from the weights of a model folder, an attnlab export
(``attnlab.json``) or one that Hugging Face ``transformers`` wrote (``config.json``: the layouts of
:mod:`attnlab.checkpoints.hf_layouts`). A hub id (``org/name``) names the folder of its snapshot in the local
Hugging Face cache; nothing is downloaded.

The folder decides the model: its net's parts and sizes replace the model config's before anything is checked
(:func:`apply`, torch-free, the first step of the plan), so a command-line part or size is refused rather than
silently overruled, and a value the model takes from the data (``image_size: ${data.image_size}``) must agree with
the data. The weights are loaded once the model is built (:func:`load_weights`), strictly, and only into a fresh
run: a resumed one continues from its own checkpoint.

A language model's folder (causal, or masked: a BERT) brings its tokenizer (``tokenizer.json``): the data module
encodes the corpus with it instead of training one (``data.tokenizer``), at the folder's vocabulary size. Its special
tokens are attnlab's, or the folder's own (a GPT-2's ``<|endoftext|>``, a LLaMA's ``<s>``/``</s>``, a BERT's
``[CLS]``/``[SEP]``/``[MASK]``), found by name and checked against the ids its ``config.json`` gives
(:func:`attnlab.core.special_tokens.special_ids`). Not yet: translation, whose data module trains its tokenizers.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from ..checkpoints.exported import SETTINGS, TOKENIZER, is_exported
from ..core.errors import ConfigError
from ..core.special_tokens import END_NAMES, special_ids, specials_in

log = logging.getLogger(__name__)
GROUPS = ("norm", "ffn", "moe", "attn", "pos")
CAUSAL_LM = "attnlab.models.causal_lm.CausalLM"
MASKED_LM = "attnlab.models.masked_lm.MaskedLM"
LANGUAGE_MODELS = (CAUSAL_LM, MASKED_LM)  # (their folders bring the tokenizer their ids are of)
NO_TOKENIZER = "{where}: no tokenizer.json: a language model's weights need the tokenizer they were trained with"
LM_DATA = "attnlab.data.lm_datamodule.LMDataModule"


# sizes the data may stay below: a model of 1024 positions fine-tunes on windows of 128
UP_TO = ("max_len",)
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def resolve(path: str | Path) -> Path:
    """The folder ``init_from`` names: a path, or a hub id's snapshot in the local Hugging Face cache (where
    ``HF_HUB_CACHE`` / ``HF_HOME`` put it). One line when a hub id is not there: no download is tried."""
    folder = Path(path).expanduser()
    if folder.exists() or not HUB_ID.fullmatch(str(path)):
        return folder
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise ConfigError(f"init_from={path}: a hub id needs the huggingface_hub package: "
                          f'pip install -e ".[weights]"') from None
    # the cache as the environment names it now (huggingface_hub reads it once, when first imported)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub").expanduser()
    try:
        return Path(snapshot_download(str(path), local_files_only=True, cache_dir=str(cache)))
    except LocalEntryNotFoundError:
        raise ConfigError(f"init_from={path}: no such folder, and no snapshot of {path} in the local Hugging Face "
                          f"cache ({cache}); nothing is downloaded: fetch it first (hf download {path}) or give its "
                          f"folder") from None


def folder_net(path: str | Path) -> dict:
    """The net config a model folder holds (torch-free: its JSON only); one line for a folder that holds none."""
    from ..checkpoints.hf_layouts import NET_OF, net_from_hf

    folder = resolve(path)
    where = f"init_from={path}"
    if is_exported(folder):
        try:
            net = (json.loads((folder / SETTINGS).read_text(encoding="utf-8")).get("hyper_parameters") or {})["net"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{where}: {folder / SETTINGS} holds no net config ({e})") from None
    elif (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{where}: its config.json cannot be read: {e}") from None
        has_tokenizer = (folder / TOKENIZER).is_file()
        if not has_tokenizer and isinstance(config, dict) and NET_OF.get(config.get("model_type")) in LANGUAGE_MODELS:
            raise ConfigError(NO_TOKENIZER.format(where=where))
        try:
            net = net_from_hf(config, _specials(folder, where) if has_tokenizer else {})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{where}: its config.json has no attnlab counterpart: {e}") from None
    elif folder.is_dir():
        raise ConfigError(f"{where}: the folder holds neither {SETTINGS} (an attnlab export) nor config.json "
                          f"(a Hugging Face model)")
    else:
        raise ConfigError(f"{where}: no such folder")
    if not isinstance(net, dict) or not isinstance(net.get("_target_"), str):
        raise ConfigError(f"{where}: its net config names no model class")
    if net["_target_"] in LANGUAGE_MODELS:
        _check_tokenizer(folder, where, net)
    elif (folder / TOKENIZER).is_file() or "vocab_size" in net and net["_target_"] != "attnlab.models." \
            "sequence_classifier.SequenceClassifier":
        raise ConfigError(f"{where}: a {net['_target_'].rsplit('.', 1)[-1]} reads token ids from a tokenizer its "
                          f"data module trains: only a language model's folder (causal or masked) can start a run "
                          f"with its own tokenizer yet")
    return net


def _check_tokenizer(folder: Path, where: str, net: dict) -> None:
    """A causal LM's folder brings a tokenizer with an end-of-text token, at the id its ``config.json`` says, within
    the model's vocabulary (torch-free: the JSON files)."""
    if not (folder / TOKENIZER).is_file():
        raise ConfigError(NO_TOKENIZER.format(where=where))
    specials = _specials(folder, where)
    ids = special_ids(specials)
    if ids is None:
        raise ConfigError(f"{where}: its tokenizer has no end-of-text token (one of {', '.join(END_NAMES)}; its "
                          f"special tokens: {sorted(specials, key=specials.get)[:6]}): a run cannot tell where a "
                          f"text ends")
    config = _json_or_empty(folder / "config.json")
    names = {i: name for name, i in specials.items()}
    for role in ("eos", "bos"):
        said = config.get(f"{role}_token_id")
        if isinstance(said, int) and said != ids[role] or isinstance(said, list) and ids[role] not in said:
            if role == "eos" and isinstance(said, int) and said in names and said not in ids.values():
                # a chat model's (Qwen's <|im_end|>): its replies end there, its pretraining texts at the end token
                log.warning(f"{where}: its config.json ends a text with {names[said]} (id {said}); this run ends "
                            f"texts with its tokenizer's end token {names[ids['eos']]} (id {ids['eos']}): the "
                            f"corpus's documents are separated by it, generate stops at it, an export names it")
                continue
            raise ConfigError(f"{where}: its config.json gives {role}_token_id={said}, its tokenizer's {role} token "
                              f"is id {ids[role]}: they must agree")
    if (vocab := net.get("vocab_size")) is not None and max(ids.values()) >= vocab:
        raise ConfigError(f"{where}: its tokenizer's special token id {max(ids.values())} is outside the model's "
                          f"vocabulary ({vocab})")


def _specials(folder: Path, where: str) -> dict[str, int]:
    """name -> id of the special tokens of the folder's tokenizer; one line for a file that cannot be read."""
    path = folder / TOKENIZER
    try:
        return specials_in(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{where}: {path} cannot be read: {e}") from None


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _overridden(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The command line's settings of the model's parts and sizes (and of what the folder's tokenizer decides)."""
    out = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in GROUPS or key.split(".")[0] in GROUPS or key.startswith("model.net.") or \
                key in ("data.tokenizer", "data.vocab_size"):
            out.append(o)
    return out


def apply(cfg: DictConfig, overrides: Any) -> None:
    """Put the folder's net into ``cfg`` (its parts into the block groups, its sizes into ``model.net``); one line
    for a command-line part or size, a folder of another model, or a size the data disagrees with."""
    path = cfg.init_from
    if cfg.get("ckpt_path"):
        raise ConfigError("give either init_from= (a model's weights) or ckpt_path= (a run's training state), "
                          "not both")
    net = folder_net(path)
    if isinstance(overrides, ListConfig):  # (as Hydra holds them: unresolved, an ${oc.env:...} is not read here)
        overrides = OmegaConf.to_container(overrides, resolve=False)
    want = OmegaConf.select(cfg, "model.net._target_")
    if net["_target_"] != want:
        raise ConfigError(f"init_from={path} holds a {net['_target_'].rsplit('.', 1)[-1]}; model="
                          f"{cfg.model.get('name')} builds a {str(want).rsplit('.', 1)[-1]}: choose its model=")
    if given := _overridden(overrides):
        raise ConfigError(f"init_from={path} decides the model's parts and sizes (its config): drop {given[0]}")
    with open_dict(cfg):
        if net["_target_"] in LANGUAGE_MODELS:  # its ids are its tokenizer's: the data encodes with it, at its size
            if OmegaConf.select(cfg, "data._target_") != LM_DATA:
                raise ConfigError(f"init_from={path}: a language model's folder needs text data (data=pydoc, or "
                                  f"data.source=text_file data.path=...)")
            cfg.data.tokenizer = str(resolve(path) / TOKENIZER)
            cfg.data.vocab_size = int(net["vocab_size"])
        for key, value in net.items():
            if key in GROUPS:
                cfg[key] = value
            elif key != "_target_" and key in cfg.model.net and OmegaConf.is_interpolation(cfg.model.net, key):
                source = str(OmegaConf.to_container(cfg.model.net, resolve=False)[key]).strip("${}")
                given = OmegaConf.select(cfg, source)
                if key in UP_TO and isinstance(given, int) and given <= value:
                    cfg.model.net[key] = value  # (the folder's table: shorter windows use its first rows)
                elif given != value:
                    raise ConfigError(f"init_from={path}: its {key} is {value}, the data's ({source}) {given}: "
                                      f"give {source}={value}{' or less' if key in UP_TO else ''}")
            elif key != "_target_":
                cfg.model.net[key] = value


def load_weights(model: Any, path: str | Path) -> None:
    """The folder's weights into the task's net (built from the same config): strictly, one line for a
    difference."""
    from ..checkpoints.exported import read_exported, read_hf
    from ..checkpoints.state_fit import check_fits

    folder = resolve(path)
    if is_exported(folder):
        state = {k.removeprefix("net."): v for k, v in read_exported(folder)["state_dict"].items()
                 if k.startswith("net.")}
    else:
        state = read_hf(folder)[1]
    check_fits(model.net, state, folder)
    model.net.load_state_dict(state, strict=True)
