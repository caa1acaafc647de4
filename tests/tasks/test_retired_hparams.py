"""Checkpoints saved before the media settings moved to callbacks (``attention_tokens``, ``table_size``,
``audio_samples`` in their hyper-parameters) still load into every task class; the legacy LM and MT files of
tests/fixtures are loaded through the CLIs in tests/test_safe_checkpoints.py."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from attnlab.tasks.translation import TranslationTask
from attnlab.tasks.translation_nat import NATTranslationTask
from attnlab.tasks.vit import ImageClassificationTask

RETIRED = {"attention_tokens": 16, "table_size": 8, "audio_samples": True}
NAT = {"_target_": "attnlab.models.transformer_nat.TransformerNAT", "vocab_size": 40, "d_model": 16, "n_layers": 1,
       "n_heads": 2, "max_len": 24, "dropout": 0.0, "max_length_offset": 8}
MT = {**NAT, "_target_": "attnlab.models.transformer_mt.TransformerMT"}
MT.pop("max_length_offset")
VIT = {"_target_": "attnlab.models.vit.VisionTransformer", "image_size": 8, "patch_size": 2, "in_channels": 1,
       "num_classes": 10, "d_model": 16, "n_layers": 1, "n_heads": 2, "dropout": 0.0}


@pytest.mark.parametrize("task_cls,net,extra", [(TranslationTask, MT, {}),
                                                 (NATTranslationTask, NAT, {"length_scale": 1.5}),
                                                 (ImageClassificationTask, VIT, {"attention_patch": 3})],
                         ids=lambda v: getattr(v, "__name__", None))
def test_a_checkpoint_with_retired_arguments_loads(task_cls, net, extra, tmp_path):
    task = task_cls(net=net, **extra)
    old = {"state_dict": task.state_dict(), "hyper_parameters": {**dict(task.hparams), **RETIRED},
           "pytorch-lightning_version": L.__version__}
    torch.save(old, tmp_path / "old.ckpt")
    loaded = task_cls.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=True)
    assert type(loaded) is task_cls and not set(RETIRED) & set(loaded.hparams)
    for k, v in extra.items():
        assert getattr(loaded, k) == v
    for k, v in task.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
