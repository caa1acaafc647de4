"""python -m attnlab.cli.workspace: the W&B workspace reviewing a sweep, built offline from what the runs logged.

The default tests build it from made-up runs (no training: the swept keys, the group-choice config keys, every
kind of panel, no socket opened, the saved file loads back as the W&B view); tests/test_train.py's DDP sweep builds
it from a real sweep's offline runs (workspace_checks.py), and `-m slow` adds a norm × seed sweep of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_socket  # the dev extra's pytest-socket
import torch
from helpers import run_cli
from workspace_checks import check_leet_opens, check_sweep_workspace

from attnlab.analysis.attention_health import attention_health
from attnlab.runs.wandb_runs import OfflineRun
from attnlab.cli.workspace import Job, Sweep, build_workspace, config_keys_for, main, named_keys, save, swept_keys

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket")

LAYER, RMS = "torch.nn.LayerNorm", "torch.nn.RMSNorm"
NORMS = {"pre": ("pre", LAYER), "post": ("post", LAYER), "rms": ("pre", RMS)}  # conf/norm: placement, layer


def made_up_job(norm: str, seed: int, lr: str = "0.001") -> Job:
    placement, layer = NORMS[norm]
    config = {"norm.placement": placement, "norm.layer._target_": layer, "norm.layer.eps": 1e-5, "seed": seed,
              "model.optimizer.lr": float(lr), "optimized_metric": "val/loss",
              "model.net.norm.placement": placement}
    run = OfflineRun(path=Path(f"/x/{norm}{seed}"), run_id=f"{norm}{seed}", project="attnlab", entity="", name="",
                     tags=[], config=config, summary={"val/loss": 1.0})
    overrides = {"model": "causal_lm", "norm": norm, "seed": str(seed), "model.optimizer.lr": lr}
    return Job(Path(f"/sweep/{norm}{seed}"), overrides, [run])


def test_swept_keys_and_the_config_keys_that_carry_them():
    jobs = [made_up_job(n, s, lr) for n in ("pre", "post", "rms") for s in (0, 1) for lr in ("0.001", "0.003")]
    assert swept_keys(jobs) == ["norm", "seed", "model.optimizer.lr"]  # model=causal_lm is the same everywhere
    # a group choice is not in the logged config: the fewest keys under norm. that tell pre, post and rms apart
    assert config_keys_for("norm", jobs) == ["norm.placement", "norm.layer._target_"]
    assert config_keys_for("norm", [j for j in jobs if j.overrides["norm"] != "post"]) == ["norm.layer._target_"]
    assert config_keys_for("model.optimizer.lr", jobs) == ["model.optimizer.lr"]  # a value: itself
    # the same value spelled two ways on two command lines is no swept key: the logged configs are equal
    pair = [made_up_job("pre", 0), made_up_job("rms", 0)]
    for job, spelling in zip(pair, ("False", "false")):
        job.overrides["trainer.enable_progress_bar"] = spelling
        job.runs[0].config["trainer.enable_progress_bar"] = False
    assert swept_keys(pair) == ["norm", "trainer.enable_progress_bar"]
    assert config_keys_for("trainer.enable_progress_bar", pair) == []


# the attention-health keys of a decoder layer's self- and cross-attention (2 heads), from the callback's own function
HEALTH = {"net.decoder.layers.10.self_attn": torch.full((1, 2, 3, 3), 1 / 3),
          "net.decoder.layers.2.cross_attn": torch.full((1, 2, 3, 4), 0.25),
          "net.encoder.layers.0.self_attn": torch.full((1, 2, 4, 4), 0.25)}


def made_up_sweep() -> Sweep:
    jobs = [made_up_job(n, s) for n in ("pre", "rms") for s in (0, 1, 2)]
    scalars = ["val/loss", "val/ppl", "train/loss", "lr-AdamW/pg1", "perf/tokens_per_sec", "perf/mfu",
               "perf/step_time_ms", "test/loss", "trainer/global_step", "epoch", "moe/expert_0_fraction",
               *attention_health(HEALTH)]
    media = {"attention/net.decoder.layers.0.self_attn": "image", "attention/explorer": "html",
             "val/translations": "table", "tts/audio": "audio", "tts/mel": "image"}
    return Sweep(root=Path("/sweep/2026-12-02_10-00-00"), jobs=jobs, without_runs=[], swept=["norm", "seed"],
                 group_keys={"norm": ["norm.layer._target_"]}, metric="val/loss", scalar_keys=scalars,
                 media_keys=media, project="attnlab", entity="")


def test_workspace_has_every_panel_for_logged_keys_only_and_saves_without_network(tmp_path):
    pytest.importorskip("wandb_workspaces", reason="the wandb-workspaces extra (in dev) is not installed")
    from wandb_workspaces.workspaces import internal

    sweep = made_up_sweep()
    pytest_socket.disable_socket(allow_unix_socket=False)  # building and saving open no socket at all
    try:
        view = save(build_workspace(sweep), tmp_path / "ws.json")
    finally:
        pytest_socket.enable_socket()

    named = named_keys(view)
    assert named["metrics"] <= set(sweep.scalar_keys)
    assert named["metrics"] >= {"val/loss", "val/ppl", "train/loss", "perf/tokens_per_sec", "perf/mfu", "test/loss",
                                "moe/expert_0_fraction"}
    assert named["media"] == set(sweep.media_keys)
    assert named["config"] == {"norm.layer._target_"}
    section = view["spec"]["section"]
    sections = {s["name"]: [p["viewType"] for p in s["panels"]] for s in section["panelBankConfig"]["sections"]}
    assert sections == {
        "Review: 2026-12-02_10-00-00": ["Markdown Panel", "Parallel Coordinates Plot", "Run History Line Plot",
                                        "Bar Chart"],
        "Validation": ["Run History Line Plot"],  # val/ppl (val/loss is in the review)
        "Training": ["Run History Line Plot"] * 2,
        "Throughput and MFU": ["Run History Line Plot"] * 3,
        "Test": ["Bar Chart"],
        "Attention explorer": ["Media Browser"],  # the wandb.Html page
        "Attention maps": ["Media Browser"],
        # one section per attention module, encoder first, layers in numeric order (10 after 2), a plot per metric
        "health.net.encoder.layers.0.self_attn": ["Run History Line Plot"] * 3,  # entropy, sink, distance
        "health.net.decoder.layers.2.cross_attn": ["Run History Line Plot"] * 4,  # entropy, sink, focus, diagonal
        "health.net.decoder.layers.10.self_attn": ["Run History Line Plot"] * 3,
        "Samples": ["Weave", "Media Browser", "Media Browser"],  # the translation table, tts/audio, tts/mel
        "Other metrics": ["Run History Line Plot"],  # moe/expert_0_fraction
    }
    assert list(sections)[7:10] == [f"health.{m}" for m in ("net.encoder.layers.0.self_attn",
                                                            "net.decoder.layers.2.cross_attn",
                                                            "net.decoder.layers.10.self_attn")]
    by_name = {s["name"]: s for s in section["panelBankConfig"]["sections"]}
    (explorer,) = by_name["Attention explorer"]["panels"]
    assert explorer["config"]["mediaKeys"] == ["attention/explorer"] and explorer["layout"]["w"] == 24
    assert by_name["Attention maps"]["panels"][0]["config"]["mediaKeys"] == ["attention/net.decoder.layers.0.self_attn"]
    cross = by_name["health.net.decoder.layers.2.cross_attn"]["panels"]
    # heads as lines: the mean first, then each head, one plot per metric in the scheme's order
    assert [p["config"]["metrics"] for p in cross] == [
        [f"health.net.decoder.layers.2.cross_attn/{m}{h}" for h in ("", "_h0", "_h1")]
        for m in ("entropy", "sink", "focus_rate", "diagonal_rate")]
    assert all(p["config"]["xAxis"] == "trainer/global_step" for p in cross)
    review = section["panelBankConfig"]["sections"][0]["panels"]
    # W&B keeps this project's flat config keys as {"norm.layer._target_": {"value": ...}}: the .value goes last
    assert [c["accessor"] for c in review[1]["config"]["columns"]] == ["config:norm.layer._target_.value",
                                                                       "summary:val/loss"]
    curve = review[2]["config"]
    assert (curve["groupBy"], curve["groupAgg"], curve["groupArea"], curve["xAxis"]) == \
        ("norm.layer._target_.value", "mean", "stddev", "trainer/global_step")
    assert section["runSets"][0]["grouping"] == [{"section": "config", "name": "norm.layer._target_.value"}]
    assert section["runSets"][0]["filters"]["filters"][0]["value"] == [j.runs[0].run_id for j in sweep.jobs]
    assert "| norm=pre | 3 |" in review[0]["config"]["value"] and "Seeds: `seed` varies" in review[0]["config"]["value"]
    # --publish uploads the saved file as it is: it loads back as the W&B view model, unchanged
    loaded = internal.View.model_validate_json((tmp_path / "ws.json").read_text())
    assert json.loads(loaded.model_dump_json(by_alias=True, exclude_none=True)) == view


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "no run or sweep here"),
    (lambda d: (d / "0" / ".hydra").mkdir(parents=True) or (d / "0" / ".hydra" / "overrides.yaml").write_text("[]"),
     "no W&B run in its 1 job(s)"),
])
def test_a_folder_without_runs_is_one_line(tmp_path, capsys, make, message):
    make(tmp_path)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_publish_without_a_saved_workspace_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path), "--publish"]) == 2
    assert "no saved workspace" in capsys.readouterr().err


@pytest.mark.slow
def test_norm_by_seed_sweep_workspace_and_leet(tmp_path, cache_dir):
    """A real 2 × 2 sweep (norm=pre,rms × seed=1,2, W&B offline): grouped by norm only, seeds counted."""
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", "model=causal_lm", "debug=fast", "norm=pre,rms", "seed=1,2", "model.net.n_layers=1",
                   "trainer.limit_train_batches=4", "test=false", "callbacks.rich_progress_bar=null",
                   "trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    view = check_sweep_workspace(sweep, {"norm": ["norm.layer._target_"]}, n_runs=4, seeds=True)
    review_text = view["spec"]["section"]["panelBankConfig"]["sections"][0]["panels"][0]["config"]["value"]
    assert "| norm=pre | 2 |" in review_text and "| norm=rms | 2 |" in review_text
    check_leet_opens(sweep / "0")


def test_a_damaged_overrides_file_or_an_unwritable_out_is_one_line(tmp_path, capsys):
    """Both fail before any W&B log is read: one line naming the file, no traceback, nothing written."""
    hydra = tmp_path / "sweep" / "0" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "overrides.yaml").write_text("- [unclosed\n")
    assert main([str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {hydra / 'overrides.yaml'}: not valid YAML list of overrides"), err
    (hydra / "overrides.yaml").write_text("norm: rms\n")  # a mapping, not Hydra's list: not read as keys
    assert main([str(tmp_path / "sweep")]) == 2
    assert "holds a dict, not the YAML list of overrides" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("keep\n")
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "a_file" / "ws.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err, err
    assert (tmp_path / "a_file").read_text() == "keep\n"
