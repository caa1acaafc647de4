"""The generated space of bad command-line values (tests/test_bad_inputs.py): walk a composed config, classify every
leaf by its type and name, and produce, per kind, values that must be refused.

Kinds (what a leaf is, decided from the composed config, not from the validator's table):

* ``seed``: the run's seed: negative, text, over 2**32 - 1, a fraction;
* ``size``: a positive integer of the model, the data or a callback (``d_model``, ``n_heads``, ``batch_size``,
  ``every_n_epochs`` ...): 0, -1, text, a fraction; the model's widths also a size that cannot be allocated;
* ``count``: a callback's non-negative count where 0 means none (``max_skips``, ``patience``, the explorer's
  audio epochs): -1, text, a fraction;
* ``rate``: a dropout, a fraction of the data or of training, label smoothing, a momentum: below 0, above 1,
  NaN, text;
* ``positive``: a learning rate, an epsilon, a weight decay, a multiplier: negative, NaN, text;
* ``name``: text that becomes a folder name or a W&B field (``task_name``, ``experiment_name``, W&B project, name,
  group, job type, tags): a number (``nan`` on the command line), a slash, empty, 300 characters;
* ``switch``: the run's true/false switches (train, test, compile): text, 2;
* ``interpolation``: every leaf: an unset environment variable, a loop onto itself, a key that does not exist;
* ``override``: every part (a node with ``_target_``): ``+part.x=1``, ``++part.x=1`` (an argument it does not
  take), ``~part`` where its parent part needs it.

A case is (id, overrides): the command-line overrides that provoke it; :func:`apply` makes the same change on a
composed config in-process.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

UNSET_ENV = "ATTNLAB_TEST_SURELY_UNSET"

SIZE_NAME = re.compile(r"(^|_)(size|len|layers|heads|dim|channels|mels|reduction|steps|epochs|tokens|classes|"
                       r"experts|top_k|kv_heads|window|multiple_of)$|^(d|n|num|max)_")
# non-negative counts where 0 means "none" or "off"
COUNT_NAME = re.compile(r"(^|\.)(max_skips|explorer_audio_epochs|patience)$")
RATE_NAME = re.compile(r"dropout|fraction|label_smoothing|min_lr_ratio|momentum")
POSITIVE_NAME = re.compile(r"(^|\.)(lr|eps|weight_decay|hidden_mult|aux_loss_coef|z_loss_coef)$")
NAMES = {"task_name": "folder", "experiment_name": "folder", "logger.wandb.project": "wandb",
         "logger.wandb.name": "wandb", "logger.wandb.group": "wandb", "logger.wandb.job_type": "wandb"}
SWITCHES = ("train", "test", "compile")
WIDTHS = re.compile(r"^model\.net\.(d_model|d_hidden|d_emb)$")
# leaves whose integer is not a size (-1 means "no limit", 0 means "off", or an index) or is bookkeeping
NOT_SIZES = re.compile(r"max_epochs|max_steps|min_epochs|num_sanity_val_steps|max_skips|save_top_k|num_workers|"
                       r"warmup_steps|max_len_b|max_length_offset|enc_prenet_convs|devices|peak_flops|max_layers|"
                       r"decode_val_batches|limit_")


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    overrides: tuple[str, ...]


def _leaves(node, prefix=""):
    """(dotted key, raw value) of every leaf, interpolations unresolved; list items are left out."""
    for key in node.keys() if isinstance(node, DictConfig) else []:
        full = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_interpolation(node, key):
            yield full, node._get_node(key)._value()
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            yield from _leaves(child, full)
        elif isinstance(child, ListConfig):
            yield full, OmegaConf.to_container(child)
        else:
            yield full, child._value()


def _value(v) -> str:
    """A Python value as a command-line override value."""
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, str):
        return v if v and re.fullmatch(r"[A-Za-z0-9_./-]+", v) else "'" + v.replace("'", "\\'") + "'"
    return str(v).lower() if isinstance(v, bool) else str(v)


def classify(key: str, value) -> str | None:
    leaf = key.rsplit(".", 1)[-1]
    if key == "seed":
        return "seed"
    if key in NAMES or key in ("tags", "logger.wandb.tags"):
        return "name"
    if key in SWITCHES:
        return "switch"
    if isinstance(value, bool) or leaf.startswith("_"):
        return None
    if isinstance(value, int) and value >= 0 and COUNT_NAME.search(key) and key.startswith("callbacks."):
        return "count"
    if isinstance(value, int) and value >= 1 and SIZE_NAME.search(leaf) and not NOT_SIZES.search(key) \
            and key.startswith(("model.", "data.", "callbacks.", "trainer.", "moe.", "attn.", "ffn.", "optim.")):
        return "size"
    if isinstance(value, float) and RATE_NAME.search(leaf):
        return "rate"
    if isinstance(value, (int, float)) and POSITIVE_NAME.search(key):
        return "positive"
    return None


BAD = {
    "seed": [-1, "abc", 2**32, 1.5],
    "size": [0, -1, "abc", 2.5],
    "count": [-1, "abc", 2.5],
    "rate": [-0.1, 1.5, float("nan"), "abc"],
    "positive": [-1, float("nan"), "abc"],
    "switch": ["abc", 2],
}


def cases_for(cfg: DictConfig, label: str = "") -> list[Case]:
    """Every generated bad case of one composed config (``label``: prefix of the ids, e.g. the model)."""
    from attnlab.runs.config_tree import BLOCK_GROUPS, used_groups

    unused = tuple(f"{g}." for g in set(BLOCK_GROUPS) - set(used_groups(cfg)))  # values no part reads
    out: list[Case] = []
    add = lambda kind, ov, tag: out.append(Case(f"{label}{kind}:{tag}", kind, tuple(ov)))  # noqa: E731
    for key, value in _leaves(cfg):
        if key.startswith(unused):
            continue
        kind = classify(key, value)
        if kind in BAD:
            for bad in BAD[kind]:
                add(kind, [f"{key}={_value(bad)}"], f"{key}={_value(bad)}")
        if kind == "size" and WIDTHS.match(key):
            add("size", [f"{key}=10000000"], f"{key}=10000000")  # cannot be allocated
        if kind == "name":
            if key.endswith("tags"):
                bads = ["['']", "['" + "x" * 65 + "']"]
            else:
                bads = ["nan", "''", "x" * 300] + (["a/b"] if NAMES[key] == "folder" else ["'a/b'"] if key.endswith(
                    "project") else [])
            for bad in bads:
                add("name", [f"{key}={bad}"], f"{key}={bad[:20]}")
        if not key.startswith(("hydra.", "paths.")):
            add("interpolation", [f"{key}=${{oc.env:{UNSET_ENV}}}"], f"{key}=env")
            add("interpolation", [f"{key}=${{{key}}}"], f"{key}=loop")
            add("interpolation", [f"{key}=${{no_such.key}}"], f"{key}=missing")
    for key, node in _parts(cfg):
        if key.startswith(unused):
            continue
        for op in ("+", "++"):
            add("override", [f"{op}{key}.no_such_argument=1"], f"{op}{key}.x")
        parent_key, leaf = key.rsplit(".", 1) if "." in key else ("", key)
        parent = OmegaConf.select(cfg, parent_key) if parent_key else None
        if isinstance(parent, DictConfig) and "_target_" in parent and leaf in _required(parent):
            add("override", [f"~{key}"], f"~{key}")
    return out


def _parts(cfg: DictConfig, prefix=""):
    for key in cfg.keys():
        full = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_interpolation(cfg, key) or full.startswith("hydra"):
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig):
            if "_target_" in child:
                yield full, child
            yield from _parts(child, full)


def _required(part: DictConfig) -> set[str]:
    from hydra.utils import get_object

    try:
        sig = inspect.signature(get_object(str(part._target_)))
    except Exception:  # noqa: BLE001
        return set()
    return {p.name for p in sig.parameters.values() if p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def apply(cfg: DictConfig, case: Case) -> DictConfig:
    """A copy of ``cfg`` with the case's overrides made as Hydra makes them (values parsed by Hydra's parser)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = cfg.copy()
    for text in case.overrides:
        ov = parser.parse_override(text)
        key = ov.key_or_group
        with open_dict(out):
            if ov.is_delete():
                parent_key, leaf = key.rsplit(".", 1) if "." in key else ("", key)
                parent = OmegaConf.select(out, parent_key) if parent_key else out
                del parent[leaf]
            else:
                OmegaConf.update(out, key, ov.value(), force_add=True, merge=False)
    return out


