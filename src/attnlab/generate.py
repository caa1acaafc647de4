"""Sample text from a trained causal LM checkpoint: ``python generate.py ckpt_path=... prompt="..."``.

The checkpoint carries everything needed: the task class, its model config (hyper-parameters) and the tokenizer.
Samples are printed and written to ``samples.txt`` in this command's run directory.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .checkpoints import CheckpointError
from .checkpoints import load_task as load_checkpoint
from .data.tokenizer import BPETokenizer
from .paths import CONF_DIR

log = logging.getLogger(__name__)


def load_task(ckpt_path: str | Path, device: str = "cpu"):
    """(task, tokenizer) from a language-model checkpoint written by train.py; one-line errors for a wrong file."""
    from .tasks.causal_lm import CausalLMTask

    task, ckpt = load_checkpoint(ckpt_path, CausalLMTask, "language-model", device)
    return task, BPETokenizer.from_str(ckpt["tokenizer"])


def sample_texts(task, tokenizer: BPETokenizer, prompt: str, *, num_samples: int, max_new_tokens: int,
                 temperature: float, top_k: int | None, top_p: float | None, use_cache: bool = True,
                 seed: int = 0) -> list[str]:
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    prefix = torch.tensor([ids] * num_samples, device=task.device)
    gen = torch.Generator(device=task.device).manual_seed(seed)
    out = task.sample(prefix, max_new_tokens, use_cache=use_cache, temperature=temperature,
                      top_k=top_k or None, top_p=top_p or None, generator=gen,
                      vocab_size=tokenizer.vocab_size)
    return [tokenizer.decode(row.tolist()) for row in out]


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
def _main(cfg: DictConfig) -> None:
    try:
        task, tokenizer = load_task(cfg.ckpt_path, cfg.device)
    except CheckpointError as e:
        log.error(str(e))
        sys.exit(2)
    texts = sample_texts(task, tokenizer, cfg.prompt, num_samples=cfg.num_samples,
                         max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                         top_p=cfg.top_p, use_cache=cfg.use_cache, seed=cfg.seed)
    out = Path(HydraConfig.get().runtime.output_dir) / "samples.txt"
    sep = "\n" + "-" * 80 + "\n"
    out.write_text(sep.join(texts) + "\n")
    for i, t in enumerate(texts):
        print(f"--- sample {i} ---\n{t}")
    log.info(f"samples written to {out}")


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
