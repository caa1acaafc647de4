"""The Vision Transformer: ``model=vit``, images, served by ``train.py ckpt_path=... train=false``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..modules.settings import PositionSettings, position_kind
from ..core.value_checks import divisible, positive_int, same, table_rules
from . import BLOCK_GROUPS, Family


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    images = torch.randn(4, net.in_channels, net.image_size, net.image_size, generator=gen)
    return F.cross_entropy(net(images), torch.arange(4) % net.num_classes)


def _same_as_data(key: str):
    return same(f"model.net.{key}", f"data.{key}", f"the model is built for the images the data gives; set both "
                f"alike (or leave model.net.{key} at its default ${{data.{key}}})")


def _positions_on_the_grid(flat: Mapping[str, Any]) -> str | None:
    """The patches sit on a 2-D grid: positions of a 1-D sequence are refused before torch is imported, with the
    line the position part says when it is built on a grid."""
    return PositionSettings(kind=position_kind(flat.get("pos._target_"))).grid_problem()


FAMILY = Family(
    name="vit",
    task="attnlab.tasks.vit.ImageClassificationTask",
    net="attnlab.models.vit.VisionTransformer",
    data="images",
    groups=BLOCK_GROUPS,
    what="an image classifier",
    serves="train.py ckpt_path=... train=false",
    description="Vision Transformer: patches, a transformer encoder, the mean (or a class token), classes",
    rules=table_rules(
        [(f"model.net.{k}", positive_int) for k in ("image_size", "patch_size", "in_channels")],
        [divisible("model.net.image_size", "model.net.patch_size",
                   "the image is cut into patch_size × patch_size patches"),
         _same_as_data("image_size"), _same_as_data("in_channels"), _positions_on_the_grid]),
    batch_loss=batch_loss,
    # random crops and flips on: the augmentation is a function of (seed, epoch, item) too
    test_overrides=("data.crop_padding=1", "data.hflip=true", "data.repeats_per_epoch=1"),
    explorer_input="image",
)
