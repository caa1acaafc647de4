"""Checkpoints of the spec layout load as they are: their ``net`` config and state-dict keys are rewritten into
today's form when a task is built from them.

In the spec layout a ``net`` config carries the block groups as plain specs (``norm: {name: rms, kind: rmsnorm,
placement: pre, eps: ...}``, ``ffn: {activation: swiglu, ...}``, ``moe: {enabled: ...}``, ``pos: {kind: rotary, ...}``) and an
attention flag ``scaled``; the models name their stacks per family (``blocks``, ``encoder.0``, ``enc_blocks``,
``final_norm``/``encoder_norm``/``enc_norm``, ``lm_head``/``out_proj``/``mel_proj``). Today the groups are parts
with ``_target_`` (:mod:`attnlab.modules.parts`) and every family has ``encoder``/``decoder`` stacks with
``layers`` and ``final_norm``, and a ``head``. The parameters are the same tensors, in the same order (so an
optimizer state resumes as well): only names move, and the ViT's position table loses its leading batch axis.
An ``ffn.activation`` given as one module (``{_target_: torch.nn.GELU}``) becomes the factory each feed-forward
calls (``_partial_: true``); a shared module was saved under every layer's name, so a learnable one's weights load
strictly into each layer's own. Arguments added later with a default that changes behaviour (``ADDED_ARGS``: the
TTS's ``text_eos``) are set to their old value in a config that does not name them.

A task's ``optimizer`` / ``scheduler`` config without ``_target_`` (a checkpoint from before the ``optim`` /
``sched`` groups, or a task built by hand with ``optimizer={"lr": ...}``) holds the arguments of AdamW and of the
warm-up + cosine schedule, the only ones there were; :func:`upgrade_optimizer_config` and
:func:`upgrade_scheduler_config` name them, with the defaults those values were completed with.

:class:`attnlab.tasks.base.Task` calls :func:`upgrade_net_config` before building its net and
:func:`upgrade_state_dict` in ``on_load_checkpoint`` (Lightning calls it before loading the weights, both for
``load_from_checkpoint`` and for ``trainer.fit(ckpt_path=...)``). Both leave a current checkpoint unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, MutableSequence
from typing import Any

NORM_LAYERS = {"layernorm": "torch.nn.LayerNorm", "rmsnorm": "attnlab.modules.norm.RMSNorm",
               "batchnorm": "attnlab.modules.norm.SequenceBatchNorm"}
ACTIVATIONS = {"relu": "torch.nn.ReLU", "gelu": "torch.nn.GELU", "swiglu": "torch.nn.SiLU"}
POSITIONS = {"learned": "attnlab.modules.positional.LearnedPositions",
             "sinusoidal": "attnlab.modules.positional.SinusoidalPositions",
             "rotary": "attnlab.modules.positional.RotaryPositions",
             "none": "attnlab.modules.positional.NoPositions"}
ATTENTION = "attnlab.modules.attention.MultiHeadAttention"
OPTIMIZER = "torch.optim.AdamW"
SCHEDULE = "attnlab.optim.schedules.warmup_cosine"
OPTIMIZER_DEFAULTS = {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8}
SCHEDULE_DEFAULTS = {"warmup_steps": 100, "min_lr_ratio": 0.1}


def _is_spec(value: Any, marker: str) -> bool:
    """An old spec: a mapping without ``_target_`` that has the spec's telling key."""
    return isinstance(value, Mapping) and "_target_" not in value and marker in value


def upgrade_norm(spec: Mapping) -> dict:
    layer = {"_target_": NORM_LAYERS[spec.get("kind", "layernorm")], "_partial_": True, "eps": spec.get("eps", 1e-5)}
    return {"placement": spec.get("placement", "pre"), "layer": layer}


def upgrade_ffn(spec: Mapping) -> dict:
    activation = spec.get("activation", "gelu")
    return {"_target_": "attnlab.modules.feedforward.FeedForward", "_partial_": True,
            "activation": {"_target_": ACTIVATIONS[activation], "_partial_": True},
            "gated": activation == "swiglu",
            "hidden_mult": spec.get("hidden_mult", 4.0), "multiple_of": spec.get("multiple_of", 8),
            # explicit: an old spec without the key had biases (SwiGLU included), today's gated default has none
            "bias": spec.get("bias", True)}


