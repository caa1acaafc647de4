"""The optimizer and the learning-rate schedule, as config-group parts (``optim=``, ``sched=``; conf/optim,
conf/sched). A task calls :func:`build_optimizer` and :func:`build_lr_schedule` in ``configure_optimizers``; what
they build is named by the configs' ``_target_``, so an optimizer or a schedule is added with one YAML file (and,
for a schedule, one function in :mod:`attnlab.optim.schedules`)."""

from .build import build_lr_schedule, build_optimizer, param_groups

__all__ = ["build_lr_schedule", "build_optimizer", "param_groups"]
