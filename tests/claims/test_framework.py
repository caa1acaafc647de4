"""The claims framework: every claim's commands compose, a claim runs end to end (--quick) into a JSON, a figure and
the generated results page, and failures come back as one line without losing earlier runs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.global_hydra import GlobalHydra

from attnlab.core.paths import CONF_DIR, ROOT
from experiments.claims import Claim, Result, all_claims, get_claim, normalize_id
from experiments.claims.base import interval_rule, verdict, verdict_of_parts
from experiments.claims.report import render
from experiments.claims.runner import ClaimRunError, run_claim, with_seeds
from preloaded_python import run as run_python


def test_claim_ids():
    assert normalize_id("e9") == normalize_id("E09") == normalize_id("9") == "E9"
    with pytest.raises(ValueError, match="not a claim id"):
        normalize_id("nine")
    with pytest.raises(ValueError, match="E99 has no experiment yet"):
        get_claim("E99")
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        Result(rows=[], headline="", verdict="maybe", evidence="")


def test_verdict_rules():
    assert verdict(True, partly=True) == "reproduced" and verdict(False, partly=True) == "partly reproduced"
    assert verdict(False, partly=False) == "not reproduced"
    assert verdict_of_parts(True, True, True) == "reproduced"
    assert verdict_of_parts(True, False, True) == "partly reproduced"
    assert verdict_of_parts(False, False) == "not reproduced"


def test_interval_rule_reads_the_interval_then_the_single_run_margin():
    """(holds, leans): the interval on the claimed side holds, only the mean there leans; no interval: the margin."""
    assert interval_rule(-0.05, -0.08, -0.02, sign=-1) == (True, True)  # claimed lower, interval below 0
    assert interval_rule(-0.05, -0.10, +0.01, sign=-1) == (False, True)  # mean lower, interval includes 0
    assert interval_rule(+0.03, +0.01, +0.05, sign=-1) == (False, False)
    assert interval_rule(-0.005, -0.009, -0.001, sign=+1, bound=-0.01) == (True, True)  # non-inferiority
    assert interval_rule(+0.03, None, None, sign=+1, margin=0.02) == (True, True)  # one seed: beyond the margin
    assert interval_rule(+0.01, None, None, sign=+1, margin=0.02) == (False, True)


def test_report_regenerates_the_committed_page():
    """`python -m experiments.claims report` rewrites docs/results.md from docs/results/*.json byte for byte."""
    if not any((ROOT / "docs" / "results").glob("E*.json")):
        pytest.skip("no committed results")
    assert render(ROOT / "docs") == (ROOT / "docs" / "results.md").read_text()


@pytest.mark.slow  # the 10-minute budget
def test_old_command_forwards_with_one_note(tmp_path):
    """`python -m attnlab.claims list` (the command before the move) still works from the repository root, with one
    line on stderr naming the new command; outside the repository it fails in one line naming it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    old = run_python([sys.executable, "-m", "attnlab.claims", "list"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert old.returncode == 0, old.stderr[-2000:]
    assert old.stderr.splitlines() == ["note: `python -m attnlab.claims` is deprecated; use "
                                       "`python -m experiments.claims list`"]
    assert [line.split()[0] for line in old.stdout.splitlines() if not line.startswith(" " * 8)] == list(all_claims())
    # Outside the checkout `experiments` must not be importable: drop the repository root from PYTHONPATH (a
    # worktree setup may put it there), else this would really start E9's training instead of failing in one line.
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT.resolve()]
    outside_env = {**env, "PYTHONPATH": os.pathsep.join(paths)}
    outside = run_python([sys.executable, "-m", "attnlab.claims", "run", "E9"], cwd=tmp_path, env=outside_env,
                             capture_output=True, text=True, timeout=60)
    assert outside.returncode == 2 and outside.stdout == ""
    assert outside.stderr.splitlines() == ["error: the claims moved out of the package: run `python -m "
                                           "experiments.claims run E9` from the root of a checkout of the repository"]


def test_seeds_are_appended_to_train_sweeps_without_a_seed():
    assert with_seeds("python train.py -m experiment=e09_rmsnorm norm=pre,rms", 3) == \
        "python train.py -m experiment=e09_rmsnorm norm=pre,rms seed=0,1,2"
    assert with_seeds("python train.py -m experiment=e10_swiglu ffn=relu,swiglu seed=1,2", 3).endswith("seed=1,2")
    assert with_seeds("python train.py -m experiment=e09_rmsnorm norm=pre,rms", 1).endswith("norm=pre,rms")
    assert with_seeds("python -m bench --only P3", 3) == "python -m bench --only P3"


def _train_jobs(command: str) -> list[list[str]]:
    """The override lists of every job a `python train.py -m ...` command launches."""
    args = shlex.split(command)[2:]
    overrides = [a for a in args if a != "-m"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


@pytest.mark.parametrize("cid", list(all_claims()))
def test_every_claim_command_composes(cid):
    """Each job of each claim's commands composes (experiment file exists, overrides valid): no training."""
    claim = get_claim(cid)
    assert claim.id == cid and claim.title and claim.statement and claim.minutes > 0
    assert all(c.startswith("python ") for c in claim.commands)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for command in claim.commands:
            if shlex.split(command)[1] != "train.py":
                continue
            assert " -m " in f" {command} ", "claim commands are multiruns, so each job gets its own folder"
            for job in _train_jobs(command):
                cfg = compose("train", overrides=job + claim.quick, return_hydra_config=False)
                assert cfg.get("experiment_name"), f"{cid}: {job} sets no experiment_name"
                assert "csv" in cfg.logger, f"{cid}: the analysis reads CSV curves; add the csv logger"


def test_quick_claim_end_to_end(quick_e9, tmp_path):
    """`python -m experiments.claims run E9 --quick`: real training runs, metrics.json, CSV curves, the analysis, a PNG."""
    out, proc = quick_e9
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((out / "E9" / "E9.json").read_text())
    assert record["quick"] is True and record["verdict"] in ("reproduced", "partly reproduced", "not reproduced")
    assert [r["norm"] for r in record["rows"]] == ["LayerNorm (pre)", "RMSNorm (pre)"]
    assert all(r["median step ms"] > 0 and r["val loss"] > 0 for r in record["rows"])
    assert (out / "E9" / record["figure"]).stat().st_size > 5_000
    # E9 has 3 seeds per setting; --quick runs 2: four jobs, and the RMSNorm row's interval over them
    assert record["seeds"] == 2 and record["commands"] == [
        "python train.py -m experiment=e09_rmsnorm norm=pre,rms seed=0,1",
        "python -m bench --only P9 --clock cpu --json {dir}/bench.json --markdown {dir}/bench.md"]
    # the norm layers timed by bench P9 (--quick: one small shape, eager only, which then decides "cheaper")
    assert all(r["norm ms, 512x32/eager"] > 0 for r in record["rows"]) and "512x32/eager" in record["evidence"]
    losses = {}
    for job in ("0", "1", "2", "3"):
        run = out / "E9" / "0" / job
        assert json.loads((run / "metrics.json").read_text())["test/loss"] > 0
        norm = dict(o.split("=", 1) for o in yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()))["norm"]
        losses.setdefault(norm, []).append(json.loads((run / "metrics.json").read_text())["val/loss"])
    ln, rms = record["rows"]
    assert ln["seeds"] == rms["seeds"] == 2 and ln["95% CI"] is None
    diff = sum(losses["rms"]) / 2 - sum(losses["pre"]) / 2
    assert rms["Δ val loss"] == pytest.approx(diff, abs=1e-3)
    low, high = (float(x) for x in rms["95% CI"].strip("[]").split(","))
    assert low <= diff <= high and 0 <= rms["p"] <= 1

    # the page: this result's section, and every other claim listed as not run yet
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    (docs / "figures").mkdir()
    record["figure"] = "figures/E9.png"
    (docs / "results" / "E9.json").write_text(json.dumps(record))
    shutil.copy(out / "E9" / "E9.png", docs / "figures" / "E9.png")
    page = render(docs)
    assert f"| [E9](#e9) | RMSNorm vs LayerNorm | **{record['verdict']}** |" in page
    assert "python train.py -m experiment=e09_rmsnorm norm=pre,rms seed=0,1" in page and "![E9](figures/E9.png)" in page
    assert ", 2 seeds per setting on " in page
    for other in set(all_claims()) - {"E9"}:
        assert f"`python -m experiments.claims run {other}`" in page

    # a rerun moves the earlier runs aside, never deletes them
    failing = Claim(id="E9", title="t", statement="s", analyze=lambda ctx: None,
                    commands=["python train.py -m experiment=e09_rmsnorm norm=no_such_norm"])
    with pytest.raises(ClaimRunError, match="command 0 failed .* see .*command0.log"):
        run_claim(failing, out, None)
    kept = [p for p in out.iterdir() if p.name.startswith("E9.old-")]
    assert len(kept) == 1 and (kept[0] / "0" / "1" / "metrics.json").is_file()


def test_bad_ids_and_damaged_results_are_one_line_exit_2(tmp_path, capsys):
    """A claim id that does not exist, and a docs/results/<id>.json that is cut short or not a result (a list):
    one line naming the file, exit 2 (a list was a TypeError traceback; corrupt JSON did not name the file)."""
    from experiments.claims.__main__ import main

    def error(*argv) -> str:
        assert main(list(argv)) == 2
        (line,) = capsys.readouterr().err.splitlines()
        return line

    assert error("run", "E99").startswith("error: claim E99 has no experiment yet; available: E1, ")
    results = tmp_path / "results"
    results.mkdir()
    (results / "E9.json").write_text('{"title": ')
    assert error("report", "--docs", str(tmp_path)).startswith(f"error: {results / 'E9.json'}: not valid JSON (")
    (results / "E9.json").write_text("[1, 2]")
    assert error("report", "--docs", str(tmp_path)) == \
        f"error: {results / 'E9.json'}: holds a list, not a claim's result (a JSON object)"
    (tmp_path / "a_file").write_text("")
    assert "Not a directory" in error("report", "--docs", str(tmp_path / "a_file"))  # was a traceback
    assert not (tmp_path / "results.md").exists()
