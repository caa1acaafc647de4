"""``hparams_search=``: attnlab's Optuna sweeper on today's Optuna (src/attnlab/runs/optuna_sweeper.py), as a user
runs it through ``python train.py -m``.

Properties: a search killed in a trial (SIGKILL, SIGTERM) and continued with ``resume=<sweep dir>`` gives the
trials of the search run straight (the same parameters, states and values: trial ``n``'s sampler is seeded
``seed + n`` and sees the same earlier trials); a pruner fed each epoch from the job's validation metric stops
trials, which the summary counts with the epochs saved; several objectives give a Pareto front.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_cli

TESTS = Path(__file__).resolve().parent
SEARCH = ["-m", "hparams_search=lm_optuna", "model=causal_lm", "debug=fast", "logger=csv", "threads=1",
          "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
          "trainer.max_epochs=2", "model.net.d_model=48", "hydra.sweeper.n_trials=3",
          "hydra.sweeper.sampler.n_startup_trials=2", "hydra.sweeper.pruner=null",
          "+callbacks.fault._target_=fault_injection.Fault"]


def _search(sweep_dir: Path, cache_dir: str, *extra: str, fault: dict | None = None, resume: bool = False):
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if fault:
        env["ATTNLAB_FAULT"] = json.dumps(fault)
    return run_cli([*SEARCH, *extra, f"hydra.sweep.dir={sweep_dir}", *([f"resume={sweep_dir}"] if resume else [])],
                   cache_dir, env=env)


def _trials(sweep_dir: Path) -> list[tuple]:
    import optuna

    study = optuna.load_study(study_name="lm_optuna", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    return [(t.number, t.state.name, t.params, t.values) for t in study.get_trials()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache_dir) -> Path:
    sweep_dir = tmp_path_factory.mktemp("straight") / "search"
    r = _search(sweep_dir, cache_dir)
    assert r.returncode == 0, r.stdout[-3000:]
    return sweep_dir


def test_a_search_runs_its_trials_and_reports_the_best(straight):
    trials = _trials(straight)
    assert [t[:2] for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    assert len({json.dumps(t[2], sort_keys=True) for t in trials}) == 3  # three different draws
    summary = (straight / "sweep_summary.md").read_text()
    best = min(trials, key=lambda t: t[3][0])
    assert f"best: trial {best[0]}, val/loss = {best[3][0]:.4f}" in summary
    assert f"optuna-dashboard sqlite:///{straight / 'optuna.db'}" in summary
    for number, _, params, values in trials:  # each trial's job trained what the study drew, and told its value
        overrides = (straight / str(number) / ".hydra" / "overrides.yaml").read_text()
        assert f"model.optimizer.lr={params['model.optimizer.lr']!r}" in overrides
        assert json.loads((straight / str(number) / "job_status.json").read_text())["value"] == values[0]


@pytest.mark.parametrize("fault, rc", [
    ({"hook": "on_train_batch_end", "step": 9, "job": 1, "signal": "SIGKILL"}, -9),  # trial 1, after a checkpoint
    ({"hook": "on_train_batch_end", "step": 2, "job": 2, "signal": "SIGTERM"}, 0),  # trial 2, before one
])
def test_a_search_killed_in_a_trial_then_continued_gives_the_straight_trials(fault, rc, straight, tmp_path,
                                                                             cache_dir):
    sweep_dir = tmp_path / "search"
    r = _search(sweep_dir, cache_dir, fault=fault)
    assert r.returncode == rc, r.stdout[-3000:]
    assert _trials(sweep_dir)[-1][1] == "RUNNING"
    r = _search(sweep_dir, cache_dir, resume=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "continuing the search" in r.stdout and "1 to run again" in r.stdout
    assert _trials(sweep_dir) == _trials(straight)


def test_a_pruner_stops_trials_and_the_summary_counts_what_it_saved(tmp_path, cache_dir):
    sweep_dir = tmp_path / "search"
    # every trial after the first is stopped at its first report (ThresholdPruner: any val/loss above 1)
    r = _search(sweep_dir, cache_dir, "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,upper:1.0}",
                "trainer.max_epochs=3")
    assert r.returncode == 0, r.stdout[-3000:]
    states = [t[1] for t in _trials(sweep_dir)]
    assert states == ["PRUNED"] * 3, states
    summary = (sweep_dir / "sweep_summary.md").read_text()
    assert "3 pruned" in summary and "| pruned | pruned by ThresholdPruner after epoch 0" in summary
    assert "pruning: the pruned trials stopped 6 epoch(s) early; the search trained 3 of 9 epochs (67% saved)" in summary
    assert not any((sweep_dir / str(n) / "metrics.json").exists() for n in range(3))


def test_several_objectives_give_a_pareto_front_and_refuse_a_pruner(tmp_path, cache_dir):
    sweep_dir = tmp_path / "search"
    r = _search(sweep_dir, cache_dir, "optimized_metric=[val/loss,test/loss]",
                "hydra.sweeper.direction=[minimize,maximize]", "hydra.sweeper.n_trials=2")
    assert r.returncode == 0, r.stdout[-3000:]
    assert all(len(t[3]) == 2 for t in _trials(sweep_dir))
    assert "Pareto front (val/loss (minimize), test/loss (maximize)): trial " in \
        (sweep_dir / "sweep_summary.md").read_text()
    r = _search(tmp_path / "other", cache_dir, "optimized_metric=[val/loss,test/loss]",
                "hydra.sweeper.direction=[minimize,maximize]", "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner}")
    assert r.returncode == 2 and "Optuna prunes a search of one objective" in r.stdout, r.stdout[-2000:]
