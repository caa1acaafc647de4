"""Exact resume: 12 steps straight == 5 steps, stop (mid-epoch), resume from the checkpoint, 7 more steps.

Identical parameters, bit for bit, on CPU in deterministic mode, with dropout on: optimizer, scheduler and loop
state (Lightning), the data position inside the epoch (``MidEpochResume``) and the random state (``Task``) all
come back. Each model family's data module takes part.
"""

from __future__ import annotations

import pytest
import torch
from helpers import compose_train

from attnlab.train import run

COMMON = ["debug=fast", "logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
          "test=false", "trainer.deterministic=true", "trainer.max_epochs=10", "model.net.dropout=0.1",
          "callbacks.attention_maps=null", "callbacks.model_checkpoint.monitor=null",
          "+callbacks.model_checkpoint.every_n_train_steps=1",  # last.ckpt after every step: the final state
          "+sched.total_steps=12"]  # the same LR schedule whatever max_steps the part stops at
FAMILIES = {
    "causal_lm": ["model=causal_lm"],
    "transformer_mt": ["model=transformer_mt", "data.train_size=300", "data.val_size=24", "data.test_size=24",
                       "data.max_digits=4"],
    "seq2seq_attention": ["model=seq2seq_attention", "data.train_size=300", "data.val_size=24",
                          "data.test_size=24", "data.max_digits=4"],
    # random crops and flips on: the augmentation is a function of (seed, epoch, item) too
    "vit": ["model=vit", "data.crop_padding=1", "data.hflip=true", "data.repeats_per_epoch=1"],
    # 40 utterances: 32 train in 8 batches of 4 (one epoch holds the stop at step 5); the decoder prenet's
    # always-on dropout is random state that must come back as well
    "tts": ["model=tts", "data.num_utterances=40", "data.max_digits=2", "data.val_size=4", "data.test_size=4",
            "data.batch_size=4", "model.net.postnet_channels=16", "model.net.dec_prenet_dim=32",
            "model.griffin_lim_iters=4", "model.max_frames_per_char=3", "model.free_running_samples=1"],
    "sequence_classifier": ["model=sequence_classifier", "data.train_size=256", "data.val_size=32",
                            "data.test_size=32"],
}


def final_state(out, cache_dir, *extra):
    run(compose_train([*COMMON, *extra], out, cache_dir))
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    return ckpt


@pytest.mark.parametrize("family", FAMILIES)
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
