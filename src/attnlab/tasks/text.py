"""What the tasks over the language models' text (LMDataModule windows of ``input_ids``) share: the attention
sample is the start of the fixed validation text, MFU counts every token of a batch, and checkpoints carry the
tokenizer so that an entry point needs nothing else."""

from __future__ import annotations

from torch import Tensor

from .protocols import AttentionSample


class TextTask:
    """Mixin for a :class:`~attnlab.tasks.base.Task` whose net reads ``ids`` (B, T) of an LMDataModule; list it
    before ``Task``."""

    checkpoint_keys = ("tokenizer",)  # what an entry point needs from the checkpoint besides the model

    # --- protocols used by callbacks (attention maps, throughput) -------------------------------------------
    def tokens_in_batch(self, batch: dict) -> int:
        return batch["input_ids"].numel()

    def flops_per_token(self) -> float:
        return self.net.flops_per_token(self.trainer.datamodule.hparams.seq_len) if self._trainer else \
            self.net.flops_per_token(self.net.max_len)

    def attention_sample(self, max_tokens: int) -> AttentionSample:
        """The start of the datamodule's fixed validation text, as long as the callback draws."""
        dm = self.trainer.datamodule
        ids = dm.example_text(min(max_tokens, self.net.max_len))
        labels = [dm.tokenizer.id_to_token(int(i)) for i in ids[0]]
        return AttentionSample({"ids": ids}, labels, labels)

    def attention_forward(self, ids: Tensor) -> Tensor:
        return self.net(ids)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and getattr(dm, "tokenizer", None) is not None:
            checkpoint["tokenizer"] = dm.tokenizer.to_str()
