"""Check the composed config's numbers before anything is built: one line naming the key, the value and what is
allowed, instead of a torch error that never names the key (``model.net.d_model=abc``), a ZeroDivisionError
(``n_heads=0``), a model trained without attention (``n_layers=0``) or a traceback from the optimizer (``lr=-1``).

:func:`validate_config` reads two tables:

* ``RULES``: (key pattern, check) for single values. ``*`` matches within one dotted part
  (``model.decoding.*.beam_size`` covers ``val`` and ``test``). A key the chosen model or data set does not have is
  skipped, so one table serves every model family (conf/model/*.yaml).
* ``RELATIONS``: checks between values (d_model divisible by n_heads, top_k <= num_experts, the data's image size and
  the model's, ...), each skipped unless its keys are there.

The block groups (``norm``, ``ffn``, ``moe``, ``attn``, ``pos``) are checked under their own names (``moe.top_k``,
what the user types) and only for a model built from them (:func:`~attnlab.utils.config.used_groups`); ``moe.*``
only when the mixture is on. Which class a group option builds is Hydra's business (an unknown option is its one
line); the numbers it is given are checked here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from ..data.numbers import TARGET_LANGS
from ..decoding.scheduled_sampling import SCHEDULES
from ..models.seq2seq_rnn import ATTENTIONS, CELLS
from ..models.sequence_classifier import ENCODERS
from ..modules.moe import BALANCE
from ..modules.parts import PLACEMENTS
from .config import BLOCK_GROUPS, ConfigError, flatten, used_groups

# A check returns None for a good value, else what is allowed ("must be a positive integer").
Check = Callable[[Any], "str | None"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 1 else "must be a positive integer"


def non_negative_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be an integer >= 0"


def positive_number(v: Any) -> str | None:
    return None if _is_number(v) and v > 0 else "must be a number > 0"


def learning_rate(v: Any) -> str | None:
    """> 0; inf is let through on purpose: it is how the divergence guard is provoked for real (an update that
    overflows, tests/callbacks/test_nonfinite.py), and that guard stops such a run with its own one line."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and not math.isnan(v)
    return None if ok else "must be a number > 0"


def int_in(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        return None if _is_int(v) and lo <= v <= hi else f"must be an integer from {lo} to {hi}"

    return check


def int_at_least(lo: int) -> Check:
    def check(v: Any) -> str | None:
        return None if _is_int(v) and v >= lo else f"must be an integer >= {lo}"

    return check


# Lightning's accepted precision values (lightning.fabric.connector._PRECISION_INPUT), written out here because
# importing Lightning to read them would cost a refused command line ~4 s; tests/utils/test_validate.py checks that
# the two lists agree.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "transformer-engine",
              "transformer-engine-float16", "64", "32", "16", "bf16", 64, 32, 16)


def non_negative_number(v: Any) -> str | None:
    return None if _is_number(v) and v >= 0 else "must be a number >= 0"


def probability(v: Any) -> str | None:
    """A dropout rate: 1 would drop everything."""
    return None if _is_number(v) and 0 <= v < 1 else "must be a number in [0, 1)"


def unit_interval(v: Any) -> str | None:
    return None if _is_number(v) and 0 <= v <= 1 else "must be a number in [0, 1]"


def adam_betas(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v)
    return None if ok else "must be two numbers in [0, 1), e.g. [0.9, 0.98]"


def one_of(choices) -> Check:
    """A name from the code's own list (so the table cannot drift from what the model accepts)."""
    allowed = tuple(choices)

    def check(v: Any) -> str | None:
        return None if v in allowed else f"choose one of {', '.join(map(str, allowed))}"

    return check


def optional(check: Check) -> Check:
    """``check``, or null (the model's default, e.g. n_encoder_layers=null: n_layers)."""

    def nullable(v: Any) -> str | None:
        problem = check(v) if v is not None else None
        return problem and f"{problem} (or null)"

    return nullable


