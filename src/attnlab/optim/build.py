"""Build the optimizer and the LR schedule a task's ``optimizer`` / ``scheduler`` configs name (conf/optim,
conf/sched). Each is a partial (``_target_``, its arguments, ``_partial_: true``), as Hydra builds it; it is
completed here: the optimizer with the model's parameter groups, the schedule with the run's length and step.

The settings flow one way: the model's tuned values (``model.optimizer.lr``, ``model.scheduler.warmup_steps``,
in its conf/model file: what a user overrides) are read by the chosen group's interpolations (``optim=sgd``
picks the class and reads the same values); the task gets the group as its ``optimizer`` argument and saves it;
nothing is written back.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, hidden_matrices: bool = False) -> list[dict]:
    """The parameter groups of every family and every optimizer: decay matrices and embeddings (dim >= 2), never
    biases or norm gains (nanoGPT/GPT-3 convention), in the model's parameter order.

    ``hidden_matrices`` (Muon): the decayed matrices are split further; the weights of the ``nn.Linear`` layers
    inside the net come first, in a group marked ``hidden: True``, and embeddings, learned position tables,
    recurrent and convolution weights and the output layers (a Linear named ``*head``, or one tied to an
    embedding) follow in a group of their own (Muon orthogonalizes hidden-layer matrices only; the rest is AdamW's,
    as Muon's documentation and the Moonlight recipe say)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if not hidden_matrices:
        return groups
    embedded = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    hidden = {id(m.weight) for name, m in model.named_modules()
              if isinstance(m, nn.Linear) and not name.rsplit(".", 1)[-1].endswith("head")
              and id(m.weight) not in embedded}
    return [{"params": [p for p in decay if id(p) in hidden], "weight_decay": weight_decay, "hidden": True},
            {"params": [p for p in decay if id(p) not in hidden], "weight_decay": weight_decay, "hidden": False},
            {**groups[1], "hidden": False}]


def _partial(cfg: dict) -> functools.partial:
    """The partial a config names (Hydra's instantiate of ``_target_`` with ``_partial_: true``), its list
    arguments as the tuples torch's signatures say (betas, Adafactor's eps)."""
    import hydra

    made = hydra.utils.instantiate({**cfg, "_partial_": True}, _convert_="all")
    return functools.partial(made.func, *made.args,
                             **{k: tuple(v) if isinstance(v, list) else v for k, v in made.keywords.items()})


def build_optimizer(model: nn.Module, cfg: dict, precision: Any = None) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names, completed with the model's parameter groups: :func:`param_groups` (the config's
    ``weight_decay`` on the matrices, none on the rest), or the class's own ``group_parameters(model,
    weight_decay)`` where it has one (:class:`~attnlab.optim.muon.MuonWithAdamW`: the hidden matrices apart).

    Fused where the class has a fused kernel and it is allowed: one kernel over every parameter instead of ~12
    tensor ops per parameter, measured 3-5x faster AdamW steps on CPU (bench P1). Not under mixed precision
    (``16-mixed``, ``bf16-mixed``): Lightning's mixed-precision plugin refuses gradient clipping with an optimizer
    that can unscale gradients itself, which a fused one declares (even for bf16, where there is no scaler)."""
    make = _partial(cfg)
    weight_decay = make.keywords.get("weight_decay", 0.0)
    group = getattr(make.func, "group_parameters", param_groups)
    groups = group(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    extra = {}
    if "fused" in inspect.signature(make.func).parameters and "fused" not in make.keywords:
        mixed = "mixed" in str(precision) or str(precision) in ("16", "half")
        supported = all(p.is_floating_point() and p.device.type in ("cpu", "cuda", "mps", "xpu") for p in params)
        extra["fused"] = bool(params) and supported and not mixed
    return make(groups, **extra)


def build_lr_schedule(optimizer: torch.optim.Optimizer, cfg: dict,
                      total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over the multiplier ``cfg`` names (:mod:`attnlab.optim.schedules`) for a run of ``total_steps``
    optimizer steps (the config's own ``total_steps`` wins: ``+sched.total_steps=N`` fixes the schedule whatever the
    run's length). A closure, not a callable object: LambdaLR would save an object's attributes and restore them on
    resume, and a resumed run must follow its config's schedule."""
    make = _partial(cfg)
    args = dict(make.keywords)
    total = args.pop("total_steps", None) or total_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: make.func(step, total, *make.args, **args))
