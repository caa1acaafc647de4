import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from attnlab.callbacks.attention_maps import AttentionMapCallback
from attnlab.callbacks.confusion_matrix import ConfusionMatrixCallback
from attnlab.data.digits import DigitsDataModule
from attnlab.modules.attention import capture_attention
from attnlab.tasks.vit import ImageClassificationTask


def net_cfg(**kw):
    return {"_target_": "attnlab.models.vit.VisionTransformer", "image_size": 8, "patch_size": 2, "in_channels": 1,
            "num_classes": 10, "d_model": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.0, **kw}


def test_attention_patch_defaults_to_the_centre_and_is_checked():
    assert ImageClassificationTask(net_cfg()).attention_patch == 2 * 4 + 2  # 4×4 grid: patch (2, 2)
    assert ImageClassificationTask(net_cfg(), attention_patch=5).attention_patch == 5
    with pytest.raises(ValueError, match="attention_patch=16 outside the 16 patches"):
        ImageClassificationTask(net_cfg(), attention_patch=16)


def test_throughput_protocol_counts_patches():
    task = ImageClassificationTask(net_cfg(pool="cls"))
    assert task.tokens_in_batch({"image": torch.zeros(5, 1, 8, 8)}) == 5 * 17
    assert task.flops_per_token() == task.net.flops_per_token() > 0


def test_render_attention_draws_each_layer_and_the_rollout(tmp_path):
    torch.manual_seed(0)
    task = ImageClassificationTask(net_cfg(pool="cls", n_layers=3)).eval()
    dm = DigitsDataModule()
    dm.setup()
    task._sample = dm.example_image()
    sample = task.attention_sample(max_tokens=4)  # the image is drawn whole whatever the callback's crop
    assert len(sample.queries) == len(sample.keys) == 17 and sample.queries[:2] == ["cls", "r0c0"]
    with torch.no_grad(), capture_attention(task) as maps:
        task.attention_forward(**sample.inputs)
    out = task.render_attention(dict(maps), sample)
    assert [k for k, _ in out] == [f"net.encoder.layers.{i}.self_attn" for i in range(3)] + ["rollout"]
    assert all(len(fig.axes) > 0 for _, fig in out)
    assert not list(tmp_path.iterdir())  # the task draws; files are the callback's


def test_callback_uses_render_attention(tmp_path):
    """A real Trainer on digits: the callback calls the task's renderer (not the heatmaps)."""
    torch.manual_seed(0)
    dm = DigitsDataModule(batch_size=32)
    task = ImageClassificationTask(net_cfg(), optimizer={"lr": 3e-3}, scheduler={"warmup_steps": 5})
    callback = AttentionMapCallback(dirpath=tmp_path / "maps", max_layers=1)  # max_layers: not for custom renderers
    trainer = L.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=1,
                        accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, logger=CSVLogger(tmp_path), default_root_dir=tmp_path,
                        callbacks=[callback, ConfusionMatrixCallback()])
    trainer.fit(task, datamodule=dm)
    assert sorted(p.name for p in callback.last_paths) == [
        "net.encoder.layers.0.self_attn.png", "net.encoder.layers.1.self_attn.png", "rollout.png"]
    # one per validation epoch, none for the sanity check
    assert sorted(p.name for p in (tmp_path / "confusion_matrix").glob("*.png")) == ["epoch000.png", "epoch001.png"]
    assert 0 <= trainer.callback_metrics["val/acc"] <= 1
    assert int(task.confusion_result("val").matrix.sum()) == 2 * 32  # the last validation's 2 batches of 32
