"""Every option of conf/optim and conf/sched (read from the folders: a new YAML is tested by adding it): built the
way train.py builds it, it resumes exactly (optimizer and schedule state through a weights_only round trip, the
next step bit for bit the uninterrupted one's), and every schedule warms up and ends where its config says."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from helpers import compose_train
from omegaconf import OmegaConf, open_dict

from attnlab.checkpoints.allowed_targets import UnsafeTargetError, check_targets
from attnlab.optim import build_lr_schedule, build_optimizer
from attnlab.core.paths import CONF_DIR
from attnlab.runs.build import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

OPTIMS = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))
SCHEDS = sorted(p.stem for p in (CONF_DIR / "sched").glob("*.yaml"))
TOTAL, BEFORE = 8, 5  # optimizer steps of the run; steps before the save (past warm-up: debug=fast warms up 2)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The causal LM of debug=fast with one layer; the groups are swapped in below as Hydra puts them (under
    their group's name, interpolations resolved against this model's values)."""
    return compose_train(["model=causal_lm", "debug=fast", "model.net.n_layers=1", "logger=none"],
                         tmp_path_factory.mktemp("optim"))


def with_option(cfg, group: str, name: str):
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg[group] = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    return cfg


def _task(cfg):
    torch.manual_seed(0)
    task = build_model(cfg.model, cfg.optim, cfg.sched)
    opt = build_optimizer(task.net, task.optimizer_cfg, "32-true")
    return task, opt, build_lr_schedule(opt, task.scheduler_cfg, TOTAL)


def _step(task, opt, sched, batch):
    logits = task.net(batch[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def _round_trip(obj):
    """As a checkpoint carries it: torch.save, then torch.load(weights_only=True) as every loader reads one."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("sched_name", SCHEDS)
@pytest.mark.parametrize("optim_name", OPTIMS)
def test_every_optimizer_and_schedule_resumes_exactly(base, optim_name, sched_name):
    cfg = with_option(with_option(base, "optim", optim_name), "sched", sched_name)
    task, opt, sched = _task(cfg)
    assert type(opt).__name__ == cfg.optim._target_.rsplit(".", 1)[-1]
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, cfg.data.vocab_size, (2, 9), generator=g) for _ in range(BEFORE + 1)]
    for b in batches[:BEFORE]:
        _step(task, opt, sched, b)
    saved = _round_trip({"net": task.net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()})
    _step(task, opt, sched, batches[BEFORE])  # the uninterrupted run's next step

    fresh, fresh_opt, fresh_sched = _task(cfg)  # a new process: new objects, the same config
    fresh.net.load_state_dict(saved["net"])
    fresh_opt.load_state_dict(saved["opt"])
    fresh_sched.load_state_dict(saved["sched"])
    _step(fresh, fresh_opt, fresh_sched, batches[BEFORE])
    for (name, a), b in zip(task.net.named_parameters(), fresh.net.parameters()):
        assert torch.equal(a, b), name
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in fresh_opt.param_groups]
    assert fresh_sched.last_epoch == BEFORE + 1
    # the steps changed the weights (an optimizer that did nothing would resume "exactly" too)
    torch.manual_seed(0)
    untouched = build_model(cfg.model).net
    assert all(not torch.equal(a, b) for a, b in zip(untouched.parameters(), task.net.parameters()))


@pytest.mark.parametrize("sched_name", SCHEDS)
def test_every_schedule_warms_up_and_ends_where_its_config_says(base, sched_name):
    cfg = OmegaConf.to_container(with_option(base, "sched", sched_name).sched, resolve=True)
    warmup = cfg["warmup_steps"]
    lr = torch.nn.Parameter(torch.zeros(1))
    sched = build_lr_schedule(torch.optim.SGD([lr], lr=1.0), cfg, TOTAL)
    multipliers = [sched.lr_lambdas[0](step) for step in range(TOTAL + 1)]
    assert multipliers[:warmup] == [(i + 1) / warmup for i in range(warmup)]
    assert multipliers[warmup] == 1.0 and max(multipliers) == 1.0
    assert multipliers[-1] == pytest.approx(cfg.get("min_lr_ratio", 1.0))
    assert all(a >= b for a, b in zip(multipliers[warmup:], multipliers[warmup + 1:]))  # never rises again


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(base):
    task, opt, _ = _task(with_option(base, "optim", "muon"))
    names = {id(p): n for n, p in task.net.named_parameters()}
    muon = sorted(names[id(p)] for g in opt.muon.param_groups for p in g["params"])
    adamw = sorted(names[id(p)] for g in opt.adamw.param_groups for p in g["params"])
    assert muon and all(n.startswith("decoder.layers.") and n.endswith(".weight") for n in muon), muon
    assert {"embed.weight", "positions.table"} <= set(adamw)  # the head is tied to embed.weight
    assert len(muon) + len(adamw) == len(names)


def test_a_checkpoint_may_name_the_options_of_conf_and_nothing_else(base):
    """What a task saves (its optimizer / scheduler configs) passes the checkpoint loaders' allow-list for every
    option of conf/optim and conf/sched; another optimizer class does not."""
    for group, key, names in (("optim", "optimizer", OPTIMS), ("sched", "scheduler", SCHEDS)):
        for name in names:
            saved = OmegaConf.to_container(with_option(base, group, name)[group], resolve=True)
            check_targets({key: saved}, f"{group}={name}")
    with pytest.raises(UnsafeTargetError, match=r"optimizer\._target_ = 'torch\.optim\.LBFGS'"):
        check_targets({"optimizer": {"_target_": "torch.optim.LBFGS", "_partial_": True}}, "a checkpoint")


@pytest.mark.parametrize("optim_name", OPTIMS)
def test_the_settings_flow_one_way(base, optim_name):
    """model.optimizer (the model's tuned values, what a user overrides) -> the chosen optim group (reads them) ->
    the task's ``optimizer`` argument -> the built optimizer; nothing is written back into the config."""
    cfg = with_option(base, "optim", optim_name)
    with open_dict(cfg):
        cfg.model.optimizer.lr = 0.0123
        cfg.model.optimizer.weight_decay = 0.0456
    before = OmegaConf.to_container(cfg, resolve=False)
    task, opt, _ = _task(cfg)
    assert OmegaConf.to_container(cfg, resolve=False) == before  # no write-back
    assert task.optimizer_cfg == OmegaConf.to_container(cfg.optim, resolve=True)  # the group, as the task saves it
    assert {g["initial_lr"] for g in opt.param_groups} == {0.0123}  # (lr: scaled by the warm-up)
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0456, 0.0}
