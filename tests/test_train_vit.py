"""train.py with model=vit end to end (in process): digits data, accuracy, confusion matrices, attention maps over
the image (per-head patch attention + rollout), W&B offline images, block groups and checkpoints."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from helpers import compose_train, explorer_data, wandb_html_keys
from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from attnlab.runs.build import build_model
from attnlab.cli.train import run

QUIET = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]


def csv_rows(run_dir: Path) -> list[dict]:
    (path,) = run_dir.glob("csv/version_*/metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def test_vit_fast_run_metrics_confusion_and_attention_maps(tmp_path, cache_dir):
    cfg = compose_train(["model=vit", "debug=fast", "logger=[csv,wandb]", "trainer.max_epochs=2", *QUIET],
                        tmp_path, cache_dir)
    assert cfg.data._target_.endswith("DigitsDataModule")  # model=vit brings its data set
    metrics = run(cfg)
    for key in ("train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    assert 0 <= metrics["val/acc"] <= 1 and 0 <= metrics["test/acc"] <= 1
    rows = csv_rows(tmp_path)
    assert len([r for r in rows if r.get("val/acc")]) == 2
    assert min(float(r["perf/tokens_per_sec"]) for r in rows if r.get("perf/tokens_per_sec")) > 0
    assert all(0 < float(r["perf/mfu"]) < 1 for r in rows if r.get("perf/mfu"))

    confusion = sorted(p.name for p in (tmp_path / "confusion_matrix").glob("*.png"))
    assert confusion == ["epoch000.png", "epoch001.png", "test.png"]
    epochs = sorted((tmp_path / "attention_maps").glob("epoch*"))
    assert len(epochs) == 2
    for folder in epochs:
        assert sorted(p.name for p in folder.glob("*.png")) == [
            "net.encoder.layers.0.self_attn.png", "net.encoder.layers.1.self_attn.png", "rollout.png"]

    (wandb_run,) = (tmp_path / "wandb").glob("offline-run-*")
    # W&B stores a logged image as media/images/<key>_<step>_<hash>.png
    media = {p.parent.name + "/" + p.name.rsplit("_", 2)[0] for p in wandb_run.glob("files/media/images/**/*.png")}
    assert media == {"attention/net.encoder.layers.0.self_attn", "attention/net.encoder.layers.1.self_attn", "attention/rollout",
                     "confusion_matrix/val", "confusion_matrix/test"}
    # the attention explorer: both epochs, the image view with the rollout, logged to W&B once as HTML
    page = explorer_data(tmp_path)
    assert [e["epoch"] for e in page["epochs"]] == [0, 1] and page["view"]["family"] == "image"
    assert page["modules"][-1]["name"] == "rollout" and page["view"]["image"].startswith("data:image/png;base64,")
    assert wandb_html_keys(tmp_path) == {"attention/explorer"}


def test_vit_block_groups_class_token_and_checkpoint(tmp_path, cache_dir):
    from attnlab.tasks.vit import ImageClassificationTask

    cfg = compose_train(["model=vit", "debug=fast", "logger=csv", "norm=rms", "ffn=swiglu", "pos=sinusoidal",
                         "model.net.pool=cls", "test=false", *QUIET], tmp_path, cache_dir)
    metrics = run(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    task = ImageClassificationTask.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    net = task.net
    assert net.pool == "cls" and type(net.positions).__name__ == "SinusoidalPositions" and net.num_tokens == 17
    assert all(isinstance(b.sa_norm, torch.nn.RMSNorm) and b.ffn.gate_proj is not None for b in net.encoder.layers)
    assert sorted(p.name for p in next((tmp_path / "attention_maps").glob("epoch*")).glob("*.png"))[-1] == "rollout.png"


def test_vit_with_moe_composes_and_trains_a_step(tmp_path):
    from attnlab.modules.moe import MixtureOfExperts, moe_losses

    cfg = compose_train(["model=vit", "moe=on", "moe.num_experts=4", "model.net.n_layers=2"], tmp_path)
    task = build_model(cfg.model)
    assert all(isinstance(b.ffn, MixtureOfExperts) and b.ffn.num_experts == 4 for b in task.net.encoder.layers)
    loss = torch.nn.functional.cross_entropy(task(torch.randn(4, 1, 8, 8)), torch.arange(4))
    (loss + moe_losses(task.net)["moe/loss"]).backward()
    assert task.net.encoder.layers[0].ffn.router.weight.grad is not None


def test_vit_refuses_rotary_positions(tmp_path):
    cfg = compose_train(["model=vit", "pos=rotary"], tmp_path)
    with pytest.raises(InstantiationException, match="pos=rotary is a 1-D sequence position; patches sit on a 2-D"):
        build_model(cfg.model)


def test_vit_geometry_comes_from_the_data_config(tmp_path):
    cfg = compose_train(["model=vit", "data=cifar10", "model.net.patch_size=4"], tmp_path)
    OmegaConf.resolve(cfg)
    net = cfg.model.net
    assert (net.image_size, net.in_channels, net.num_classes) == (32, 3, 10)
    assert cfg.data.path.endswith("data/cifar-10-batches-py") and cfg.data.download is False
    assert build_model(cfg.model).net.num_patches == 64


def test_vit_on_cifar10_batches_end_to_end(tmp_path, cache_dir):
    """data=cifar10 through train.py on a tiny folder in the real batch format (nothing downloaded)."""
    from vision_helpers import write_tiny_cifar

    write_tiny_cifar(tmp_path / "cifar", n_per_batch=20)
    cfg = compose_train(["model=vit", "data=cifar10", f"data.path={tmp_path / 'cifar'}", "data.num_workers=0",
                         "model.net.patch_size=8", "debug=fast", "logger=csv", *QUIET], tmp_path / "run", cache_dir)
    metrics = run(cfg)
    assert 0 <= metrics["test/acc"] <= 1
    assert sorted(p.name for p in (tmp_path / "run" / "confusion_matrix").glob("*.png")) == ["epoch000.png", "test.png"]
