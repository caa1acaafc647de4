"""Check the composed config's numbers before anything is built: one line naming the key, the value and what is
allowed, instead of a torch error that never names the key (``model.net.d_model=abc``), a ZeroDivisionError
(``n_heads=0``), a model trained without attention (``n_layers=0``) or a traceback from the optimizer (``lr=-1``).

:func:`validate_config` reads two tables:

* ``RULES``: (key pattern, check) for the run's single values. ``*`` matches within one dotted part
  (``model.decoding.*.beam_size`` covers ``val`` and ``test``). A key the chosen model or data set does not have is
  skipped, so one table serves every model family (conf/model/*.yaml).
* ``RELATIONS``: checks between values of different places (the data's vocabulary and the byte-level BPE, a CUDA
  GPU for trainer=gpu), each skipped unless its keys are there.

The block groups (``norm``, ``ffn``, ``moe``, ``attn``, ``pos``) are not in these tables: each group's values are
checked by its typed settings (:mod:`attnlab.modules.settings`), which the parts build from their arguments too, so
each rule is written once; here they are made from the resolved groups a model is built from
(:func:`~attnlab.runs.config_tree.used_groups`; ``moe`` only when the mixture is on), and their relations to the net's
sizes (:func:`_part_relations`) run with the other relations. A key a group's settings do not declare is refused.

A family's own values (the RNN's ``model.cell``, the ViT's patch size) are checked by the rules its declaration in
:mod:`attnlab.families` carries (built with :func:`table_rules`), for the family the config builds only.

The ``optim`` and ``sched`` groups are checked for the values they set themselves (``optim.momentum``); the ones they
read from the model's ``model.optimizer`` / ``model.scheduler`` are checked there, and a command-line value there
that the chosen option does not read is refused (:func:`unread_problems`). Which class a group option builds is
Hydra's business (an unknown option is its one line); the numbers it is given are checked here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

from ..core.choices import PROGRESS_STYLES, SCHEDULES, TARGET_LANGS
from ..core.errors import ConfigError, SettingError
from ..families import for_config
from ..modules.settings import PART_SETTINGS, Settings
from ..core.value_checks import (
    Check,
    boolean,
    is_int as _is_int,
    is_number as _is_number,
    key_pattern,
    non_negative_int,
    non_negative_number,
    one_of,
    optional,
    positive_int,
    positive_number,
    probability,
    unit_interval,
    value_problems,
)
from .config_tree import BLOCK_GROUPS, flatten, used_groups


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


# Lightning's seed_everything (and numpy's) take 0 .. 2**32 - 1; outside, Lightning raised a traceback after ~10 s
SEED_MAX = 2**32 - 1


def seed(v: Any) -> str | None:
    return None if _is_int(v) and 0 <= v <= SEED_MAX else f"must be an integer from 0 to {SEED_MAX}"


# characters W&B refuses in a project name (wandb.sdk.lib.runid / the server's check)
_WANDB_PROJECT_BAD = set('/\\#?%:')


def metric_names(v: Any) -> str | None:
    """``optimized_metric``: a metric's name, a list of them (a multi-objective search), or null."""
    one = name_check(256, nullable=True)
    if isinstance(v, (list, tuple)):
        if not v:
            return "must name a metric, or list one or more (a multi-objective search)"
        return next((f"{problem} (each listed metric)" for m in v if (problem := one(m))), None)
    return one(v)


def name_check(max_len: int, *, folder: bool = False, bad_chars: set[str] = frozenset(), nullable: bool = False,
               quote_hint: str = "") -> Check:
    """Text that becomes a folder name (``folder``: no ``/``, not ``.``/``..``) or a W&B field: a string (``nan``,
    ``1e3``, ``true`` on the command line are numbers and booleans; quote them), non-empty, at most ``max_len``
    characters, no control characters."""

    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        what = f"must be text of 1 to {max_len} characters" + (" (or null)" if nullable else "")
        if not isinstance(v, str):
            hint = f" ({quote_hint})" if quote_hint else ""
            return f"{what}; on the command line quote a value that reads as a number or boolean{hint}"
        if not v.strip() or len(v) > max_len or any(ord(c) < 32 or c == "\x7f" for c in v):
            return f"{what}, without control characters"
        if folder and ("/" in v or "\\" in v or v in (".", "..")):
            return f"{what}: it names a folder, so no / or \\ and not . or .."
        if bad := sorted(set(v) & set(bad_chars)):
            return f"{what}, without {' '.join(bad)}"
        return None

    return check