RULES: list[tuple[str, Check]] = [
    # sizes of every model family (causal_lm, transformer_mt/nat, seq2seq_*, sequence_classifier, vit, tts)
    *((f"model.net.{k}", positive_int) for k in (
        "vocab_size", "d_model", "n_heads", "n_layers", "d_emb", "d_hidden", "max_len", "num_classes", "kernel_size",
        "image_size", "patch_size", "in_channels", "n_mels", "reduction",
        "dec_prenet_dim", "postnet_channels", "postnet_layers", "max_text_len", "max_dec_steps")),
    ("model.net.n_encoder_layers", optional(positive_int)),  # null: n_layers
    ("model.net.n_decoder_layers", optional(positive_int)),
    ("model.net.enc_prenet_convs", non_negative_int),
    ("model.net.max_length_offset", non_negative_int),
    *((f"model.net.{k}", probability) for k in ("dropout", "attn_dropout", "dec_prenet_dropout")),
    # optimization
    ("model.optimizer.lr", learning_rate),
    ("model.optimizer.weight_decay", non_negative_number),
    ("model.optimizer.betas", adam_betas),
    ("model.optimizer.eps", positive_number),
    ("model.scheduler.warmup_steps", non_negative_int),
    ("model.scheduler.min_lr_ratio", unit_interval),
    ("model.label_smoothing", probability),
    ("model.scheduled_sampling.schedule", one_of(SCHEDULES)),
    # the command-line shortcuts copied into model.net (model.cell=lstm, model.attention=none, model.encoder=rnn)
    ("model.cell", one_of(CELLS)),
    ("model.attention", one_of(ATTENTIONS)),
    ("model.encoder", one_of(ENCODERS)),
    ("model.decoding.*.beam_size", positive_int),
    ("data.batch_size", positive_int),
    ("data.vocab_size", positive_int),
    ("data.seq_len", positive_int),
    ("data.image_size", positive_int),
    *((f"data.{k}", positive_int) for k in ("train_size", "val_size", "test_size", "num_utterances", "num_fillers")),
    ("data.num_workers", non_negative_int),
    ("data.tokenizer_sample_mb", positive_number),  # data=text_file, data=hf (LM)
    ("data.val_fraction", probability),
    ("data.test_fraction", probability),
    ("data.target_lang", one_of(TARGET_LANGS)),  # data=numbers
    ("data.max_digits", int_in(1, 12)),
    ("data.copy_fraction", unit_interval),
    ("data.pydoc_fraction", unit_interval),
    ("trainer.accumulate_grad_batches", positive_int),
    ("trainer.precision", one_of(PRECISIONS)),
    ("trainer.max_epochs", optional(int_at_least(-1))),  # -1: no limit (Lightning's convention)
    ("trainer.max_steps", optional(int_at_least(-1))),
    # block groups (checked only for a model built from them)
    ("norm.placement", one_of(PLACEMENTS)),
    # parts given as one value where a config is needed (`ffn.activation=tanh`); a config is flattened away
    ("norm.layer", lambda v: "must be a layer config such as {_target_: torch.nn.LayerNorm, _partial_: true}"),
    ("ffn.activation", lambda v: "must be a module config such as {_target_: torch.nn.GELU} (or choose "
                                 "ffn=relu|gelu|swiglu|geglu)"),
    ("norm.layer.eps", positive_number),
    ("ffn.hidden_mult", positive_number),
    ("ffn.multiple_of", positive_int),
    ("moe.num_experts", positive_int),
    ("moe.top_k", positive_int),
    ("moe.aux_loss_coef", non_negative_number),
    ("moe.z_loss_coef", non_negative_number),
    ("moe.balance", one_of(BALANCE)),
    ("attn.kv_heads", optional(positive_int)),
    ("attn.window", optional(positive_int)),
]


