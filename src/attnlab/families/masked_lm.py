"""The encoder-only masked language model (BERT): ``model=masked_lm``, on the language model's text, served by
``train.py ckpt_path=... train=false`` (masked-token loss and accuracy on the test split)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..tasks.masking import MaskingSettings
from . import BLOCK_GROUPS, Family


def _masking(flat: Mapping[str, Any]) -> list[str]:
    """The masking settings' own checks (the task makes the same settings from its arguments)."""
    return MaskingSettings.problems_in(flat)


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    from ..tasks.masked_lm import mask_tokens

    ids = torch.randint(4, net.mask_id, (4, 12), generator=gen)
    inputs, chosen = mask_tokens(ids, net.mask_id, mask_prob=0.3, generator=gen)
    return F.cross_entropy(net(inputs)[chosen], ids[chosen])


FAMILY = Family(
    name="masked_lm",
    task="attnlab.tasks.masked_lm.MaskedLMTask",
    net="attnlab.models.masked_lm.MaskedLM",
    data="lm_text",
    groups=BLOCK_GROUPS,
    what="a masked language model",
    serves="train.py ckpt_path=... train=false",
    description="encoder-only masked language model (BERT): 15% of the tokens masked 80/10/10, predicted from both "
                "sides",
    rules=_masking,
    batch_loss=batch_loss,
    explorer_input="text",
)