def threads_setting(v: Any) -> str | None:
    """``threads``: torch's intra-op threads per process, or auto (utils/threads.py)."""
    return None if v == "auto" or (_is_int(v) and v >= 1) else "must be auto or a positive integer"


def tag_list(v: Any) -> str | None:
    from .sweep import WANDB_TAG_MAX

    ok = v is None or (isinstance(v, (list, tuple)) and all(isinstance(t, (str, int, float)) and not isinstance(
        t, bool) and 0 < len(str(t)) <= WANDB_TAG_MAX for t in v))
    return None if ok else f"must be a list of tags of 1 to {WANDB_TAG_MAX} characters (W&B's limit)"


def path_text(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() and "\0" not in v else "must be a path"


def optional_path(v: Any) -> str | None:
    return None if v is None else path_text(v)


def adam_betas(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v)
    return None if ok else "must be two numbers in [0, 1), e.g. [0.9, 0.98]"


RULES: list[tuple[str, Check]] = [
    # the run: its seed, the names that become folders (outputs/<task_name>/runs) and W&B fields, switches
    ("seed", seed),
    ("task_name", name_check(64, folder=True, quote_hint="task_name=\"'nan'\"")),  # W&B's job_type: <= 64
    ("experiment_name", name_check(128, folder=True, nullable=True, quote_hint="experiment_name=\"'1'\"")),
    ("tags", tag_list),
    *((k, boolean) for k in ("train", "test", "compile")),
    ("threads", threads_setting),
    ("ckpt_path", optional_path),
    ("resume", optional_path),
    ("init_from", optional_path),
    ("optimized_metric", metric_names),
    ("extend_sweep", boolean),
    *((f"paths.{k}", path_text) for k in ("root_dir", "cache_dir", "log_dir", "output_dir")),
    ("logger.wandb.project", name_check(128, bad_chars=_WANDB_PROJECT_BAD, quote_hint="logger.wandb.project="
                                        "\"'1'\"")),
    *((f"logger.wandb.{k}", name_check(128, nullable=True)) for k in ("entity", "name", "group", "id")),
    ("logger.wandb.job_type", name_check(64, nullable=True)),
    ("logger.wandb.tags", tag_list),
    # the sizes most families share (a family's own: its declaration's rules, attnlab.families)
    *((f"model.net.{k}", positive_int) for k in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len",
                                                 "num_classes")),
    ("model.net.n_encoder_layers", optional(positive_int)),  # null: n_layers
    ("model.net.n_decoder_layers", optional(positive_int)),
    *((f"model.net.{k}", probability) for k in ("dropout", "attn_dropout")),
    # optimization
    ("model.optimizer.lr", learning_rate),
    ("model.optimizer.weight_decay", non_negative_number),
    ("model.optimizer.betas", adam_betas),
    ("model.scheduler.warmup_steps", non_negative_int),
    ("model.scheduler.min_lr_ratio", unit_interval),
    # the optim / sched groups' own values (those they read from model.optimizer / model.scheduler: checked there)
    ("optim.lr", learning_rate),
    ("optim.weight_decay", non_negative_number),
    ("optim.betas", adam_betas),
    ("optim.eps", positive_number),
    ("optim.momentum", probability),
    ("optim.dampening", unit_interval),
    ("optim.nesterov", boolean),
    ("optim.ns_steps", positive_int),
    ("optim.adjust_lr_fn", optional(one_of(("original", "match_rms_adamw")))),
    ("optim.beta2_decay", lambda v: None if _is_number(v) and -1 <= v <= 0 else "must be a number in [-1, 0]"),
    ("sched.warmup_steps", non_negative_int),
    ("sched.min_lr_ratio", unit_interval),
    ("sched.decay_fraction", unit_interval),
    ("sched.total_steps", optional(positive_int)),
    ("model.label_smoothing", probability),
    ("model.scheduled_sampling.schedule", one_of(SCHEDULES)),
    ("model.decoding.*.beam_size", positive_int),
    ("data.batch_size", positive_int),
    ("data.*_size", positive_int),  # train_size, val_size, copy_test_size, ...
    *((f"data.{k}", positive_int) for k in ("max_chars", "max_frames")),  # the speech corpora
    *((f"data.mel.{k}", positive_int) for k in ("sample_rate", "n_fft", "hop_length", "win_length", "n_mels")),
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
    ("trainer.log_every_n_steps", positive_int),
    ("trainer.check_val_every_n_epoch", optional(positive_int)),
    ("trainer.min_epochs", optional(non_negative_int)),
    ("trainer.num_sanity_val_steps", int_at_least(-1)),  # -1: the whole validation set
    ("trainer.gradient_clip_val", optional(non_negative_number)),
    *((f"trainer.{k}", boolean) for k in ("enable_progress_bar", "enable_checkpointing", "enable_model_summary")),
    # callbacks (conf/callbacks): how often and how much they write
    *((f"callbacks.*.{k}", positive_int) for k in ("every_n_epochs", "every_n_steps", "check_every_n_steps",
                                                   "log_every_n_steps", "max_tokens", "max_heads", "size")),
    ("callbacks.*.max_layers", optional(positive_int)),
    ("callbacks.nonfinite.max_skips", non_negative_int),
    ("callbacks.attention_maps.explorer_audio_epochs", non_negative_int),  # 0: no audio on the page
    ("callbacks.rich_progress_bar.every_s", positive_number),
    ("callbacks.rich_progress_bar.style", one_of(PROGRESS_STYLES)),
    ("callbacks.model_checkpoint.save_top_k", int_at_least(-1)),  # -1: keep every checkpoint
    ("callbacks.model_checkpoint.mode", one_of(("min", "max"))),
    ("callbacks.early_stopping.mode", one_of(("min", "max"))),
    ("callbacks.early_stopping.patience", non_negative_int),
    ("trainer.precision", one_of(PRECISIONS)),
    ("trainer.max_epochs", optional(int_at_least(-1))),  # -1: no limit (Lightning's convention)
    ("trainer.max_steps", optional(int_at_least(-1))),
]