def _divisible(a: str, b: str, why: str) -> Callable[[Mapping[str, Any]], str | None]:
    def check(flat: Mapping[str, Any]) -> str | None:
        x, y = flat.get(a), flat.get(b)
        if _is_int(x) and _is_int(y) and y > 0 and x % y:
            return f"{a}={x} is not divisible by {b}={y} ({why})"
        return None

    return check


def _same(a: str, b: str, why: str) -> Callable[[Mapping[str, Any]], str | None]:
    def check(flat: Mapping[str, Any]) -> str | None:
        if a in flat and b in flat and flat[a] != flat[b]:
            return f"{a}={_show(flat[a])} but {b}={_show(flat[b])}: {why}"
        return None

    return check


def _heads(flat: Mapping[str, Any]) -> str | None:
    if flat.get("model.net.encoder", "attention") != "attention":  # the sequence classifier's RNN / CNN: no heads
        return None
    return _divisible("model.net.d_model", "model.net.n_heads", "each head gets d_model / n_heads dimensions")(flat)


def _kv_heads(flat: Mapping[str, Any]) -> str | None:
    if flat.get("attn.kv_heads") is None:
        return None
    return _divisible("model.net.n_heads", "attn.kv_heads",
                      "grouped-query attention shares each key/value head among n_heads / kv_heads query heads")(flat)


def _top_k(flat: Mapping[str, Any]) -> str | None:
    k, n = flat.get("moe.top_k"), flat.get("moe.num_experts")
    if _is_int(k) and _is_int(n) and k > n:
        return f"moe.top_k={k} is more than moe.num_experts={n}: each token picks top_k of the experts"
    return None


def _bidirectional_gru(flat: Mapping[str, Any]) -> str | None:
    d = flat.get("model.net.d_model")
    if flat.get("model.net.bidirectional") and flat.get("model.net.encoder") == "rnn" and _is_int(d) and d % 2:
        return f"model.net.d_model={d} must be even for a bidirectional GRU (d_model/2 per direction)"
    return None


def _gpu_present(flat: Mapping[str, Any]) -> str | None:
    """trainer=gpu/ddp/fsdp on a machine without CUDA: Lightning's answer is a 4-line instantiate traceback."""
    accelerator = flat.get("trainer.accelerator")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        return (f"trainer.accelerator={accelerator} but this machine has no CUDA GPU (torch.cuda.is_available() "
                f"is False): use trainer=cpu, or trainer=ddp_cpu for DDP with 2 processes on CPU")
    return None


