"""Seed sweeps as a user runs them: `python train.py -m norm=pre,rms seed=0,1` puts the seeds of a setting in one W&B
group, and `python -m attnlab.compare <sweep> --by norm` tabulates mean ± std, the difference to the baseline with
Welch's interval and p-value (or the paired t-test by seed; checked here against numpy and scipy), and draws the
curves with bands."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import compose_train, run_cli
from scipy import stats

from attnlab.cli.compare import compare, main
from attnlab.runs.plan import prepare_loggers
from attnlab.runs.sweep import setting_name, setting_overrides

# two validation points per job (2 epochs of 2 batches), no test, the slow callbacks off; CSV and W&B offline
SWEEP = ["-m", "model=causal_lm", "debug=fast", "model.net.n_layers=1", "trainer.max_epochs=2",
         "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "callbacks.attention_maps=null",
         "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "test=false",
         "logger=[csv,wandb]", "norm=pre,rms", "seed=0,1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir) -> Path:
    """A real 2 settings × 2 seeds sweep (jobs 0, 1: norm=pre seeds 0, 1; jobs 2, 3: norm=rms)."""
    folder = tmp_path_factory.mktemp("seed_sweep") / "sweep"
    out = run_cli([*SWEEP, f"hydra.sweep.dir={folder}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    return folder


def wandb_log(job: Path) -> bytes:
    """A job's offline W&B log: its run record (group, tags) is protobuf, whose strings are stored as is."""
    (log,) = job.glob("wandb/offline-run-*/run-*.wandb")
    return log.read_bytes()


def test_setting_name_is_the_overrides_without_seed_and_bookkeeping():
    a = ["norm=rms", "seed=0", "logger=csv", "hydra.sweep.dir=/x", "model.net.d_model=64", "++tags=[a]"]
    b = ["model.net.d_model=64", "seed=7", "norm=rms", "paths.output_dir=/y"]  # another order, seed and folders
    assert setting_overrides(a) == ["model.net.d_model=64", "norm=rms"]
    assert setting_name(a, "causal_lm") == setting_name(b, "causal_lm") == "causal_lm/model.net.d_model=64,norm=rms"
    assert setting_name(["norm=pre", "seed=0"], "causal_lm") != setting_name(["norm=rms", "seed=0"], "causal_lm")
    assert setting_name(["seed=3"], "causal_lm") == "causal_lm"
    assert setting_name(["model=causal_lm", "norm=rms"], "causal_lm", drop=["model"]) == "causal_lm/norm=rms"
    long = [f"model.net.key_{i}={i}" for i in range(30)]
    name = setting_name(long, "causal_lm")
    assert len(name) == 128 and name == setting_name(long[::-1], "causal_lm")  # W&B's limit, still stable
    assert name != setting_name(long[:-1] + ["model.net.key_29=30"], "causal_lm")


def test_an_experiment_sweep_is_grouped_under_the_experiment_name(tmp_path):
    overrides = ["experiment=e09_rmsnorm", "norm=rms", "seed=1", "logger=wandb"]
    cfg = compose_train(overrides, tmp_path)
    prepare_loggers(cfg, overrides)
    assert cfg.logger.wandb.group == "e09_rmsnorm/norm=rms"
    assert {"claim-E9", "norm=rms", "seed=1"} <= set(cfg.logger.wandb.tags)
    overrides = ["seed=2", "norm=rms", "experiment=e09_rmsnorm", "logger=wandb"]  # another seed, another order
    cfg = compose_train(overrides, tmp_path)
    prepare_loggers(cfg, overrides)
    assert cfg.logger.wandb.group == "e09_rmsnorm/norm=rms" and "seed=2" in cfg.logger.wandb.tags


