"""The model summary at the start of training: each top module's parameters, and the totals; no FLOPs column.

Lightning's summary counts FLOPs by running ``example_input_array`` through the model; the tasks here set none
(their inputs differ by family), so its "FLOPs" column and "Total FLOPs" line read 0 on every run. FLOPs are
measured where they mean something: the throughput callback logs the model's FLOPs per token and the MFU. The
summary goes through the log, so it is in ``train.log`` too.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

log = logging.getLogger(__name__)

HIDDEN = ("FLOPs",)


class ModelSummary(LightningModelSummary):
    def __init__(self, max_depth: int = 1) -> None:  # (no **kwargs: an argument it does not take is refused)
        super().__init__(max_depth=max_depth)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int = 0,
                  **summarize_kwargs: Any) -> None:
        columns = [(name, [str(v) for v in values]) for name, values in summary_data if name not in HIDDEN]
        widths = [max(len(name), *(len(v) for v in values)) if values else len(name) for name, values in columns]
        rows = [" | ".join(name.ljust(w) for (name, _), w in zip(columns, widths))]
        rows.append("-+-".join("-" * w for w in widths))
        for i in range(len(columns[0][1]) if columns else 0):
            rows.append(" | ".join(values[i].ljust(w) for (_, values), w in zip(columns, widths)))
        rows += [f"{get_human_readable_count(trainable_parameters)} trainable params, "
                 f"{get_human_readable_count(total_parameters - trainable_parameters)} non-trainable, "
                 f"{get_human_readable_count(total_parameters)} in all ({get_formatted_model_size(model_size)} MB); "
                 f"modules in train mode: {total_training_modes.get('train', 0)}, in eval mode: "
                 f"{total_training_modes.get('eval', 0)}"]
        log.info("model summary:\n" + "\n".join(rows))