def _rotary_head_dim(flat: Mapping[str, Any]) -> str | None:
    d, h = flat.get("model.net.d_model"), flat.get("model.net.n_heads")
    if str(flat.get("pos._target_", "")).endswith("RotaryPositions") and _is_int(d) and _is_int(h) and h > 0 and d % h == 0 and (d // h) % 2:
        return (f"pos=rotary needs an even head dimension, but model.net.d_model={d} / model.net.n_heads={h} = "
                f"{d // h}")
    return None


def _even_rnn_hidden(flat: Mapping[str, Any]) -> str | None:
    d = flat.get("model.net.d_hidden")  # seq2seq_*: the bidirectional encoder runs d_hidden/2 per direction
    if _is_int(d) and d % 2:
        return f"model.net.d_hidden={d} must be even (the bidirectional encoder runs d_hidden/2 per direction)"
    return None


BPE_DATA = ("attnlab.data.lm_datamodule.LMDataModule", "attnlab.data.translation_datamodule.TranslationDataModule")


def _bpe_vocab(flat: Mapping[str, Any]) -> str | None:
    v = flat.get("data.vocab_size")  # the byte-level BPE of the text data sets starts from its specials and 256 bytes
    if flat.get("data._target_") in BPE_DATA and _is_int(v) and v < 260:
        return f"data.vocab_size={v}: must be >= 260 for a byte-level BPE (4 special tokens + 256 bytes)"
    return None


RELATIONS: list[Callable[[Mapping[str, Any]], str | None]] = [
    _heads,
    _divisible("model.net.image_size", "model.net.patch_size",
               "the image is cut into patch_size × patch_size patches"),
    _even_rnn_hidden,
    _same("model.net.image_size", "data.image_size", "the model is built for the images the data gives; set both "
          "alike (or leave model.net.image_size at its default ${data.image_size})"),
    _same("model.net.in_channels", "data.in_channels", "the model is built for the images the data gives; set both "
          "alike (or leave model.net.in_channels at its default ${data.in_channels})"),
    _top_k,
    _kv_heads,
    _bpe_vocab,
    _bidirectional_gru,
    _rotary_head_dim,
    _gpu_present,
]


def _show(v: Any) -> str:
    """A value as the user would type it on the command line."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def _pattern(glob: str) -> re.Pattern:
    return re.compile("[^.]*".join(re.escape(part) for part in glob.split("*")) + r"\Z")


_COMPILED = [(_pattern(glob), check) for glob, check in RULES]


def _checked_values(cfg: DictConfig) -> dict[str, Any]:
    """The flattened, resolved values the rules look at: model, data, trainer, and the block groups the model is
    built from (``model.net.moe`` etc. are those groups interpolated; they are checked under the group's name)."""
    view: dict[str, Any] = {}
    for key in ("model", "data", "trainer"):
        node = cfg.get(key)
        if isinstance(node, DictConfig):
            view[key] = OmegaConf.to_container(node, resolve=True)
    groups = used_groups(cfg)
    for g in groups:
        node = cfg.get(g)
        if isinstance(node, DictConfig) and len(node):  # moe=off is {}
            view[g] = OmegaConf.to_container(node, resolve=True)
    net = view.get("model", {}).get("net")
    if isinstance(net, dict):
        for g in BLOCK_GROUPS:
            net.pop(g, None)
    return flatten(view)


def missing_values(node: Any, prefix: str) -> list[str]:
    """Dotted keys under ``node`` left at ``???`` (a value the user must give, e.g. ``data.path`` of data=tsv)."""
    if not isinstance(node, DictConfig):
        return []
    found = []
    for key in node.keys():
        if OmegaConf.is_missing(node, key):
            found.append(f"{prefix}.{key}")
        elif not OmegaConf.is_interpolation(node, key):
            found += missing_values(node._get_node(key), f"{prefix}.{key}")
    return found


def _choices(cfg: DictConfig) -> dict[str, str]:
    """The config group choices of this run (empty outside a Hydra job, e.g. a composed config in a test)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return {k: str(v) for k, v in HydraConfig.get().runtime.choices.items()}
    except ValueError:
        return {}


def config_problems(cfg: DictConfig) -> list[str]:
    """Every problem found, one phrase each (empty: the config is fine)."""
    missing = [k for top in ("data", "model") for k in missing_values(cfg.get(top), top)]
    if missing:  # nothing else can be resolved reliably before these are given
        return [f"{k} is not set: give it on the command line ({k}=...)" for k in missing]
    try:
        flat = _checked_values(cfg)
    except InterpolationKeyError as e:  # e.g. model=vit with data=pydoc: the model reads a key that data lacks
        choices = _choices(cfg)
        return [f"{e.full_key} reads ${{{str(e).split(chr(39))[1]}}}, which data={choices.get('data', '?')} does not "
                f"have: model={choices.get('model', '?')} needs a data option made for it (leave `data` out to get "
                f"the model's own)"]
    problems = []
    for key, value in flat.items():
        for pattern, check in _COMPILED:
            if pattern.match(key):
                problem = check(value)
                if problem:
                    problems.append(f"{key}={_show(value)}: {problem}")
                break
    if problems:  # relations assume the single values are sane
        return problems
    return [p for relation in RELATIONS if (p := relation(flat))]


def validate_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming every bad value (on one line, ``; ``-separated) before anything is built."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
