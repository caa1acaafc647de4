"""Translate sentences with a trained checkpoint: ``echo "twenty-one" | translate ckpt=...`` (or ``python translate.py``).

Reads one sentence per line from ``input`` (a file) or stdin, writes one translation per line to ``output`` or
stdout (logging goes to stderr and the run directory, so stdout holds translations only). With ``n_best`` > 1 each
input gets ``n_best`` lines ``<input index>\\t<rank>\\t<score>\\t<translation>``. Beam size, n-best, length penalty
and the maximum length (a · source tokens + b) are options; the checkpoint carries model, tokenizer and settings.

A line longer than the model reads (its position table) does not stop the others: ``on_too_long=skip`` (default)
leaves its output line empty and exits with :data:`EXIT_SKIPPED`, ``truncate`` translates its first tokens,
``error`` stops before translating anything (exit 2). Input is read as bytes: a line that is not UTF-8 is named
(exit 2), or its bad bytes replaced with ``input_errors=replace``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from ..runs import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from ..checkpoints.read import checkpoint_file
from ..runs.load import load_task
from .input import (
    DEVICE_HELP,
    THREADS_HELP,
    Progress,
    apply_threads,
    check,
    check_output,
    is_device,
    is_int,
    is_threads,
    read_lines,
    write_output,
)
from ..decoding.options import DecodingOptions
from ..core.errors import InputError, InputTooLongError, OptionError, one_line_errors
from .hydra_errors import one_line_hydra_errors
from ..core.paths import CONF_DIR

log = logging.getLogger(__name__)

# Exit status when every line was read but some were too long and left untranslated (documented in translate.yaml)
EXIT_SKIPPED = 3
ON_TOO_LONG = ("skip", "truncate", "error")


@dataclass
class Translations:
    """Per input line its ``n_best`` (translation, score) pairs, best first; ``[]`` for a skipped line."""

    hyps: list[list[tuple[str, float]]]
    skipped: list[int] = field(default_factory=list)  # 1-based line numbers left untranslated (too long)
    truncated: list[int] = field(default_factory=list)  # 1-based line numbers translated from their first tokens
    max_tokens: int | None = None  # what the model reads (with <eos>); None: no limit


def encode_sources(task, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, src_mask) for raw sentences, encoded the way the model was trained (joint BPE, + <eos>)."""
    from ..data.translation_datamodule import encode_sources as encode

    src, mask = encode(task.tokenizer, texts, task.src_eos)
    return src.to(task.device), mask.to(task.device)


