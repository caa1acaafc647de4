"""Run a claim's commands into ``outputs/claims/<id>/<i>/`` and turn them into ``docs/results/<id>.json`` + a figure.

``python train.py -m ...`` commands are run with this interpreter and get ``hydra.sweep.dir=<claim dir>/<i>``
appended (a fresh folder each time: an earlier run of the claim is moved aside to ``<id>.old-<time>``, never
deleted). A claim with ``seeds=N`` runs each setting with ``seed=0,…,N-1`` (appended to its train.py sweeps; the
page shows the commands as run) and compares settings with intervals over the seeds. ``--quick`` adds short limits
and the claim's tiny-model overrides (and two seeds where the claim has more), and writes the result next to the
runs instead of into docs/, so the tests can exercise the whole path in seconds without touching the page.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .base import Claim, Context

REPO = Path(__file__).resolve().parents[2]  # the repository: its train.py, docs/ and outputs/

# A few batches of one epoch: enough to go through fit, test, checkpoint and the analysis.
QUICK_LIMITS = ["trainer.max_epochs=1", "++trainer.max_steps=-1", "++trainer.limit_train_batches=3",
                "++trainer.limit_val_batches=1", "++trainer.limit_test_batches=1",
                "++trainer.num_sanity_val_steps=0", "++trainer.log_every_n_steps=1"]


class ClaimRunError(RuntimeError):
    pass


def with_seeds(command: str, seeds: int) -> str:
    """A ``python train.py -m ...`` command with ``seed=0,…,seeds-1`` appended (unless it sets a seed already):
    each setting of the sweep then runs with every seed."""
    args = shlex.split(command)
    if seeds <= 1 or args[1:2] != ["train.py"] or any(a.lstrip("+").startswith("seed=") for a in args):
        return command
    return f"{command} seed={','.join(map(str, range(seeds)))}"


def command_argv(command: str, sweep_dir: Path, extra: list[str]) -> list[str]:
    """The argv of one claim command: ``python`` is this interpreter; train.py sweeps go to ``sweep_dir``."""
    argv = shlex.split(command)
    if argv[0] != "python":
        raise ClaimRunError(f"claim commands start with 'python', got {command!r}")
    argv[0] = sys.executable
    if argv[1:2] == ["train.py"]:
        argv[1] = str(REPO / "train.py")
        return argv + extra + [f"hydra.sweep.dir={sweep_dir}"]
    return [a.replace("{dir}", str(sweep_dir)) for a in argv] + extra


def run_claim(claim: Claim, out: Path, docs: Path | None, quick: bool = False, analyze_only: bool = False,
              log=print) -> Path:
    """Run (unless ``analyze_only``) and analyze one claim; return the path of the result JSON."""
    claim_dir = out / claim.id
    seeds = min(claim.seeds, 2) if quick else claim.seeds  # --quick: two seeds, enough for an interval
    commands = [with_seeds(c, seeds) for c in claim.commands]  # what runs, and what the page shows
    start, load_before = time.time(), os.getloadavg()[0]
    if not analyze_only:
        if claim_dir.exists():
            claim_dir.rename(claim_dir.with_name(f"{claim.id}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
        claim_dir.mkdir(parents=True)
        env = {**os.environ, "WANDB_SILENT": "true", "HYDRA_FULL_ERROR": "0"}
        for i, command in enumerate(commands):
            is_train = command.split()[1:2] == ["train.py"]
            other = claim.quick if claim.quick_other is None else claim.quick_other
            extra = (QUICK_LIMITS + claim.quick if is_train else other) if quick else []
            argv = command_argv(command, claim_dir / str(i), extra)
            (claim_dir / str(i)).mkdir(exist_ok=True)
            log(f"[{claim.id}] {command}{' (quick)' if quick else ''}")
            with open(claim_dir / f"command{i}.log", "w") as f:
                proc = subprocess.run(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                last = (claim_dir / f"command{i}.log").read_text().strip().splitlines()[-1:] or [""]
                raise ClaimRunError(f"{claim.id}: command {i} failed (exit {proc.returncode}), see "
                                    f"{claim_dir}/command{i}.log; it ends: {last[0][-300:]}")
    minutes = (time.time() - start) / 60
    target = (docs / "results") if docs is not None and not quick else claim_dir
    target.mkdir(parents=True, exist_ok=True)
    figures = (docs / "figures") if docs is not None and not quick else claim_dir
    figures.mkdir(parents=True, exist_ok=True)
    figure = figures / f"{claim.id}.png"
    result = claim.analyze(Context(claim, claim_dir, figure, quick, out))
    if not figure.is_file():
        raise ClaimRunError(f"{claim.id}: the analysis drew no figure at {figure}")
    record = {
        "id": claim.id, "title": claim.title, "statement": claim.statement, "commands": commands, "seeds": seeds,
        "rows": result.rows, "headline": result.headline, "verdict": result.verdict, "evidence": result.evidence,
        "notes": result.notes, "figure": os.path.relpath(figure, target.parent if target.name == "results" else target),
        "minutes": None if analyze_only else round(minutes, 1), "quick": quick,
        # the machine's 1-minute load average before and after: wall times on a busy shared CPU are not idle times
        "load": None if analyze_only else [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "date": time.strftime("%Y-%m-%d"), "machine": machine(), "git": git_commit(),
    }
    path = target / f"{claim.id}.json"
    if analyze_only and path.is_file():  # re-analyzing old runs: keep the wall time measured when they ran
        before = json.loads(path.read_text())
        record["minutes"], record["load"] = before.get("minutes"), before.get("load")
    path.write_text(json.dumps(record, indent=1) + "\n")
    log(f"[{claim.id}] {result.verdict}: {result.headline}")
    return path


def machine() -> str:
    import torch

    return f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None