def upgrade_moe(spec: Mapping) -> dict:
    if not spec.get("enabled"):
        return {}
    return {"_target_": "attnlab.modules.moe.mixture_of_experts", "_partial_": True,
            **{k: spec[k] for k in ("num_experts", "top_k", "aux_loss_coef", "z_loss_coef") if k in spec}}


def upgrade_pos(spec: Mapping) -> dict:
    kind = spec.get("kind", "learned")
    part = {"_target_": POSITIONS[kind], "_partial_": True}
    if kind == "rotary":
        part["base"] = spec.get("rotary_base", 10000.0)
    return part


SPECS = {"norm": ("kind", upgrade_norm), "ffn": ("activation", upgrade_ffn), "moe": ("enabled", upgrade_moe),
         "pos": ("kind", upgrade_pos)}
RENAMED_ARGS = {"n_enc_layers": "n_encoder_layers", "n_dec_layers": "n_decoder_layers"}
# net class -> (argument, its value for a config that does not name it): the behaviour such a net was trained with,
# whatever the argument's default is today (the TTS text's <eos>: a config without text_eos was trained without one)
ADDED_ARGS = {"TransformerTTS": ("text_eos", False)}


def upgrade_net_config(net: Any) -> Any:
    """A ``net`` config (``_target_`` + arguments) of any age -> today's form; anything else is returned as is."""
    if not isinstance(net, Mapping):
        return net
    out = dict(net)
    for group, (marker, upgrade) in SPECS.items():
        old_norm = group == "norm" and isinstance(out.get(group), Mapping) and "layer" not in out[group]
        if _is_spec(out.get(group), marker) or old_norm:
            out[group] = upgrade(out[group])
    activation = out["ffn"].get("activation") if isinstance(out.get("ffn"), Mapping) else None
    if isinstance(activation, Mapping) and "_target_" in activation and "_partial_" not in activation:
        # the activation became a factory, built by each feed-forward (it was one module every layer shared)
        out["ffn"] = {**out["ffn"], "activation": {**activation, "_partial_": True}}
    if "scaled" in out:  # the attention flag became an option of the attn group
        scaled = out.pop("scaled")
        if "attn" not in out and scaled is False:
            out["attn"] = {"_target_": ATTENTION, "_partial_": True, "scaled": False}
    for old, new in RENAMED_ARGS.items():
        if old in out:
            out[new] = out.pop(old)
    for target, (arg, old_value) in ADDED_ARGS.items():
        if str(out.get("_target_", "")).rsplit(".", 1)[-1] == target and arg not in out:
            out[arg] = old_value
    return out


# a class or function that moved: a run folder's saved config names it where it was (resume= compares it, the
# claims build from it)
MOVED_TARGETS = {"attnlab.data.hf_source.hf_datamodule": "attnlab.families.hf_datamodule",
                 "attnlab.utils.checkpoint_io.AtomicCheckpointIO": "attnlab.files.checkpoint_io.AtomicCheckpointIO"}
# a class conf/ no longer names though it still exists, and what builds that part now: callbacks.rich_progress_bar
# (Rich's bar on a terminal, else log lines)
REPLACED_TARGETS = {"lightning.pytorch.callbacks.RichProgressBar": "attnlab.callbacks.progress.progress_display"}
# arguments a class no longer takes: a saved config that names them drops them. The image and speech data modules
# took vocab_size and seq_len only to ignore them, because debug=fast set those on every data option; a debug run
# saved then still resumes (resume= compares every data key) and builds.
_IGNORED_SIZES = ("vocab_size", "seq_len")
DROPPED_ARGS = {f"attnlab.data.{target}": _IGNORED_SIZES
                for target in ("digits.DigitsDataModule", "cifar10.CIFAR10DataModule",
                               "speech_datamodule.SpeechDataModule", "speech_datamodule.EspeakDataModule")}


