"""What a run prints: each of Lightning's lines once, and none of the notices that are not the user's to act on.

* Lightning's umbrella package gives its ``lightning`` logger a console handler of its own ("INFO: ...") and lets
  records propagate too, so under Hydra's logging (console and ``train.log``) every Lightning line was printed
  twice. With a root handler in place, the root handler alone prints them.
* Notices about Lightning's and W&B's own workings, printed on every run: Lightning's tip to install its cloud
  logger, that it kept the project's model summary, that it reads the train loader to count the steps; a
  deprecation inside Lightning's pytree helpers; W&B's note that the ``anonymous`` setting Lightning's logger
  passes has no effect.
"""

from __future__ import annotations

import logging
import warnings

# (logger, message prefix) of the lines dropped
NOTICES = (("lightning.pytorch.utilities.rank_zero", "💡 Tip"),
           ("lightning.pytorch.utilities.rank_zero", "Trainer already configured with model summary callbacks"),
           ("lightning.pytorch.utilities.rank_zero", "Loading `train_dataloader` to estimate number of stepping"))


class _DropNotices(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def tidy_lightning_output() -> None:
    """Once Lightning is imported (and Hydra has configured logging): its lines once, its notices dropped."""
    root = logging.getLogger()
    if root.handlers:
        lightning = logging.getLogger("lightning")
        for handler in list(lightning.handlers):
            if type(handler) is logging.StreamHandler:  # its own console handler, not a file a user added
                lightning.removeHandler(handler)
    for name, prefix in NOTICES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotices) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropNotices(prefix))
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def without_wandb_notices(loggers: list) -> None:
    """Lightning's W&B logger passes ``anonymous`` to ``wandb.init``, which only warns that it has no effect."""
    for lg in loggers:
        init = getattr(lg, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)
