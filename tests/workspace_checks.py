"""Checks on a real sweep's W&B workspace and offline runs, shared by the sweeps that tests already pay for
(tests/test_train.py's DDP sweep) and tests/test_workspace.py's own (slow) one."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnlab.core.paths import ROOT
from attnlab.runs.history import read_wandb_file, wandb_offline_runs
from attnlab.runs.config_tree import flatten


def _no_network_prefix() -> list[str]:
    """``unshare -n`` (a network namespace with no interface up) where the machine allows one."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"]
    return []


def logged_scalar_keys(job_dir: Path) -> set[str]:
    """Every numeric key of the job's W&B history records (W&B's own reader; not the summary the workspace uses)."""
    keys: set[str] = {"trainer/global_step"}  # read_wandb_file turns it into each row's "step"
    for path in wandb_offline_runs(job_dir):
        keys |= {k for row in read_wandb_file(path) for k in row} - {"step"}
    return keys


def logged_media_keys(job_dir: Path) -> set[str]:
    """Media keys with a file in the offline run: ``files/media/<kind>/<key>_<step>_<hash>.<ext>``."""
    keys = set()
    for run in job_dir.glob("wandb/offline-run-*/files/media"):
        for f in run.rglob("*"):
            m = re.fullmatch(r"(.+)_\d+_[0-9a-f]+(\.table\.json|\.png|\.wav|\.html)", f.relative_to(run).as_posix())
            if m:
                keys.add(m.group(1).split("/", 1)[1])  # without the kind folder (images/, table/, audio/, html/)
    return keys


def leet_summary(job_dir: Path) -> str:
    """The README's command: ``wandb leet inspect --summary <run>/wandb`` (its text view, stdout not a terminal)."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--summary", str(job_dir / "wandb")],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def check_leet_opens(job_dir: Path) -> None:
    """`wandb leet inspect --summary` opens the project's offline run: its state and the final metrics as logged."""
    text = leet_summary(job_dir)
    assert re.search(r"^state\s+finished", text, re.M), text[:2000]
    metrics = json.loads((job_dir / "metrics.json").read_text())
    for key in ("val/loss", "perf/tokens_per_sec"):
        m = re.search(rf"^\s+{re.escape(key)}\s+(\S+)$", text, re.M)
        assert m, (key, text[:3000])
        assert float(m.group(1)) == pytest.approx(metrics[key], rel=1e-6)


def check_sweep_workspace(sweep: Path, grouped_by: dict[str, list[str]], n_runs: int, seeds: bool = False) -> dict:
    """``python -m attnlab.workspace <sweep>`` with no network: the saved definition's panels name only keys the runs
    logged, are grouped by the config keys ``grouped_by`` expects, and have the review, curve, MFU/throughput and
    attention-map panels. Returns the saved definition."""
    pytest.importorskip("wandb_workspaces", reason="the wandb-workspaces extra (in dev) is not installed")
    from attnlab.cli.workspace import named_keys

    out = subprocess.run([*_no_network_prefix(), sys.executable, "-m", "attnlab.workspace", str(sweep)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert f"{n_runs} run(s)" in out.stdout
    for key, config_keys in grouped_by.items():
        assert f"{key} -> {', '.join(config_keys)}" in out.stdout, out.stdout
    assert f"python -m attnlab.workspace {sweep} --publish" in out.stdout
    assert f"wandb sync {sweep}/*/wandb/offline-run-*" in out.stdout
    view = json.loads((sweep / "wandb_workspace.json").read_text())

    jobs = sorted(p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml"))
    scalars = set().union(*(logged_scalar_keys(j) for j in jobs))
    media = set().union(*(logged_media_keys(j) for j in jobs))
    configs = [flatten(yaml.safe_load((j / ".hydra" / "config.yaml").read_text())) for j in jobs]
    named = named_keys(view)
    assert named["metrics"] <= scalars, named["metrics"] - scalars  # never a panel for a key no run logged
    assert named["media"] and named["media"] <= media, (named["media"], media)
    expected_config = list(dict.fromkeys(k for keys in grouped_by.values() for k in keys))
    assert named["config"] == set(expected_config)
    for key in expected_config:  # each grouping key is in every run's config and tells the settings apart
        assert all(key in c for c in configs) and len({str(c[key]) for c in configs}) > 1, key
    assert {"val/loss", "perf/tokens_per_sec", "perf/mfu"} <= named["metrics"]
    assert {k for k in media if k.startswith("attention/")} <= named["media"]

    sections = {s["name"]: s["panels"] for s in view["spec"]["section"]["panelBankConfig"]["sections"]}
    review = sections[f"Review: {sweep.name}"]
    (pc,) = [p for p in review if p["viewType"] == "Parallel Coordinates Plot"]
    assert [c["accessor"] for c in pc["config"]["columns"]] == \
        [f"config:{k}.value" for k in expected_config] + ["summary:val/loss"]
    assert {"Validation", "Throughput and MFU", "Attention maps"} <= set(sections)
    run_ids = {p.name.rsplit("-", 1)[1] for j in jobs for p in j.glob("wandb/offline-run-*")}
    (flt,) = view["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert set(flt["value"]) == run_ids and len(run_ids) == n_runs
    if seeds:
        assert "Seeds: `seed` varies" in review[0]["config"]["value"]
    return view
