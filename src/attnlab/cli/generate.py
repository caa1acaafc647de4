"""Sample text from a trained causal LM checkpoint: ``python generate.py ckpt=... prompt="..."``.

The checkpoint carries everything needed: the task class, its model config (hyper-parameters) and the tokenizer.
Samples are printed and written to ``samples.txt`` in this command's run directory. Every option is checked before
the checkpoint is read; a bad one is one line naming it (exit 2). ``ckpt_path=`` is the old name of ``ckpt=``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..runs import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from ..runs.load import load_task as load_checkpoint
from .input import DEVICE_HELP, THREADS_HELP, Progress, apply_threads, check, is_device, is_int, is_seed, is_threads
from ..data.tokenizer import BPETokenizer
from ..decoding.options import SamplingOptions
from ..core.errors import OptionError, one_line_errors
from .hydra_errors import one_line_hydra_errors
from ..core.paths import CONF_DIR

log = logging.getLogger(__name__)


def load_task(ckpt_path: str | Path, device: str = "cpu"):
    """(task, tokenizer) from a language-model checkpoint written by train.py; one-line errors for a wrong file."""
    task, _ = load_checkpoint(ckpt_path, "attnlab.tasks.causal_lm.CausalLMTask", "language-model", device)
    return task, task.tokenizer


def sample_texts(task, tokenizer: BPETokenizer, prompt: str, options: SamplingOptions, *, num_samples: int,
                 use_cache: bool = True, seed: int = 0, batch_size: int = 64) -> list[str]:
    """``num_samples`` continuations of ``prompt`` as a list (:func:`iter_samples`)."""
    return list(iter_samples(task, tokenizer, prompt, options, num_samples=num_samples, use_cache=use_cache,
                             seed=seed, batch_size=batch_size))


def iter_samples(task, tokenizer: BPETokenizer, prompt: str, options: SamplingOptions, *, num_samples: int,
                 use_cache: bool = True, seed: int = 0, batch_size: int = 64) -> Iterator[str]:
    """``num_samples`` continuations of ``prompt``, sampled as ``options`` say (``max_new_tokens``, ``temperature``,
    ``top_k``, ``top_p``), ``batch_size`` at a time from one generator, each batch yielded as soon as it is drawn,
    with a progress line every few seconds: ``num_samples=100000000`` streams instead of allocating every prefix
    at once."""
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    gen = torch.Generator(device=task.device).manual_seed(seed)
    progress = Progress(num_samples, "samples", log=log)
    for start in range(0, num_samples, batch_size):
        n = min(batch_size, num_samples - start)
        prefix = torch.tensor([ids] * n, device=task.device)
        out = task.sample(prefix, options, use_cache=use_cache, generator=gen, vocab_size=tokenizer.vocab_size)
        yield from (tokenizer.decode(row.tolist()) for row in out)
        progress.update(start + n)


def checkpoint_option(cfg: DictConfig) -> str:
    """``ckpt=``, or the old ``ckpt_path=`` with a note to use ``ckpt=`` (the name translate and synthesize take)."""
    ckpt, old = cfg.get("ckpt"), cfg.get("ckpt_path")
    if old is not None:
        if ckpt is not None and str(ckpt) != str(old):
            raise OptionError(f"ckpt={ckpt} and ckpt_path={old} name different checkpoints: give ckpt= only")
        log.warning("ckpt_path= is the old name of this option: use ckpt= (as translate.py and synthesize.py do)")
        ckpt = old
    return str(check({"ckpt": ckpt}, "ckpt", lambda v: isinstance(v, str) and v,
                     "the path of a language-model checkpoint (ckpt=<run>/checkpoints/last.ckpt)"))


def check_options(cfg: DictConfig) -> SamplingOptions:
    """Every sampling option, before the checkpoint is read: one line naming the first bad one. The
    :class:`SamplingOptions` (max_new_tokens, temperature, top_k, top_p) check themselves."""
    check(cfg, "prompt", lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool),
          "text (quote it: prompt='\"The for statement\"')")
    check(cfg, "num_samples", lambda v: is_int(v) and v >= 1, "an integer >= 1")
    check(cfg, "batch_size", lambda v: is_int(v) and v >= 1, "an integer >= 1")
    options = SamplingOptions.from_config(cfg)
    check(cfg, "use_cache", lambda v: isinstance(v, bool), "true or false")
    check(cfg, "seed", is_seed, "an integer from -2**63 to 2**64 - 1")
    check(cfg, "device", is_device, DEVICE_HELP)
    check(cfg, "threads", is_threads, THREADS_HELP)
    return options


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
def _main(cfg: DictConfig) -> None:
    global _job_started
    _job_started = True
    with one_line_errors(log):
        ckpt = checkpoint_option(cfg)
        options = check_options(cfg)
        apply_threads(cfg, log)
        task, tokenizer = load_task(ckpt, cfg.device)
        texts = iter_samples(task, tokenizer, str(cfg.prompt), options, num_samples=cfg.num_samples,
                             use_cache=cfg.use_cache, seed=cfg.seed, batch_size=cfg.batch_size)
        out = Path(HydraConfig.get().runtime.output_dir) / "samples.txt"
        sep = "-" * 80 + "\n"
        with open(out, "w", encoding="utf-8") as f:  # (this command's new run folder) each sample as it comes
            for i, t in enumerate(texts):
                f.write((sep if i else "") + t + "\n")
                print(f"--- sample {i} ---\n{t}", flush=True)
        log.info(f"samples written to {out}")


_job_started = False  # Hydra's errors before the job (a bad override) are one line, exit 2 (hydra_errors.py)


def main() -> None:
    one_line_hydra_errors(_main, lambda: _job_started)


if __name__ == "__main__":
    main()
