"""The masked language model's masking settings (``model.mask_prob``, ``model.mask_share``, ``model.random_share``),
without torch: checked once, by this type, from train.py's config check (the masked_lm family's rules) and from
:class:`~attnlab.tasks.masked_lm.MaskedLMTask` (a task built in Python gets the same line)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..modules.settings import Settings, setting
from ..core.value_checks import unit_interval


@dataclass(frozen=True)
class MaskingSettings(Settings):
    """Of the tokens, ``mask_prob`` are chosen to be predicted; of those, ``mask_share`` become [MASK] and
    ``random_share`` a random token, the rest stay as they are (BERT's 15%, 80/10/10)."""

    GROUP: ClassVar[str] = "model"

    mask_prob: float = setting(unit_interval, 0.15)
    mask_share: float = setting(unit_interval, 0.8)
    random_share: float = setting(unit_interval, 0.1)

    def relation_problems(self) -> list[str]:
        if self.mask_share + self.random_share > 1:
            return [f"model.mask_share={self.mask_share} + model.random_share={self.random_share} is more than 1 "
                    f"(shares of the chosen tokens)"]
        if self.mask_prob == 0:
            return ["model.mask_prob=0: no token would be chosen to predict"]
        return []