def upgrade_targets(config: Any) -> Any:
    """Rename, in place, every ``_target_`` of ``config`` (plain containers or an OmegaConf node) that moved, and
    drop the arguments its class no longer takes (:data:`DROPPED_ARGS`); a value that resolves only in its own run
    (``${hydra:...}``) is left as it is."""
    stack = [config]
    while stack:
        node = stack.pop()
        try:
            dropped = DROPPED_ARGS.get(str(node.get("_target_"))) if isinstance(node, MutableMapping) else None
        except Exception:  # noqa: BLE001 - a _target_ that resolves only in its own run
            dropped = None
        for arg in dropped or ():
            node.pop(arg, None)
        keys = list(node.keys()) if isinstance(node, MutableMapping) else range(len(node))
        for key in keys:
            try:
                value = node[key]
            except Exception:  # noqa: BLE001 - an interpolation of the run's own context, a missing value
                continue
            if key == "_target_" and isinstance(value, str) and value in MOVED_TARGETS:
                node[key] = MOVED_TARGETS[value]
            elif key == "_target_" and isinstance(value, str) and value in REPLACED_TARGETS:
                node[key] = REPLACED_TARGETS[value]
            elif isinstance(value, (MutableMapping, MutableSequence)) and not isinstance(value, str):
                stack.append(value)
    return config


# net class name -> (old key prefix, new key prefix), first match wins
KEY_RENAMES: dict[str, list[tuple[str, str]]] = {
    "CausalLM": [(r"blocks\.", "decoder.layers."), (r"final_norm\.", "decoder.final_norm."),
                 (r"lm_head\.", "head.")],
    "TransformerMT": [(r"encoder\.(\d+)\.", r"encoder.layers.\1."), (r"encoder_norm\.", "encoder.final_norm."),
                      (r"decoder\.(\d+)\.", r"decoder.layers.\1."), (r"decoder_norm\.", "decoder.final_norm."),
                      (r"out_proj\.", "head.")],
    "VisionTransformer": [(r"blocks\.", "encoder.layers."), (r"final_norm\.", "encoder.final_norm."),
                          (r"pos_embed$", "positions.table")],
    # the classifier's positions moved from its attention encoder to the token-transformer body
    "SequenceClassifier": [(r"encoder\.blocks\.", "encoder.layers."), (r"encoder\.positions\.", "positions.")],
    "TransformerTTS": [(r"enc_blocks\.", "encoder.layers."), (r"enc_norm\.", "encoder.final_norm."),
                       (r"dec_blocks\.", "decoder.layers."), (r"dec_norm\.", "decoder.final_norm."),
                       (r"mel_proj\.", "mel_head."), (r"stop_proj\.", "stop_head.")],
}
KEY_RENAMES["TransformerNAT"] = KEY_RENAMES["TransformerMT"]


def upgrade_state_dict(state_dict: dict, net_target: str | None, prefix: str = "net.") -> bool:
    """Rename the old keys of ``state_dict`` (a task's: net keys start with ``prefix``) in place, keeping their
    order; True if anything changed."""
    rules = KEY_RENAMES.get(str(net_target or "").rsplit(".", 1)[-1])
    if not rules:
        return False
    changed = False
    for key in list(state_dict):
        value = state_dict.pop(key)
        if key.startswith(prefix):
            name = key[len(prefix):]
            for old, new in rules:
                renamed, n = re.subn("^" + old, new, name)
                if n:
                    name, changed = renamed, True
                    if renamed == "positions.table" and value.dim() == 3:  # ViT's (1, T, D) -> (T, D)
                        value = value[0]
                    break
            key = prefix + name
        state_dict[key] = value
    return changed


def _named(cfg: Any, target: str, defaults: dict) -> dict:
    if isinstance(cfg, Mapping) and "_target_" in cfg:
        return dict(cfg)
    return {"_target_": target, "_partial_": True, **defaults, **(cfg or {})}


def upgrade_optimizer_config(cfg: Any) -> dict:
    """A task's ``optimizer`` config with its ``_target_`` (bare values: AdamW's arguments)."""
    return _named(cfg, OPTIMIZER, OPTIMIZER_DEFAULTS)


def upgrade_scheduler_config(cfg: Any) -> dict:
    """A task's ``scheduler`` config with its ``_target_`` (bare values: the warm-up + cosine schedule's)."""
    return _named(cfg, SCHEDULE, SCHEDULE_DEFAULTS)