def _gpu_present(flat: Mapping[str, Any]) -> str | None:
    """trainer=gpu/ddp/fsdp on a machine without CUDA: Lightning's answer is a 4-line instantiate traceback."""
    accelerator = flat.get("trainer.accelerator")
    if accelerator in ("gpu", "cuda") and not _has_cuda():
        return (f"trainer.accelerator={accelerator} but this machine has no CUDA GPU (torch.cuda.is_available() "
                f"is False): use trainer=cpu, or trainer=ddp_cpu for DDP with 2 processes on CPU")
    return None


BPE_DATA = ("attnlab.data.lm_datamodule.LMDataModule", "attnlab.data.translation_datamodule.TranslationDataModule")


def _bpe_vocab(flat: Mapping[str, Any]) -> str | None:
    v = flat.get("data.vocab_size")  # the byte-level BPE of the text data sets starts from its specials and 256 bytes
    if flat.get("data._target_") in BPE_DATA and _is_int(v) and v < 260:
        return f"data.vocab_size={v}: must be >= 260 for a byte-level BPE (4 special tokens + 256 bytes)"
    return None


RELATIONS: list[Callable[[Mapping[str, Any]], str | None]] = [
    _bpe_vocab,
    _gpu_present,
]


def _part_settings(resolved: Mapping[str, Any], groups: Sequence[str]) -> tuple[dict[str, Settings], list[str]]:
    """(the typed settings of each block group the model is built from, the problems of those that refuse their
    values or keys); moe=off (``{}``) has none: the feed-forward stays dense."""
    built: dict[str, Settings] = {}
    problems: list[str] = []
    for group in groups:
        node = resolved.get(group)
        if group not in PART_SETTINGS or not isinstance(node, Mapping) or (group == "moe" and not node):
            continue
        try:
            built[group] = PART_SETTINGS[group].from_config(node)
        except SettingError as e:
            problems.append(str(e))
    return built, problems