def test_seeds_of_a_setting_share_a_wandb_group(sweep):
    jobs = {j: yaml.safe_load((sweep / j / ".hydra" / "overrides.yaml").read_text()) for j in "012"}
    group = {j: setting_name(o, "causal_lm", drop=["model"]) for j, o in jobs.items()}  # what train.py gives W&B
    assert group["0"] == group["1"] != group["2"] and "norm=pre" in group["0"] and "norm=rms" in group["2"]
    assert group["0"].startswith("causal_lm/") and "seed" not in group["0"] and "logger" not in group["0"]
    logs = {j: wandb_log(sweep / j) for j in "012"}
    assert group["0"].encode() in logs["0"] and group["0"].encode() in logs["1"]
    assert group["2"].encode() in logs["2"] and group["0"].encode() not in logs["2"]
    # the seed tag (the command line recorded in each log says "seed=0,1", which holds no "seed=1")
    assert b"seed=1" in logs["1"] and b"seed=1" not in logs["0"] and b"norm=rms" in logs["2"]


def test_compare_table_matches_numpy_and_scipy(sweep, tmp_path, capsys):
    assert main([str(sweep), "--by", "norm", "--metric", "val/loss", "--baseline", "pre",
                 "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "val/loss (mean ± std)" in printed and "Δ vs pre" in printed and "95% CI" in printed
    with open(tmp_path / "cmp.csv") as f:
        rows = {r["setting"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["pre", "rms"] and rows["pre"]["verdict"] == "baseline"
    values = {norm: np.array([json.loads((sweep / j / "metrics.json").read_text())["val/loss"] for j in jobs])
              for norm, jobs in (("pre", "01"), ("rms", "23"))}
    for norm, v in values.items():
        assert int(rows[norm]["n"]) == 2 and rows[norm]["seeds"] == "0 1"
        assert float(rows[norm]["mean"]) == pytest.approx(v.mean(), rel=1e-12)
        assert float(rows[norm]["std"]) == pytest.approx(v.std(ddof=1), rel=1e-9)
    assert values["pre"].std() > 0 and values["rms"].std() > 0  # the seeds differ, so the interval means something
    test = stats.ttest_ind(values["rms"], values["pre"], equal_var=False)
    low, high = test.confidence_interval(0.95)
    rms = rows["rms"]
    assert float(rms["diff"]) == pytest.approx(values["rms"].mean() - values["pre"].mean(), rel=1e-9)
    assert float(rms["ci_low"]) == pytest.approx(low, rel=1e-9) and float(rms["ci_high"]) == pytest.approx(high, rel=1e-9)
    assert float(rms["p_value"]) == pytest.approx(test.pvalue, rel=1e-9)
    assert rms["significant"] == str(test.pvalue < 0.05)
    # the markdown table and the figure of the curves (mean ± std band per setting)
    md = (tmp_path / "cmp.md").read_text()
    assert md.startswith("| norm | n | seeds | val/loss (mean ± std) | Δ vs pre | 95% CI | p (Welch) | significant |")
    assert f"{test.pvalue:.3g}" in md
    assert (tmp_path / "cmp.png").stat().st_size > 5_000


def test_compare_default_groups_by_the_swept_keys(sweep):
    result = compare(sweep)  # no --by: the overrides that vary, seed aside; the first setting is the baseline
    assert result.by == ["norm"] and [r.setting for r in result.rows] == ["pre", "rms"] and result.baseline == "pre"
    assert result.mode == "min"  # a loss: lower is better
    assert compare(sweep, "norm", "val/ppl").row("rms").n == 2


def test_compare_errors_are_one_line(sweep, tmp_path, capsys):
    def error(*argv) -> str:
        assert main([*map(str, argv)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        return line

    (tmp_path / "empty").mkdir()
    assert error(tmp_path / "empty").startswith(f"error: no runs under {tmp_path / 'empty'}")
    line = error(sweep, "--by", "norm", "--metric", "val/accuracy")
    assert line.startswith("error: no job logged 'val/accuracy'; available: ") and "val/loss" in line
    assert "the sweep varies: norm, seed" in error(sweep, "--by", "nrom")
    assert error(sweep, "--by", "norm", "--baseline", "post") == \
        "error: --baseline 'post' is not a setting of norm; settings: pre, rms"


def test_a_setting_with_one_seed_has_no_interval(sweep, tmp_path, capsys):
    """One seed per setting (besides a diverged job and an unfinished one): n=1, no std, no interval, no crash."""
    small = tmp_path / "sweep"
    for job in ("0", "1", "2", "3"):
        shutil.copytree(sweep / job, small / job)
    (small / "3" / "metrics.json").unlink()  # as a job that did not finish
    diverged = json.loads((small / "1" / "metrics.json").read_text())
    (small / "1" / "metrics.json").write_text(json.dumps({**diverged, "val/loss": float("nan")}))
    assert main([str(small), "--by", "norm", "--out", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert "job 3 left out: it did not finish" in out and "job 1 left out: its val/loss is nan" in out
    assert "pre has a single seed" in out
    with open(tmp_path / "one.csv") as f:
        rows = {r["setting"]: r for r in csv.DictReader(f)}
    assert rows["rms"]["n"] == "1" and rows["rms"]["std"] == "" and rows["rms"]["ci_low"] == ""
    assert rows["rms"]["p_value"] == "" and rows["rms"]["verdict"] == "n/a (n=1)" and rows["rms"]["diff"] != ""


def test_paired_compare_matches_scipy_ttest_rel(sweep, tmp_path, capsys):
    """`--test paired` pairs each rms job with the pre job of its seed and tests the per-seed differences."""
    assert main([str(sweep), "--by", "norm", "--test", "paired", "--out", str(tmp_path / "paired")]) == 0
    assert "p (paired t)" in capsys.readouterr().out
    with open(tmp_path / "paired.csv") as f:
        rms = {r["setting"]: r for r in csv.DictReader(f)}["rms"]
    loss = {j: json.loads((sweep / j / "metrics.json").read_text())["val/loss"] for j in "0123"}
    pre, rms_values = np.array([loss["0"], loss["1"]]), np.array([loss["2"], loss["3"]])  # seeds 0, 1 each
    test = stats.ttest_rel(rms_values, pre)
    low, high = test.confidence_interval(0.95)
    assert rms["paired_seeds"] == "0 1"
    assert float(rms["diff"]) == pytest.approx((rms_values - pre).mean(), rel=1e-9)
    assert float(rms["ci_low"]) == pytest.approx(low, rel=1e-9) and float(rms["ci_high"]) == pytest.approx(high, rel=1e-9)
    assert float(rms["p_value"]) == pytest.approx(test.pvalue, rel=1e-9)
    assert "the paired t-test over the seeds both settings ran" in (tmp_path / "paired.md").read_text()
    # a seed only one setting ran is left out of the pairs and noted; one pair left gives no interval
    small = tmp_path / "sweep"
    for job in "012":
        shutil.copytree(sweep / job, small / job)
    result = compare(small, "norm", test="paired")
    assert result.row("rms").pairs == [0] and result.row("rms").verdict == "n/a (n=1)"
    assert "rms: seeds [1] are not in both rms and pre; the paired test leaves them out" in result.notes


def test_damaged_job_files_and_out_paths_are_one_line(sweep, tmp_path, capsys):
    """A job file damaged by hand or by a kill (corrupt JSON/YAML, a metric that is not a number, no .hydra, a CSV
    that is not UTF-8) is one line naming it, never a traceback nor a silent wrong table (a `true` read as 1.0,
    settings pooled as one); --out a folder writes inside it, --out under a file is one line."""
    damaged = tmp_path / "sweep"
    for job in "0123":
        shutil.copytree(sweep / job, damaged / job, ignore=shutil.ignore_patterns("wandb", "checkpoints"))
    metrics = damaged / "1" / "metrics.json"
    good = metrics.read_text()
    overrides = damaged / "1" / ".hydra" / "overrides.yaml"
    (csv_file,) = (damaged / "1").glob("csv/version_*/metrics.csv")

    def error(*argv) -> str:
        assert main([str(damaged), "--by", "norm", "--out", str(tmp_path / "cmp"), *argv]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        return line

    metrics.write_text('{"val/loss": 6.1,')  # cut short
    assert error().startswith(f"error: {metrics}: not valid JSON object of metrics (")
    for value, shown in (("true", "true"), ('"abc"', '"abc"'), ("null", "null")):
        metrics.write_text(good.replace(f'"val/loss": {json.loads(good)["val/loss"]}', f'"val/loss": {value}'))
        assert error() == f"error: {metrics}: val/loss is {shown}, not a number"
    metrics.write_text(good)
    good_overrides = overrides.read_text()
    overrides.write_text("- [unclosed\n")
    assert error().startswith(f"error: {overrides}: not valid YAML list of overrides")
    overrides.unlink()  # settings unknown: not pooled with the others
    assert "job(s) 1 of" in error() and "no .hydra/overrides.yaml" in error()
    overrides.write_text(good_overrides)
    good_csv = csv_file.read_bytes()
    csv_file.write_bytes(b"\xff\xfe" + good_csv)  # the curves are read for the figure
    assert error().startswith(f"error: {csv_file}: not a readable CSV of metrics")
    csv_file.write_bytes(good_csv)
    assert not (tmp_path / "cmp.md").exists()
    # --out: a folder gets the default names inside it; a path under a file is one line
    (tmp_path / "folder").mkdir()
    assert main([str(damaged), "--by", "norm", "--out", str(tmp_path / "folder")]) == 0
    assert (tmp_path / "folder" / "compare-norm-val_loss.md").is_file()
    (tmp_path / "a_file").write_text("keep\n")
    assert main([str(damaged), "--out", str(tmp_path / "a_file" / "cmp")]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot write the comparison to {tmp_path / 'a_file' / 'cmp'}")
    assert (tmp_path / "a_file").read_text() == "keep\n"
    # the note on pooled jobs names the keys that differ (norm), not every key of the command line
    notes = compare(damaged, "seed").notes
    assert "the jobs of 0 differ in more than the seed (norm); they are pooled: add those keys to --by to " \
           "separate them" in notes


def test_workspace_leaves_out_a_run_whose_log_holds_nothing(sweep, tmp_path, capsys):
    """An empty (or cut short) offline W&B log reads as a run without id, config or keys: it is left out with a
    note instead of changing the grouping keys and filtering on an empty id; --out in a new folder is created."""
    pytest.importorskip("wandb_workspaces", reason="the wandb-workspaces extra (in dev) is not installed")
    from attnlab.cli.workspace import main as workspace

    copy = tmp_path / "sweep"
    for job in "012":
        shutil.copytree(sweep / job, copy / job, ignore=shutil.ignore_patterns("checkpoints", "csv"))
    (log,) = (copy / "1").glob("wandb/offline-run-*/run-*.wandb")
    log.write_bytes(b"")
    out = tmp_path / "new" / "folder" / "ws.json"
    assert workspace([str(copy), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 run(s), 2 setting(s); grouped by: norm -> norm.layer._target_" in printed
    assert f"note: {copy / '1'} has no readable W&B run (left out)" in printed
    view = json.loads(out.read_text())
    assert "" not in view["spec"]["section"]["runSets"][0]["filters"]["filters"][0]["value"]


@pytest.mark.parametrize("kind", ["to a file", "to a folder", "dangling"])
def test_outputs_planted_as_links_are_replaced_never_written_through(kind, sweep, tmp_path, capsys):
    """A sweep folder comes from anyone: the comparison's files and the workspace definition, planted there as links,
    are replaced by plain files; what the links point to is left as it was."""
    pytest.importorskip("wandb_workspaces", reason="the wandb-workspaces extra (in dev) is not installed")
    from attnlab.cli.workspace import main as workspace

    folder = tmp_path / "sweep"
    shutil.copytree(sweep, folder, symlinks=True, ignore=shutil.ignore_patterns("checkpoints"))
    outside = tmp_path / "outside"
    outside.mkdir()
    names = [f"compare-norm-val_loss.{ext}" for ext in ("md", "csv", "png")] + ["wandb_workspace.json"]
    for name in names:
        target = outside / name
        if kind == "to a file":
            target.write_text("someone else's file\n")
        elif kind == "to a folder":
            target.mkdir()
        (folder / name).symlink_to(target)
    before = {p.name: (p.is_dir(), p.read_text() if p.is_file() else None) for p in outside.iterdir()}
    assert main([str(folder), "--by", "norm"]) == 0
    assert workspace([str(folder)]) == 0
    capsys.readouterr()
    for name in names:
        assert (folder / name).is_file() and not (folder / name).is_symlink(), name
    after = {p.name: (p.is_dir(), p.read_text() if p.is_file() else None) for p in outside.iterdir()}
    assert after == before