def sample(cases: list[Case], seen: set[str]) -> list[Case]:
    """A bounded, deterministic subset: every case of the small kinds (seed, name, switch, rate, positive,
    override, and the sizes that cannot be allocated); for a size one bad value per key, and an interpolation on
    every fourth leaf (its three forms in turn), rotating through them in generated order; a case whose overrides
    were already taken (a key every model shares) is left out. ``seen`` collects the overrides taken."""
    out, turn = [], {"size": 0, "interpolation": 0}
    for case in cases:
        text = " ".join(case.overrides)
        if text in seen:
            continue
        if case.kind in turn and not case.overrides[0].endswith("=10000000"):
            forms = len(BAD["size"]) if case.kind == "size" else 3  # bad values per key, in generated order
            item, form = divmod(turn[case.kind], forms)
            turn[case.kind] += 1
            every = 1 if case.kind == "size" else 4
            if item % every or form != (item // every) % forms:
                continue
        seen.add(text)
        out.append(case)
    return out


# --- the inference commands' options (conf/translate.yaml, generate.yaml, synthesize.yaml) ---

CLI_BAD = {int: ["abc", 1.5, -1], float: ["abc", "nan"], bool: ["abc", 2]}
CLI_TEXT_CHOICES = {"on_too_long", "input_errors", "device"}


def cli_cases(cfg: DictConfig, name: str) -> list[Case]:
    """Bad values of every option of an inference command: per type (an integer: text, a fraction, -1; a number:
    text, NaN; a switch: text, 2; a choice: an unknown word), its seed (text, a fraction, over 2**64), its
    task_name (a number, a slash), every option as an unresolvable interpolation, ``+`` of an option it does not
    have and ``~`` of one it has."""
    out: list[Case] = []
    add = lambda kind, ov: out.append(Case(f"{name}:{kind}:{ov}", kind, (ov,)))  # noqa: E731
    for key, value in _leaves(cfg):
        if key.startswith(("hydra", "paths.")) or key in ("ckpt", "ckpt_path", "text", "prompt", "input", "output",
                                                          "out_dir"):
            continue
        if key == "seed":
            for bad in ("abc", 1.5, 2**64):
                add("seed", f"seed={bad}")
        elif key == "task_name":
            for bad in ("nan", "a/b", "''"):
                add("name", f"task_name={bad}")
        elif key in CLI_TEXT_CHOICES:
            add("choice", f"{key}=no_such_choice")
        elif type(value) in CLI_BAD:
            for bad in CLI_BAD[type(value)]:
                if not (key in ("length_penalty",) and bad == -1):  # a negative length penalty is allowed
                    add(type(value).__name__, f"{key}={bad}")
        add("interpolation", f"{key}=${{oc.env:{UNSET_ENV}}}")
    add("override", "+no_such_option=1")
    add("override", "++no_such_option=1")
    first = next(k for k, v in _leaves(cfg) if not k.startswith(("hydra", "paths", "task_name")))
    add("override", f"~{first}")
    return out