def _part_relations(flat: Mapping[str, Any], parts: Mapping[str, Settings]) -> list[str]:
    """The parts' relations to the net's sizes (kv_heads divides n_heads, rotary's even head width, ...): the
    settings' own methods, which the parts call when built; a problem two parts share is said once."""
    d_model, n_heads = flat.get("model.net.d_model"), flat.get("model.net.n_heads")
    found: list[str] = []
    if _is_int(d_model) and _is_int(n_heads):  # (a net without heads, the RNNs: no such relation)
        for settings in parts.values():
            found += [p for p in settings.size_problems(d_model, n_heads) if p not in found]
    return found


# the optimizer and LR-schedule groups, and the model's tuned values (its conf/model file) their options read
OPTIMIZATION_GROUPS = {"optim": "model.optimizer", "sched": "model.scheduler"}

# the top-level keys of conf/train.yaml the rules read (the groups are read whole)
TOP_KEYS = ("seed", "task_name", "experiment_name", "tags", "train", "test", "compile", "threads", "ckpt_path",
            "resume", "init_from", "optimized_metric", "extend_sweep")

_COMPILED = [(key_pattern(glob), check) for glob, check in RULES]


def _checked_values(cfg: DictConfig, resolved: dict, groups: Sequence[str]) -> dict[str, Any]:
    """The flattened, resolved values the rules look at: the run's top-level keys, model, data, trainer, paths,
    logger, callbacks, and the block ``groups`` the model is built from (``model.net.moe`` etc. are those groups
    interpolated; they are read under the group's name). ``resolved``: the whole config resolved."""
    view: dict[str, Any] = {k: resolved[k] for k in TOP_KEYS if k in resolved}
    for key in ("model", "data", "trainer", "paths", "logger", "callbacks", *groups):
        node = resolved.get(key)
        if isinstance(node, dict) and (len(node) or key not in BLOCK_GROUPS):  # moe=off is {}
            view[key] = node
    for key in OPTIMIZATION_GROUPS:  # the values an option sets itself; what it reads from the model's is checked there
        node = cfg.get(key)
        if isinstance(node, DictConfig) and isinstance(resolved.get(key), dict):
            view[key] = {k: v for k, v in resolved[key].items() if not OmegaConf.is_interpolation(node, k)}
    net = (view.get("model") or {}).get("net")
    if isinstance(net, dict):  # a copy without the interpolated groups (read under their own names above)
        view["model"] = {**view["model"], "net": {k: v for k, v in net.items() if k not in BLOCK_GROUPS}}
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


