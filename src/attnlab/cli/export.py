"""Export a trained model: ``python -m attnlab.export ckpt=<checkpoint> out=<folder> [format=hf] [dtype=bf16]``.

The checkpoint is read as every entry point reads one (the trusted read, the task built and its weights loaded
strictly, an older layout's names upgraded), then written as a folder with no pickle in it
(:mod:`attnlab.checkpoints.exported`) that every entry point loads where it loads a checkpoint, or (``format=hf``:
a causal or masked language model, a ViT) as a Hugging Face ``transformers`` folder
(:mod:`attnlab.checkpoints.hf_layouts`). Options and the
output folder are checked before the checkpoint is read; nothing is written unless the whole export is.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ..runs import resume  # noqa: F401  (registers the resume_dir resolver that conf/hydra's run dir uses)
from ..checkpoints.exported import DTYPES, WEIGHTS, hf_layout, write_exported, write_hf
from ..checkpoints.hf_layouts import LAYOUTS
from ..checkpoints.read import checkpoint_file
from ..core.errors import OutputError, one_line_errors
from ..core.paths import CONF_DIR
from .hydra_errors import one_line_hydra_errors
from .input import check

log = logging.getLogger(__name__)

FORMATS = ("safetensors", "hf")


def check_options(cfg: DictConfig) -> Path:
    """Every option, before the checkpoint is read; the output folder."""
    check(cfg, "ckpt", lambda v: isinstance(v, str) and v, "the path of a checkpoint (ckpt=<run>/checkpoints/last.ckpt)")
    check(cfg, "out", lambda v: isinstance(v, str) and v, "a new folder for the exported model (out=exports/<name>)")
    check(cfg, "format", lambda v: v in FORMATS, " | ".join(FORMATS))
    check(cfg, "dtype", lambda v: v in DTYPES, " | ".join(DTYPES))
    check(cfg, "layout", lambda v: v in ("auto", *LAYOUTS), " | ".join(("auto", *LAYOUTS)))
    out = Path(cfg.out).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputError(f"out={cfg.out} is a file, not a folder: choose a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise OutputError(f"out={cfg.out} already holds files: choose a new folder (nothing is overwritten)")
    return out


def export(ckpt: str | Path, out: Path, dtype: str = "fp32", format: str = "safetensors",
           layout: str = "auto") -> list[Path]:
    """The model of checkpoint ``ckpt`` written to ``out`` in today's layout; the files written."""
    from ..checkpoints.read import read_trusted
    from ..checkpoints.upgrade import upgrade_net_config
    from ..runs.load import load_task

    trusted = read_trusted(ckpt)  # the one read
    if format == "hf":  # a model of no layout, or parts that do not fit: one line before Lightning is imported
        net = (trusted.hyper_parameters or {}).get("net")
        hf_layout(upgrade_net_config(net) if isinstance(net, dict) else {}, layout)
    task, contents = load_task(ckpt, "attnlab.tasks.base.Task", "attnlab", trusted=trusted)
    upgraded = {**contents, "hyper_parameters": dict(task.hparams), "state_dict": task.state_dict()}
    if format == "hf":
        written, chosen = write_hf(upgraded, out, layout, dtype)
        loader = {"vit": "AutoModelForImageClassification", "bert": "AutoModelForMaskedLM"}.get(chosen,
                                                                                               "AutoModelForCausalLM")
        log.info(f"format=hf: the {chosen} layout ({loader}.from_pretrained('{out}') loads it)")
        return written
    return write_exported(upgraded, out, dtype)


_job_started = False  # Hydra's errors before the job (a bad override) are one line, exit 2 (hydra_errors.py)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="export")
def _main(cfg: DictConfig) -> None:
    global _job_started
    _job_started = True
    with one_line_errors(log):
        out = check_options(cfg)
        checkpoint_file(cfg.ckpt)
        written = export(cfg.ckpt, out, cfg.dtype, cfg.format, cfg.layout)
        size = (out / WEIGHTS).stat().st_size / 2**20
        log.info(f"exported {cfg.ckpt} as {cfg.format} ({cfg.dtype} weights, {size:.1f} MiB): "
                 f"{', '.join(p.name for p in written)}")
        print(out)


def main() -> None:
    one_line_hydra_errors(_main, lambda: _job_started)


if __name__ == "__main__":
    main()
