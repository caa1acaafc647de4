"""Helpers for tests that compose the real configs or run the real entry points."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import attnlab.runs.resume
from attnlab.core.paths import CONF_DIR, ROOT
from preloaded_python import run as run_python


_COMPOSED: dict[tuple, DictConfig] = {}  # the same command line composed again in this process: a copy (~0.3 s saved)


def compose_train(overrides: list[str], output_dir: Path | str, cache_dir: str | None = None) -> DictConfig:
    """conf/train.yaml composed as `python train.py <overrides>` would, with its outputs in ``output_dir``."""
    key = (tuple(overrides), os.getcwd(), tuple((str(p), p.stat().st_mtime_ns) for p in sorted(CONF_DIR.rglob("*"))))
    if key not in _COMPOSED:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            _COMPOSED[key] = compose("train", overrides=overrides, return_hydra_config=True)
    cfg = copy.deepcopy(_COMPOSED[key])
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        if cache_dir:
            cfg.paths.cache_dir = cache_dir
        del cfg["hydra"]
    return cfg


def perturbed_task(cfg: DictConfig):
    """The task ``cfg`` builds, at seed 0 with every norm weight and bias moved off its 1 / 0 start (so that a
    misplaced one shows in a weight converter's round trip), in eval mode, and its checkpoint contents."""
    import torch
    from omegaconf import OmegaConf

    from attnlab.runs.build import build_model

    torch.manual_seed(0)
    task = build_model(cfg.model).eval()
    with torch.no_grad():
        for p in task.net.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return task, {"hyper_parameters": {"net": OmegaConf.to_container(cfg.model.net, resolve=True)},
                  "state_dict": task.state_dict()}


def load_factor() -> float:
    """How many times longer than on an idle machine a process may take to get going now: the 1-minute load average
    per core, at least 1 (two cores at load 8: 4). The suite runs beside other jobs; a start-up measured idle is
    that many times slower when every core is shared."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


class Deadline:
    """A wait for a started process to reach a phase (training under way, its processes gone): ``seconds`` is what
    it needs on an idle machine, stretched by :func:`load_factor`. The factor is read again at every check and
    the largest kept: the 1-minute load average lags a suite that has just become busy."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()
        self.factor = load_factor()

    def passed(self) -> bool:
        self.factor = max(self.factor, load_factor())
        return time.monotonic() - self.start > self.seconds * self.factor

    def __str__(self) -> str:
        return f"{self.seconds:g} s × load factor {self.factor:.1f}"


def run_cli(args: list[str], cache_dir: str | None = None, timeout: int = 300,
            script: str = "train.py", env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run an entry point from the repository root as a user would; stdout and stderr captured together.
    ``script``: a file, or ``-m <module>``; ``env``: extra environment variables; ``stdin``: its input."""
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("PYTEST_XDIST_WORKER", None)
    if cache_dir:
        env["ATTNLAB_CACHE"] = cache_dir
    return run_python([sys.executable, *script.split(" ", 1), *args], cwd=ROOT, env=env, timeout=timeout,
                      input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_entry(args: list[str], cache_dir: str | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    """:func:`run_cli` of a command line as typed: ``[script, *args]`` or ``["-m", module, *args]``."""
    if args[0] == "-m":
        return run_cli(args[2:], cache_dir, script=f"-m {args[1]}", stdin=stdin)
    return run_cli(args[1:], cache_dir, script=args[0], stdin=stdin)


def exactly_equal(a, b) -> bool:
    """Nested containers of tensors and plain values (checkpoint contents), compared exactly: tensors bit for bit
    with their dtype, containers of the same type."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(exactly_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(exactly_equal(x, y) for x, y in zip(a, b))
    return a == b


def run_bench_quick(only: str, cache_dir: str | None = None) -> str:
    """``python -m bench --quick --only <only>`` from the repository root, one thread, one repeat; its output
    (the run must succeed). ``cache_dir``: the data cache of the comparisons that train (ATTNLAB_CACHE)."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, **({"ATTNLAB_CACHE": cache_dir} if cache_dir else {})}
    out = run_python([sys.executable, "-m", "bench", "--quick", "--only", only, "--threads", "1", "--repeats", "1"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout
    return out.stdout


def explorer_data(run_dir: Path | str) -> dict:
    """The JSON inside a run's attention explorer page (``<run>/attention/explorer.html``)."""
    from attnlab.explorer.page import read_payload

    return read_payload(Path(run_dir) / "attention" / "explorer.html")


def wandb_html_keys(run_dir: Path | str) -> set[str]:
    """The keys of the HTML media an offline W&B run under ``run_dir`` logged (media/html/<key>_<step>_<hash>.html)."""
    (run,) = (Path(run_dir) / "wandb").glob("offline-run-*")
    return {p.parent.name + "/" + p.name.rsplit("_", 2)[0] for p in run.glob("files/media/html/**/*.html")}