def interpolation_problem(cfg: DictConfig) -> str | None:
    """The first value of the run's config that cannot be resolved (a key that does not exist, a loop, an unset
    environment variable, a malformed ``${...}``), named with the key that holds it; None if all resolve."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        return interpolation_message(e)
    return None


def interpolation_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or "a value"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, InterpolationKeyError):  # ${x.y} names a key that does not exist
        missing = first.split("'")[1] if first.count("'") >= 2 else "?"
        choices = _choices(None)
        if key.startswith("model.") and missing.startswith("data.") and "data" in choices:
            # e.g. model=vit with data=pydoc: the model reads a key that this data option lacks
            return (f"{key} reads ${{{missing}}}, which data={choices['data']} does not have: "
                    f"model={choices.get('model', '?')} needs a data option made for it (leave `data` out to get "
                    f"the model's own)")
        return f"{key} reads ${{{missing}}}, which does not exist in the config"
    if "Recursive interpolation" in first:
        return f"{key} refers to itself through ${{...}} (an interpolation loop); give it a value"
    env = re.search(r"Environment variable '([^']*)' not found", first)
    if env:
        return (f"{key} reads the environment variable {env.group(1)}, which is not set; set it or give "
                f"{key}=<value>")
    return f"{key} cannot be resolved: {first.replace('KeyError raised while resolving interpolation: ', '')}"


def _choices(cfg: DictConfig | None) -> dict[str, str]:
    """The config group choices of this run (empty outside a Hydra job, e.g. a composed config in a test)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return {k: str(v) for k, v in HydraConfig.get().runtime.choices.items()}
    except (ValueError, AttributeError):
        return {}


def config_problems(cfg: DictConfig) -> list[str]:
    """Every problem found, one phrase each (empty: the config is fine)."""
    return _resolved_problems(cfg)[0]


def _resolved_problems(cfg: DictConfig) -> tuple[list[str], dict | None]:
    """(:func:`config_problems`, the whole config resolved: None where it does not resolve)."""
    missing = [k for top in ("data", "model") for k in missing_values(cfg.get(top), top)]
    if missing:  # nothing else can be resolved reliably before these are given
        return [f"{k} is not set: give it on the command line ({k}=...)" for k in missing], None
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # a key that does not exist, a loop, an unset environment variable
        return [interpolation_message(e)], None
    net = resolved["model"].get("net") if isinstance(resolved.get("model"), dict) else None
    groups = used_groups(cfg, True, net)
    flat = _checked_values(cfg, resolved, groups)
    parts, part_problems = _part_settings(resolved, groups)
    problems = value_problems(flat, _COMPILED) + part_problems
    family = for_config(cfg)
    if not problems and family is not None:
        problems = family.rules(flat)
    if not problems:  # relations assume the single values are sane
        problems = _part_relations(flat, parts) + [p for relation in RELATIONS if (p := relation(flat))]
    return problems, resolved


def model_value_problems(model: Mapping[str, Any]) -> list[str]:
    """The single-value rules of a model config read from a file (a checkpoint's ``hyper_parameters``), as the run's
    config is checked: ``model.net.n_heads='many': must be a positive integer``."""
    return value_problems(flatten({"model": dict(model)}), _COMPILED)


def _has_cuda() -> bool:
    import torch  # (only for trainer=gpu: other checks need no torch, so a refusal answers before it is imported)

    return torch.cuda.is_available()


def validate_config(cfg: DictConfig, overrides: Sequence[str] = (), memory: bool = True) -> dict:
    """Raise :class:`ConfigError` naming every bad value (on one line, ``; ``-separated) before anything is built;
    then the parts that ``+``/``++``/``~`` overrides (the command line's, ``overrides``) changed, and the writable
    places the run needs (the data cache). Returns the whole config resolved (plain containers): resolved once
    here, the checks and train.py read it. ``memory=False``: without the model-size check (:func:`memory_check`),
    which imports torch: train.py runs it after the data files are read."""
    problems, resolved = _resolved_problems(cfg)
    if not problems:
        overrides = _as_typed(overrides)
        problems = new_key_problems(overrides) + override_problems(cfg, overrides) + \
            unread_problems(cfg, overrides) + cache_problems(cfg) + logger_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    if memory:
        memory_check(cfg, resolved)
    return resolved


def memory_check(cfg: DictConfig, resolved: dict) -> None:
    """A model too big for this machine's memory: one line (the net is built on torch's meta device)."""
    from .model_memory import memory_problem

    net = resolved["model"].get("net") if isinstance(resolved.get("model"), dict) else None
    problem = memory_problem(cfg, net)
    if problem:
        raise ConfigError(problem)