def _batch(task, token_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, src_mask) for already-encoded sentences (+ <eos> when the model was trained with it)."""
    from ..data.translation_datamodule import source_batch

    src, mask = source_batch(token_ids, task.tokenizer, task.src_eos)
    return src.to(task.device), mask.to(task.device)


def translate_all(task, lines: list[str], options: DecodingOptions, *, batch_size: int = 32,
                  on_too_long: str = "skip") -> Translations:
    """Translate every line the model can read with ``options``; what happens to a longer one is ``on_too_long``."""
    from ..tasks.translation import decode_text

    if on_too_long not in ON_TOO_LONG:
        raise OptionError(f"on_too_long={on_too_long!r} is not allowed: one of {', '.join(ON_TOO_LONG)}")
    max_src = getattr(task.net, "max_len", None)
    extra = 1 if task.src_eos else 0
    ids = [list(x) for x in task.tokenizer.encode_batch(list(lines))] if lines else []
    out = Translations([[] for _ in lines], max_tokens=max_src)
    todo: list[int] = []
    for i, seq in enumerate(ids):
        if max_src is not None and len(seq) + extra > max_src:
            if on_too_long == "error":
                raise InputTooLongError(f"input line {i + 1} has {len(seq) + extra} tokens; this model reads at most "
                                        f"{max_src} (on_too_long=skip or truncate translates the other lines)")
            if on_too_long == "skip":
                out.skipped.append(i + 1)
                continue
            ids[i] = seq[: max_src - extra]
            out.truncated.append(i + 1)
        todo.append(i)
    progress = Progress(len(todo), "translated lines", log=log)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        src, mask = _batch(task, [ids[i] for i in chunk])
        res = task.translate_batch(src, mask, options)
        for b, i in enumerate(chunk):
            out.hyps[i] = [(decode_text(task.tokenizer, t), float(res.scores[b, r]))
                           for r, t in enumerate(res.tokens[b])]
        progress.update(start + len(chunk))
    return out


def check_beam(task, options: DecodingOptions) -> None:
    """A beam wider than the model's vocabulary holds no more distinct hypotheses at the first step and costs
    beam_size model rows per sentence at every step (``beam_size=100000`` ran for hours): refused in one line."""
    vocab = getattr(task.net, "vocab_size", None) or getattr(task.tokenizer, "vocab_size", None)
    if isinstance(vocab, int) and options.beam_size > vocab:
        raise OptionError(f"beam_size={options.beam_size} is wider than this model's vocabulary ({vocab} tokens): "
                          f"a beam holds at most that many different first tokens; choose beam_size <= {vocab} "
                          f"(1 = greedy, 5 is usual)")


def translate_lines(task, lines: list[str], options: DecodingOptions | None = None, *,
                    batch_size: int = 32) -> list[list[tuple[str, float]]]:
    """For each line, its ``n_best`` translations with their length-penalized scores, best first (a line longer
    than the model reads is an error here: callers in code pass lines they control). ``options``: translate.yaml's
    defaults (beam 5) if None."""
    options = options or DecodingOptions(beam_size=5)
    return translate_all(task, lines, options, batch_size=batch_size, on_too_long="error").hyps


def check_options(cfg: DictConfig) -> DecodingOptions:
    """Every option's value, before the checkpoint is read: one line naming the first bad one. The decoding
    options (beam_size, n_best, length_penalty, max_len_a/b, force_eos_at_max_len) check themselves."""
    check(cfg, "ckpt", lambda v: isinstance(v, str) and v,
          "the path of a checkpoint (ckpt=<run>/checkpoints/last.ckpt)")
    options = DecodingOptions.from_config(cfg)
    check(cfg, "batch_size", lambda v: is_int(v) and v >= 1, "an integer >= 1")
    check(cfg, "on_too_long", lambda v: v in ON_TOO_LONG, "skip (empty output line, exit 3), truncate or error")
    check(cfg, "input_errors", lambda v: v in ("strict", "replace"), "strict or replace")
    check_output("output", cfg.get("output"))
    check(cfg, "device", is_device, DEVICE_HELP)
    check(cfg, "threads", is_threads, THREADS_HELP)
    return options


def format_translations(result: Translations, n_best: int) -> str:
    if n_best == 1:  # one line per input line, empty for a skipped one
        return "".join((hyps[0][0] if hyps else "") + "\n" for hyps in result.hyps)
    return "".join(f"{i}\t{r}\t{score:.4f}\t{t}\n" for i, hyps in enumerate(result.hyps)
                   for r, (t, score) in enumerate(hyps))


def _numbers(lines: list[int], shown: int = 20) -> str:
    more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
    return ", ".join(map(str, lines[:shown])) + more


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="translate")
def _main(cfg: DictConfig) -> None:
    global _job_started
    _job_started = True
    with one_line_errors(log):
        _translate(cfg)


_job_started = False  # Hydra's errors before the job (a bad override) are one line, exit 2 (hydra_errors.py)


def _translate(cfg: DictConfig) -> None:
    options = check_options(cfg)
    # the input before the model: a bad input is reported without waiting for the model to load (seconds, most of
    # it importing Lightning); a missing checkpoint before waiting on stdin
    checkpoint_file(cfg.ckpt)
    lines, name = read_lines(cfg.input or None, cfg.input_errors)
    lines = [line.strip() for line in lines]
    if not any(lines):
        raise InputError(f"no input sentences in {name} (give input=<file> or pipe text into stdin)")
    apply_threads(cfg, log)
    task, _ = load_task(cfg.ckpt, "attnlab.tasks.translation.TranslationTask", "translation", cfg.device)
    check_beam(task, options)
    result = translate_all(task, lines, options, batch_size=cfg.batch_size, on_too_long=cfg.on_too_long)
    text = format_translations(result, cfg.n_best)
    if cfg.output:
        write_output("output", Path(cfg.output).expanduser(), lambda p: p.write_text(text, encoding="utf-8"))
        written = sum(len(h) for h in result.hyps) if cfg.n_best > 1 else len(lines) - len(result.skipped)
        best = f" ({cfg.n_best}-best of {len(lines) - len(result.skipped)} lines)" if cfg.n_best > 1 else ""
        log.info(f"{written} translations{best} written to {cfg.output}")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if result.truncated:
        log.warning(f"{name}: translated the first {result.max_tokens} tokens only of line(s) "
                    f"{_numbers(result.truncated)} (longer than this model reads)")
    if result.skipped:
        log.error(f"{name}: skipped {len(result.skipped)} of {len(lines)} lines longer than this model reads "
                  f"({result.max_tokens} tokens): line(s) {_numbers(result.skipped)}; their output lines are empty "
                  f"(on_too_long=truncate translates their first tokens)")
        sys.exit(EXIT_SKIPPED)


def main() -> None:
    one_line_hydra_errors(_main, lambda: _job_started)


if __name__ == "__main__":
    main()
