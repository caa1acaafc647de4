"""The attention explorer for any input: ``python -m attnlab.explore ckpt=... text="..."`` (``image=`` for a ViT).

Loads any attnlab checkpoint, runs the input its family reads (the registry's ``explorer_input``: a sentence to
translate, text, an image file, text to speak, token ids) through the model with the attention weights captured
(:mod:`attnlab.cli.explore_inputs`) and writes the same self-contained page that training
writes per run (``attention/explorer.html``), here to ``out=`` or ``<run dir>/explorer.html``; prints its path.
Options and the input are checked before the checkpoint is read; a bad one is one line naming it (exit 2).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..runs import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from ..checkpoints.read import checkpoint_file
from ..runs.load import load_task
from .input import THREADS_HELP, apply_threads, check, check_output, is_threads
from ..core.errors import InputError, one_line_errors
from ..core.paths import CONF_DIR

log = logging.getLogger(__name__)


def _is_text(v) -> bool:
    return v is None or (isinstance(v, (str, int, float)) and not isinstance(v, bool))


def check_options(cfg: DictConfig) -> None:
    """Every option, before the checkpoint is read: one line naming the first bad one."""
    check(cfg, "ckpt", lambda v: isinstance(v, str) and v, "the path of a checkpoint (ckpt=<run>/checkpoints/last.ckpt)")
    check(cfg, "text", _is_text, "text (quote it: text='\"two thousand and six\"')")
    check(cfg, "target", _is_text, "the translation to look at, as text (null: the model's own)")
    check(cfg, "image", lambda v: v is None or isinstance(v, str), "the path of an image file")
    if cfg.get("text") is None and cfg.get("image") is None:
        raise InputError("give the input: text=\"...\" (translation, language models, text-to-speech; token ids "
                         "\"3 17 5 9\" for a sequence classifier) or image=<file> (Vision Transformer)")
    if cfg.get("image") is not None and not Path(str(cfg.image)).expanduser().is_file():
        raise InputError(f"image={cfg.image}: no such file")
    check_output("out", cfg.get("out"))
    check(cfg, "threads", is_threads, THREADS_HELP)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="explore")
def _main(cfg: DictConfig) -> None:
    with one_line_errors(log):
        check_options(cfg)
        checkpoint_file(cfg.ckpt)
        apply_threads(cfg, log)
        task, ckpt = load_task(cfg.ckpt, "attnlab.tasks.base.Task", "attnlab", cfg.device)
        from ..explorer import write_page
        from .explore_inputs import record_for_input

        title = f"{type(task).__name__} · {Path(cfg.ckpt).name}"
        record = record_for_input(task, ckpt, text=cfg.get("text"), target=cfg.get("target"),
                                  image=cfg.get("image"), title=title)
        out = Path(cfg.out).expanduser() if cfg.get("out") else \
            Path(HydraConfig.get().runtime.output_dir) / "explorer.html"
        print(write_page(record.payload(), out))


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