def _as_typed(overrides: Sequence[str]) -> list[str]:
    """The command line's overrides as typed: iterating a ListConfig would resolve ``x=${...}`` in them."""
    if OmegaConf.is_config(overrides):
        overrides = OmegaConf.to_container(overrides, resolve=False)
    return [str(o) for o in overrides]


# keys of a part's config that are Hydra's or train.py's, not arguments of the part
_META_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "name", "shortcuts"}


# parts whose **kwargs go on to another callable: checked against that one's parameters too
KWARGS_GO_TO = {"lightning.pytorch.loggers.wandb.WandbLogger": "wandb.init",
                "lightning.pytorch.loggers.WandbLogger": "wandb.init"}


def _parameters(target: str) -> tuple[set[str], set[str], bool] | None:
    """(every keyword parameter, the required ones, takes **kwargs) of the callable ``target`` names; None if it
    cannot be imported or inspected (instantiate then names it)."""
    import inspect

    from hydra.utils import get_object

    try:
        obj = get_object(target)
        # a class whose __init__ passes **kwargs on to its base's: the bases' parameters count too
        inits = [k.__dict__["__init__"] for k in obj.__mro__ if "__init__" in k.__dict__] \
            if inspect.isclass(obj) else [obj]
        sigs = [inspect.signature(f) for f in inits] if inspect.isclass(obj) else [inspect.signature(obj)]
    except Exception:  # noqa: BLE001 - not ours to judge here
        return None
    names, required, var_kw = set(), set(), False
    for i, sig in enumerate(sigs):
        var_kw = False
        for p in list(sig.parameters.values())[1 if inspect.isclass(obj) else 0:]:  # not self
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                names.add(p.name)
                if p.default is p.empty and i == 0:
                    required.add(p.name)
        if not var_kw:
            break
    if var_kw and target in KWARGS_GO_TO:
        onward = _parameters(KWARGS_GO_TO[target])
        if onward is not None:
            names |= onward[0]
            var_kw = onward[2]
    return names, required, var_kw


def override_problems(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """``+key=v`` / ``++key=v`` / ``~key`` on a part (a node with ``_target_``): the key must be an argument the
    part takes, and a deletion must leave every argument it needs. Without this check the typo surfaced as a
    TypeError traceback from inside instantiate, after Lightning had started. A config group (``+experiment=x``,
    ``~logger``) and keys of plain nodes (``~callbacks.early_stopping``) are Hydra's business."""
    problems = []
    for override in _as_typed(overrides):
        if not override.startswith(("+", "~")):
            continue
        op = "~" if override.startswith("~") else "++" if override.startswith("++") else "+"
        key = override[len(op):].split("=", 1)[0]
        if "." not in key or key.startswith("hydra."):
            continue
        parent_key, leaf = key.rsplit(".", 1)
        parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False)
        if not isinstance(parent, DictConfig) or "_target_" not in parent or leaf in _META_KEYS:
            continue
        target = str(parent.get("_target_"))
        found = _parameters(target)
        if found is None:
            continue
        names, required, var_kw = found
        if op != "~" and leaf not in names and not var_kw:
            shown = ", ".join(sorted(names)) or "none"
            problems.append(f"{override}: {target} takes no argument {leaf!r} (its arguments: {shown})")
        elif op == "~" and leaf in required and not parent.get("_partial_"):
            problems.append(f"{override} removes {key}, which {target} needs")
    return problems


