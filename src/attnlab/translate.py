"""Translate sentences with a trained checkpoint: ``echo "twenty-one" | translate ckpt=...`` (or ``python translate.py``).

Reads one sentence per line from ``input`` (a file) or stdin, writes one translation per line to ``output`` or
stdout (logging goes to stderr and the run directory, so stdout holds translations only). With ``n_best`` > 1 each
input gets ``n_best`` lines ``<input index>\\t<rank>\\t<score>\\t<translation>``. Beam size, n-best, length penalty
and the maximum length (a · source tokens + b) are options; the checkpoint carries model, tokenizer and settings.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from .checkpoints import CheckpointError, load_task
from .paths import CONF_DIR
from . import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)

log = logging.getLogger(__name__)


def encode_sources(task, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, src_mask) for raw sentences, encoded the way the model was trained (joint BPE, + <eos>)."""
    from .data.translation_datamodule import encode_sources as encode

    src, mask = encode(task.tokenizer, texts, task.src_eos)
    return src.to(task.device), mask.to(task.device)


def translate_lines(task, lines: list[str], *, beam_size: int = 5, n_best: int = 1, length_penalty: float = 1.0,
                    max_len_a: float = 2.0, max_len_b: int = 10, batch_size: int = 32) -> list[list[tuple[str, float]]]:
    """For each line, its ``n_best`` translations with their length-penalized scores, best first."""
    from .tasks.translation import decode_text

    max_src = getattr(task.net, "max_len", None)
    out: list[list[tuple[str, float]]] = []
    for i in range(0, len(lines), batch_size):
        chunk = lines[i : i + batch_size]
        src, mask = encode_sources(task, chunk)
        if max_src is not None and src.shape[1] > max_src:
            j = int(mask.sum(1).argmax())
            raise ValueError(f"input line {i + j + 1} has {src.shape[1]} tokens; this model reads at most {max_src}")
        res = task.translate_batch(src, mask, beam_size=beam_size, n_best=n_best, length_penalty=length_penalty,
                                   max_len_a=max_len_a, max_len_b=max_len_b)
        for b in range(len(chunk)):
            out.append([(decode_text(task.tokenizer, ids), float(res.scores[b, r]))
                        for r, ids in enumerate(res.tokens[b])])
    return out


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="translate")
def _main(cfg: DictConfig) -> None:
    from .tasks.translation import TranslationTask

    try:
        task, _ = load_task(cfg.ckpt, TranslationTask, "translation", cfg.device)
        if cfg.input:
            src = Path(cfg.input)
            if not src.is_file():
                raise CheckpointError(f"input file not found: {src.resolve()}")
            lines = src.read_text(encoding="utf-8").splitlines()
        else:
            lines = sys.stdin.read().splitlines()
        lines = [line.strip() for line in lines]
        if not any(lines):
            raise ValueError("no input sentences (give input=<file> or pipe text into stdin)")
        results = translate_lines(task, lines, beam_size=cfg.beam_size, n_best=cfg.n_best,
                                  length_penalty=cfg.length_penalty, max_len_a=cfg.max_len_a,
                                  max_len_b=cfg.max_len_b, batch_size=cfg.batch_size)
    except (CheckpointError, ValueError, UnicodeDecodeError) as e:
        log.error(str(e).splitlines()[0])
        sys.exit(2)
    if cfg.n_best == 1:
        text = "".join(hyps[0][0] + "\n" for hyps in results)
    else:
        text = "".join(f"{i}\t{r}\t{score:.4f}\t{t}\n" for i, hyps in enumerate(results)
                       for r, (t, score) in enumerate(hyps))
    if cfg.output:
        Path(cfg.output).write_text(text, encoding="utf-8")
        log.info(f"{len(results)} translations written to {cfg.output}")
    else:
        sys.stdout.write(text)


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
