"""P2: the project's training machinery (``attnlab.cli.train.run``: the composed Hydra config, LMDataModule,
CausalLMTask, Lightning Trainer with the default callbacks) vs a plain PyTorch loop over the same model, data,
optimizer, schedule and gradient clipping. Shape: the default LM (``conf/model/causal_lm.yaml``).

Each side runs ``steps`` optimizer steps per round; its step time is the steady-state interval between the ends
of step ``warm`` and of the last step (so data loading, callbacks and logging between steps are counted).
Rounds alternate Lightning / plain. P7 reads the ThroughputMonitor's logged values from the same Lightning runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from attnlab.core.paths import CONF_DIR
from attnlab.optim import build_lr_schedule, build_optimizer
from attnlab.tasks.base import build_net
from attnlab.tasks.causal_lm import lm_loss

from .common import Table, matmul_peak, median, spread


class StepTimer(L.Callback):
    """perf_counter at the end of every training batch; the monitor's last logged values when they change."""

    last: "StepTimer | None" = None  # the instance train.run built from the config, read after the run

    def __init__(self):
        StepTimer.last = self
        self.ends: list[float] = []
        self.monitor: list[tuple[float, float | None]] = []  # (tokens/s, mfu) per logged window

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ends.append(time.perf_counter())
        m = trainer.callback_metrics
        tps = m.get("perf/tokens_per_sec")
        if tps is not None and (not self.monitor or float(tps) != self.monitor[-1][0]):
            mfu = m.get("perf/mfu")
            self.monitor.append((float(tps), float(mfu) if mfu is not None else None))


def compose_cfg(overrides: list[str], out_dir: str):
    """conf/train.yaml composed as ``python train.py <overrides>`` would (outputs in ``out_dir``)."""
    import attnlab.runs.resume

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = out_dir
        del cfg["hydra"]
    return cfg


@contextlib.contextmanager
def quiet():
    """Keep the run's progress bar and log lines out of the bench's tables (they still run and cost time)."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        # Lightning's loggers keep handlers bound to the real stderr: raise their levels for the run
        names = ["lightning", "lightning.pytorch", "lightning.fabric", "attnlab"] + [
            n for n in logging.root.manager.loggerDict if n.startswith(("lightning.", "attnlab."))]
        levels = {n: logging.getLogger(n).level for n in names}
        for n in names:
            logging.getLogger(n).setLevel(logging.ERROR)
        try:
            yield
        finally:
            for n, lv in levels.items():
                logging.getLogger(n).setLevel(lv)


def _steady(ends: list[float], warm: int) -> float:
    """Seconds per step from the end of step ``warm`` to the end of the last one."""
    return (ends[-1] - ends[warm - 1]) / (len(ends) - warm)


@functools.cache
def measure(quick: bool, repeats: int, peak_flops: float) -> dict:
    from attnlab.cli import train

    batch, steps, warm = (8, 6, 2) if quick else (32, 10, 3)
    overrides = ["model=causal_lm", "trainer=cpu", "logger=csv", f"data.batch_size={batch}",
                 f"trainer.max_steps={steps}",
                 "+trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0", "test=false",
                 "callbacks.throughput.log_every_n_steps=2", f"callbacks.throughput.peak_flops={peak_flops}"]
    results = {"lightning": [], "plain": [], "monitor": [], "external": []}
    threads = torch.get_num_threads()
    for r in range(repeats):
        for side in (("lightning", "plain") if r % 2 == 0 else ("plain", "lightning")):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = compose_cfg(overrides, tmp)
                if side == "lightning":
                    with open_dict(cfg):  # appended last: it sees the monitor's fresh values
                        cfg.callbacks.bench_timer = {"_target_": "bench.p2_lightning.StepTimer"}
                    with quiet():
                        train.run(cfg)
                    timer = StepTimer.last
                    results["lightning"].append(_steady(timer.ends, warm))
                    results["external"].append(timer)
                    results["monitor"] += [w for w in timer.monitor[1:]]  # the first window holds warm-up
                else:
                    with quiet():
                        results["plain"].append(_steady(plain_loop(cfg, steps), warm))
                torch.set_num_threads(threads)  # in case anything changed it
    seq = cfg.data.seq_len
    net = build_net(cfg.model.net)
    return {"batch": batch, "seq": seq, "steps": steps, "warm": warm, "fpt": net.flops_per_token(seq), **results}


def plain_loop(cfg, steps: int) -> list[float]:
    """The same training, by hand: seed, data, net, the optim/sched groups' optimizer and schedule, clipping, the
    task's loss."""
    import hydra

    L.seed_everything(cfg.seed, workers=True)
    dm = hydra.utils.instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    net = build_net(cfg.model.net)
    net.train()
    container = functools.partial(OmegaConf.to_container, resolve=True)
    opt = build_optimizer(net, container(cfg.optim), cfg.trainer.precision)
    sched = build_lr_schedule(opt, {**container(cfg.sched), "total_steps": steps}, steps)
    ends = []
    for i, b in enumerate(dm.train_dataloader()):
        if i == steps:
            break
        loss = lm_loss(net, b["input_ids"], b["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    return ends


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    res = measure(quick, repeats or (2 if quick else 3), peak_cached())
    tok = res["batch"] * res["seq"]
    lt, pt = median(res["lightning"]), median(res["plain"])
    table = Table(f"P2 Lightning overhead: train.py machinery vs a plain loop, default LM (d=192, L=4, T={res['seq']}, "
                  f"V=4096), batch {res['batch']}, fp32, {res['steps']} steps/round, steady state after "
                  f"{res['warm']}", ["side", "step ms", "tokens/s", "spread"])
    table.add("plain PyTorch loop", 1000 * pt, tok / pt, spread(res["plain"]))
    table.add("Task + Lightning Trainer (default callbacks, csv logger)", 1000 * lt, tok / lt,
              spread(res["lightning"]))
    table.add("ratio Lightning/plain (target ≤ 1.05×)", f"{lt / pt:.3f}×", "", "")
    return [table]


def peak_cached() -> float:
    return matmul_peak(torch.float32)
