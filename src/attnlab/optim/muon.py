"""Muon on the hidden layers' matrices, AdamW on every other parameter, as one optimizer.

``torch.optim.Muon`` orthogonalizes 2-D hidden-layer weights only; its documentation leaves embeddings, output
layers, biases and norm gains to "a standard method such as AdamW". Lightning's automatic optimization steps one
optimizer, so the pair is one :class:`torch.optim.Optimizer` here: its param groups are the two inner optimizers'
groups (the same dicts: a ``LambdaLR`` on it scales both) and its state is theirs (one dict, keyed by parameter),
so ``state_dict``/``load_state_dict`` are the base class's and a checkpoint resumes both exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .build import param_groups


class MuonWithAdamW(torch.optim.Optimizer):
    """Groups marked ``hidden: True`` (:meth:`group_parameters`, which ``build_optimizer`` calls) go to Muon,
    the rest to AdamW; ``lr`` and ``weight_decay`` are shared (``adjust_lr_fn="match_rms_adamw"`` scales Muon's
    update to AdamW's RMS so that one learning rate serves both, per Moonshot's "Muon is Scalable")."""

    @staticmethod
    def group_parameters(model: torch.nn.Module, weight_decay: float) -> list[dict]:
        """The model's parameter groups with the hidden layers' matrices apart, marked ``hidden: True``."""
        return param_groups(model, weight_decay, hidden_matrices=True)

    def __init__(self, params: Iterable[dict], lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, adjust_lr_fn: str | None = "match_rms_adamw",
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8):
        groups = [g for g in params if g["params"]]
        hidden = [g for g in groups if g.get("hidden")]
        rest = [g for g in groups if not g.get("hidden")]
        self.muon = torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay, momentum=momentum,
                                     nesterov=nesterov, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn) \
            if hidden else None
        self.adamw = torch.optim.AdamW(rest, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay) \
            if rest else None
        # no defaults of its own: each group keeps exactly its inner optimizer's settings
        super().__init__([g for opt in self._inner() for g in opt.param_groups], {})
        self._share()

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [opt for opt in (self.muon, self.adamw) if opt is not None]

    def _share(self) -> None:
        """Point the inner optimizers at this one's param groups (in order) and state."""
        start = 0
        for opt in self._inner():
            n = len(opt.param_groups)
            opt.__setstate__({"param_groups": self.param_groups[start:start + n], "state": self.state})
            start += n

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # replaces self.param_groups and self.state with new objects
        self._share()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._inner():
            opt.step()
        return loss
