"""DDP equivalence: `trainer=ddp_cpu` (2 gloo processes, real `train.py` runs) trains the same parameters as one process.

Dropout off, so the only randomness is the data order, and every data module splits one ``(seed, epoch)`` plan
between the ranks (``attnlab.data.loading``). What one process must do to match depends on how the data is batched:

* fixed-size batches (LM windows, images, needle-recall sequences): 2 ranks × B per step == 1 process × 2B. Rank r takes items r, r+2, …
  of the plan, so a step of both ranks covers the 2B items of one single-process step; the loss is a mean over
  equal-sized batches, so the averaged gradients are the gradient of the 2B mean.
* whole-batch plans (translation pairs and utterances, batched by length): 2 ranks × B == 1 process × B with
  ``accumulate_grad_batches=2``. Rank r takes batches r, r+2, … of the plan; their token counts differ, so the
  ranks' averaged gradient is the mean of the two batch means, which is what accumulation computes, not the
  gradient of one doubled batch.

BatchNorm running statistics (the TTS prenet and postnet) are the one expected difference: they are buffers, not
trained parameters, and each rank (without SyncBatchNorm) updates them from its own batches only, so rank 0's saved
copy has seen half the batches. Every parameter and every other buffer is compared.

Tolerance: the computations differ only in the order of float additions (gloo's all-reduce, the accumulation
sum), so after a few AdamW steps parameters agree to 1e-5 (absolute); training moves them by far more (checked).
Every process runs one intra-op thread (matmuls split over another number of threads add in another order). One
part of the parameters gets a looser bound: the attention key biases. Adding b_k to every key adds the same q·b_k
to all of a query's scores, which the softmax ignores, so their true gradient is zero and what they get is float
noise; AdamW divides by the noise's own magnitude and turns it into steps of up to ~lr. They are compared to
lr × steps, and everything else to 1e-5.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import compose_train, run_cli

from attnlab.core.quoting import hydra_value
from attnlab.runs.build import build_model

STEPS = 4
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
BATCHNORM_STATS = ("running_mean", "running_var", "num_batches_tracked")
COMMON = ["debug=fast", "logger=csv", "test=false", "callbacks.attention_maps=null", "model.net.dropout=0.0",
          "trainer.limit_val_batches=2", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
TRANSLATION = ["data.train_size=300", "data.val_size=16", "data.test_size=16", "data.max_digits=4"]
# family: (overrides, batch size per rank, how one process matches 2 ranks)
CASES = {
    "causal_lm": (["model=causal_lm"], 4, "doubled batch"),
    # random crops and flips on: they are functions of (seed, epoch, item), not of the rank
    "vit": (["model=vit", "data.crop_padding=1", "data.hflip=true"], 8, "doubled batch"),
    "transformer_mt": (["model=transformer_mt", *TRANSLATION], 8, "accumulation"),
    "seq2seq_attention": (["model=seq2seq_attention", *TRANSLATION], 8, "accumulation"),
    "tts": (["model=tts", "data.num_utterances=40", "data.max_digits=2", "data.val_size=4", "data.test_size=4",
             "model.net.postnet_channels=16", "model.net.dec_prenet_dim=32", "model.net.dec_prenet_dropout=0.0",
             "model.griffin_lim_iters=2", "model.max_frames_per_char=3", "model.free_running_samples=1"],
            4, "accumulation"),
    "sequence_classifier": (["model=sequence_classifier", "data.train_size=256", "data.val_size=32",
                             "data.test_size=32"], 8, "doubled batch"),
}


def _key_bias(name: str, tensor: torch.Tensor) -> slice:
    """The key part of an attention projection's bias (fused q|k|v or, for cross-attention, k|v), else nothing."""
    if name.endswith("qkv_proj.bias"):
        d = tensor.shape[0] // 3
        return slice(d, 2 * d)
    if name.endswith("kv_proj.bias"):
        return slice(0, tensor.shape[0] // 2)
    return slice(0, 0)


def _params_at_init(cfg) -> dict[str, torch.Tensor]:
    L.seed_everything(cfg.seed)  # as train.run does before it builds the model
    return {f"net.{k}": v for k, v in build_model(cfg.model).net.state_dict().items()}


# The default suite keeps one family per way of matching 2 ranks (doubled batch: LM windows; accumulation:
# translation pairs, utterances with BatchNorm buffers); the RNN reads the same translation batches as the
# transformer, the classifier and the ViT (its crops and flips are functions of (seed, epoch, item), tested in
# tests/data) the same doubled batches as the LM: those three run with `-m slow` (the suite's 10-minute budget).
SAME_DATA_PATH_AS_ANOTHER = ("seq2seq_attention", "sequence_classifier", "vit")
# the suite's 10-minute budget: one family by default (the sampler and the gradient all-reduce are shared)
SLOW_FAMILIES = (*SAME_DATA_PATH_AS_ANOTHER, "causal_lm", "tts")


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f
                                    for f in CASES])
def test_two_ranks_train_what_one_process_trains(family, tmp_path, cache_dir):
    overrides, batch, match = CASES[family]
    common = [*COMMON, *overrides]
    if match == "doubled batch":
        single = [f"data.batch_size={2 * batch}", f"trainer.limit_train_batches={STEPS}"]
    else:
        single = [f"data.batch_size={batch}", "trainer.accumulate_grad_batches=2",
                  f"trainer.limit_train_batches={2 * STEPS}"]
    one = run_cli([*common, *single, f"hydra.run.dir={tmp_path}/single"], cache_dir, env=ONE_THREAD)
    assert one.returncode == 0, one.stdout[-3000:]
    # a run folder whose path has a space, a comma and parentheses: rank 1 re-parses it as a Hydra override (a
    # comma unquoted is a sweep list to Hydra: the child failed and Lightning killed the process group, exit 137)
    ddp_dir = tmp_path / "ddp run, (2 ranks)"
    two = run_cli([*common, "trainer=ddp_cpu", f"data.batch_size={batch}", f"trainer.limit_train_batches={STEPS}",
                   f"hydra.run.dir={hydra_value(ddp_dir)}"], cache_dir, env=ONE_THREAD)
    assert two.returncode == 0, two.stdout[-3000:]
    assert (ddp_dir / "ddp_rank1.log").exists()  # rank 1 really ran, in the same folder

    a = torch.load(tmp_path / "single/checkpoints/last.ckpt", weights_only=True)
    b = torch.load(ddp_dir / "checkpoints/last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == STEPS
    a, b = a["state_dict"], b["state_dict"]
    assert a.keys() == b.keys()
    batchnorm_stats = [k for k in a if k.endswith(BATCHNORM_STATS)]
    for k in batchnorm_stats:
        if k.endswith("num_batches_tracked"):  # rank 0 saw its STEPS batches, the single process 2 per step
            assert (int(a[k]), int(b[k])) == ((2 if match == "accumulation" else 1) * STEPS, STEPS), k
    cfg = compose_train(common, tmp_path / "init", cache_dir)
    for k in a.keys() - set(batchnorm_stats):
        atol = torch.full_like(a[k], 1e-5, dtype=torch.float32)
        atol[_key_bias(k, a[k])] = cfg.model.optimizer.lr * STEPS
        assert ((a[k] - b[k]).abs() <= atol).all(), f"{k}: max difference {(a[k] - b[k]).abs().max():.3g}"
    # training moved the weights well beyond the tolerance (the comparison is not between two initializations)
    start = _params_at_init(cfg)
    moved = max((a[k] - start[k]).abs().max().item() for k in start if k in a)
    assert moved > 1e-3, moved