def new_key_problems(overrides: Sequence[str]) -> list[str]:
    """``+sed=1``: a key added at the top of the config that train.py does not read (a typo of ``seed`` was
    silently ignored); named with the nearest key it has. Keys under a known one (``+callbacks.x=...``) are the
    groups' business (:func:`override_problems`)."""
    import difflib

    from ..core.paths import CONF_DIR

    known = None
    problems = []
    for override in _as_typed(overrides):
        if not override.startswith("+"):
            continue
        top = override.lstrip("+").split("=", 1)[0].split(".", 1)[0]
        if known is None:
            keys = OmegaConf.load(CONF_DIR / "train.yaml").keys()
            known = {str(k) for k in keys if k != "defaults"} | {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
        if top not in known:
            near = difflib.get_close_matches(top, sorted(known), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            problems.append(f"{override}: train.py has no key {top}; {hint}(its keys: {', '.join(sorted(known))})")
    return problems


def unread_problems(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """A command-line value of the model's tuned optimizer or schedule values (``model.optimizer.betas=...``,
    ``+model.scheduler.total_steps=...``) that the chosen ``optim`` / ``sched`` option does not read: one line naming
    what it reads, instead of a value silently unused (``optim=sgd`` has no betas)."""
    problems = []
    for override in _as_typed(overrides):
        key = override.lstrip("+~").split("=", 1)[0]
        for group, values in OPTIMIZATION_GROUPS.items():
            node = cfg.get(group)
            if not key.startswith(values + ".") or not isinstance(node, DictConfig):
                continue
            written = repr(OmegaConf.to_container(node, resolve=False))
            if "${" + key + "}" not in written:
                reads = sorted(set(re.findall(r"\$\{(" + re.escape(values) + r"\.\w+)\}", written)))
                leaf, value = key.rsplit(".", 1)[-1], override.split("=", 1)[-1]
                found = _parameters(str(node.get("_target_")))
                own = (f"give it as {'' if leaf in node else '+'}{group}.{leaf}={value}" if found and leaf in found[0]
                       else f"its own arguments are {group}.<name>=...")
                problems.append(f"{override}: {group}={_choices(cfg).get(group, 'this option')} does not read {key} "
                                f"(it reads {', '.join(reads) or 'none of ' + values}); {own}")
    return problems


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(path.anchor or "/")


def cache_problems(cfg: DictConfig) -> list[str]:
    """The data cache (``paths.cache_dir``, ATTNLAB_CACHE) must be a folder this process can create and write, on
    a disk with room: found now, not as an OSError traceback while the corpus is written (after Lightning, the W&B
    run and the run folder were set up). Nothing is created here."""
    try:
        cache = cfg.paths.cache_dir
    except Exception:  # noqa: BLE001 - a config without paths (composed by hand)
        return []
    if not isinstance(cache, str):
        return []
    path = Path(os.path.abspath(os.path.expanduser(cache)))
    above = _nearest_existing(path)
    why = None
    if not above.is_dir():
        why = f"{above} is a file, not a folder"
    elif not os.access(above, os.W_OK | os.X_OK):
        why = f"{above} is not writable"
    else:
        try:
            st = os.statvfs(above)
            if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
                why = f"the disk of {above} is full ({st.f_bavail * st.f_frsize // 1024} KiB free)"
        except OSError:
            pass
    if why is None:
        return []
    return [f"paths.cache_dir={path}: cannot write the data cache there: {why}; set ATTNLAB_CACHE (or "
            f"paths.cache_dir) to a writable folder"]


MIN_FREE_BYTES = 1 << 20  # less than this on the cache's disk: not even a tokenizer fits

# a logger class -> the packages it can write with (any one), and how to install them
LOGGER_PACKAGES = {
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger":
        (("tensorboard", "tensorboardX"), "pip install -e \".[tensorboard]\" (or pip install tensorboard)"),
}


def logger_problems(cfg: DictConfig) -> list[str]:
    """A chosen logger whose package is not installed (``logger=tensorboard`` after the README's install): named
    with the command that installs it, before anything is built (Lightning would fail once the run had started)."""
    import importlib.util

    loggers = OmegaConf.select(cfg, "logger", default=None)
    if not isinstance(loggers, DictConfig):
        return []
    out = []
    for name, node in loggers.items():
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        need = LOGGER_PACKAGES.get(str(target))
        if need and not any(importlib.util.find_spec(p) is not None for p in need[0]):
            out.append(f"logger={name} needs the {need[0][0]} package, which is not installed: {need[1]}")
    return out
