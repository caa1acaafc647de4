"""Exact resume: 12 steps straight == 5 steps, stop (mid-epoch), resume from the checkpoint, 7 more steps.

Identical parameters, bit for bit, on CPU in deterministic mode, with dropout on: optimizer, scheduler and loop
state (Lightning), the data position inside the epoch (``MidEpochResume``) and the random state (``Task``) all
come back. Every model family of the registry takes part, with its data module.
"""

from __future__ import annotations

import pytest
import torch
from helpers import compose_train

from attnlab.families import families
from attnlab.cli.train import run

COMMON = ["debug=fast", "logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
          "test=false", "trainer.deterministic=true", "trainer.max_epochs=10", "model.net.dropout=0.1",
          "callbacks.attention_maps=null", "callbacks.model_checkpoint.monitor=null",
          "+callbacks.model_checkpoint.every_n_train_steps=1",  # last.ckpt after every step: the final state
          "+sched.total_steps=12"]  # the same LR schedule whatever max_steps the part stops at
# every registered family (attnlab.families), with the overrides that make its run tiny
FAMILIES = {f.name: [f"model={f.name}", *f.test_overrides] for f in families()}
# -m slow (the 10-minute budget): families whose data module and loop another family already runs here
SLOW = {"transformer_nat", "seq2seq_attention", "sequence_classifier"}


def final_state(out, cache_dir, *extra):
    run(compose_train([*COMMON, *extra], out, cache_dir))
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    return ckpt


@pytest.mark.parametrize("family", [pytest.param(f, marks=[pytest.mark.slow] if f in SLOW else [])
                                    for f in FAMILIES])
def test_stop_and_resume_mid_epoch_equals_training_straight(family, tmp_path, cache_dir):
    model = FAMILIES[family]
    straight = final_state(tmp_path / "straight", cache_dir, *model, "trainer.max_steps=12")
    first = final_state(tmp_path / "first", cache_dir, *model, "trainer.max_steps=5")
    assert first["global_step"] == 5 and first["epoch"] == 0  # stopped inside the first epoch (8 batches)
    resumed = final_state(tmp_path / "resumed", cache_dir, *model, "trainer.max_steps=12",
                          f"ckpt_path={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}")
    assert straight["global_step"] == resumed["global_step"] == 12
    a, b = straight["state_dict"], resumed["state_dict"]
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
