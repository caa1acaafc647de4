"""The encoder-only masked language model (BERT): ``model=masked_lm``, on the language model's text, served by
``train.py ckpt_path=... train=false`` (masked-token loss and accuracy on the test split)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..utils.validate import table_rules, unit_interval
from . import BLOCK_GROUPS, Family


def _shares(flat: Mapping[str, Any]) -> str | None:
    mask, random = flat.get("model.mask_share"), flat.get("model.random_share")
    if isinstance(mask, (int, float)) and isinstance(random, (int, float)) and mask + random > 1:
        return f"model.mask_share={mask} + model.random_share={random} is more than 1 (shares of the chosen tokens)"
    if flat.get("model.mask_prob") == 0:
        return "model.mask_prob=0: no token would be chosen to predict"
    return None


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
    rules=table_rules([(f"model.{k}", unit_interval) for k in ("mask_prob", "mask_share", "random_share")],
                      [_shares]),
    batch_loss=batch_loss,
    explorer_input="text",
)
