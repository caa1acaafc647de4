"""Sparse mixture of experts (seed claim C16, E11: parameters grow with E, compute per token with k).

Router: logits = W_r x; p = softmax(logits); keep the top-k experts per token; renormalize their weights to sum
to 1 (Mixtral; with k = 1 the raw probability is kept, as in Switch, so the router still learns
from the task loss). Dispatch without a loop over tokens: the N·k (token, expert) assignments are sorted by expert so
that each expert sees one contiguous slice, runs once on it, and the results are scattered back weighted
(``index_add_``). The only Python loop is over the E experts.

Auxiliary losses (kept on the module after each forward; the task adds them to its loss and logs them):
* load balancing, on the scale of HF Mixtral's ``load_balancing_loss_func`` (Switch Transformer's at k = 1):
  E · Σ_e f_e · P_e, with f_e = (assignments to expert e) / N, the fraction of the N tokens that route to e (each
  token counts once in each of its k experts, so Σ_e f_e = k), and P_e the mean router probability of e. Its
  balanced value is k: a uniform router (every P_e = 1/E) gives exactly k, and so do uniform counts with uniform
  mean probabilities; all tokens on the same k experts with probability near 1 gives up to E. (It is not a strict
  lower bound: counts that anti-correlate with the mean probabilities can dip below k.) ``aux_loss_coef`` weights
  it as Switch's α and Mixtral's ``router_aux_loss_coef`` do. ``balance="layer"`` (the default, as Switch and
  ST-MoE): each layer's weighted term is added to the task loss (summed over layers). ``balance="pooled"`` (as HF
  Mixtral, which concatenates every layer's router logits before computing the loss): one term from the f_e and
  P_e of all layers' tokens together (each layer weighted by its token count: an encoder's source tokens and a
  decoder's target tokens may differ in number), so with L layers the same coefficient pushes about L× less than
  summed per-layer terms. ``moe/load_balance`` logs the mean of the layers' own values
  either way (k when balanced).
* router z-loss (ST-MoE): mean over tokens of logsumexp(logits)², keeps the router logits small.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from .settings import MoESettings


class MixtureOfExperts(nn.Module):
    def __init__(
        self,
        dim: int,
        experts: list[nn.Module],
        top_k: int = 2,
        aux_loss_coef: float = 0.01,
        z_loss_coef: float = 0.001,
        balance: str = "layer",
    ):
        super().__init__()
        # the moe group's values: the same check and line as train.py's
        MoESettings(num_experts=len(experts), top_k=top_k, aux_loss_coef=aux_loss_coef, z_loss_coef=z_loss_coef,
                    balance=balance)
        self.experts = nn.ModuleList(experts)
        self.router = nn.Linear(dim, len(experts), bias=False)
        self.top_k, self.aux_loss_coef, self.z_loss_coef = top_k, aux_loss_coef, z_loss_coef
        self.balance = balance
        # Filled by forward: scalar losses (with grad) and each expert's share of the N·k assignments (no grad).
        self.aux_loss: Tensor | None = None
        self.z_loss: Tensor | None = None
        self.expert_fraction: Tensor | None = None
        # The two factors of this layer's balance loss, kept for the pooled form: f_e (no grad), P_e (with grad).
        self.routed: Tensor | None = None
        self.mean_prob: Tensor | None = None
        self.n_tokens = 0

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, D) -> router logits (N, E) fp32, top-k expert ids (N, k), renormalized weights (N, k)."""
        logits, _, ids, weights = self._route(x)
        return logits, ids, weights

    def _route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        logits = self.router(x).float()  # the softmax and the z-loss want fp32 even under autocast
        probs = logits.softmax(dim=-1)  # also P_e of the load-balancing loss: computed once
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.top_k == 1:  # Switch: keep p itself, else the weight is 1 and the router gets no task gradient
            return logits, probs, ids, weights
        return logits, probs, ids, weights / weights.sum(dim=-1, keepdim=True)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, D)
        n, e, k = flat.shape[0], self.num_experts, self.top_k
        logits, probs, ids, weights = self._route(flat)

        assignment = ids.reshape(-1)  # (N·k,) expert of each (token, slot)
        order = assignment.argsort(stable=True)  # group the assignments by expert
        token = order // k  # (N·k,) token of each sorted assignment
        counts = torch.bincount(assignment, minlength=e)  # (E,)
        # index_select, not flat[token]: its backward is an index_add_, where advanced indexing's is a slower
        # accumulating index_put_ on CPU
        chunks = flat.index_select(0, token).split(counts.tolist())  # one contiguous slice per expert
        out = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, chunks)])  # (N·k, D)
        out = out * weights.reshape(-1).index_select(0, order)[:, None].to(out.dtype)
        y = torch.zeros(n, shape[-1], dtype=out.dtype, device=x.device).index_add_(0, token, out)

        routed = counts.float() / n  # f_e: share of tokens sent to e (sums to k, as Mixtral counts it)
        mean_prob = probs.mean(dim=0)  # P_e
        self.aux_loss = e * (routed * mean_prob).sum()
        self.routed, self.mean_prob, self.n_tokens = routed, mean_prob, n
        self.z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        self.expert_fraction = routed.detach() / k  # each expert's share of the N·k assignments (sums to 1)
        return y.reshape(shape)

    def loss(self) -> Tensor:
        """This layer's weighted auxiliary term to add to the task loss (after a forward), as ``balance="layer"``
        adds it; :func:`moe_losses` combines the layers for either form."""
        return self.aux_loss_coef * self.aux_loss + self.z_loss_coef * self.z_loss




def mixture_of_experts(
    dim: int,
    expert: Callable[[], nn.Module],
    num_experts: int = 8,
    top_k: int = 2,
    aux_loss_coef: float = 0.01,
    z_loss_coef: float = 0.001,
    balance: str = "layer",
) -> MixtureOfExperts:
    """The ``moe=on`` part (conf/moe/on.yaml, ``_partial_: true``): ``num_experts`` experts, each made by
    ``expert()`` (the block builder passes the ``ffn`` group's feed-forward), behind one router."""
    MoESettings(num_experts, top_k, aux_loss_coef, z_loss_coef, balance)  # before building num_experts experts
    return MixtureOfExperts(dim, [expert() for _ in range(num_experts)], top_k, aux_loss_coef, z_loss_coef, balance)


def moe_layers(model: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def moe_losses(model: nn.Module) -> dict[str, Tensor]:
    """Sum of the weighted auxiliary losses of every MoE layer, and its parts averaged over layers, for logging.

    Empty dict for a dense model, so callers can add ``out.get("moe/loss", 0)``.
    """
    layers = [m for m in moe_layers(model) if m.aux_loss is not None]
    if not layers:
        return {}
    forms = {(m.balance, m.aux_loss_coef, m.num_experts) for m in layers}
    if any(m.balance == "pooled" for m in layers):
        if len(forms) > 1:
            raise ValueError(f"a pooled balance loss needs the same balance, aux_loss_coef and number of experts in "
                             f"every MoE layer, got {sorted(forms)}")
        share = [m.n_tokens / sum(m.n_tokens for m in layers) for m in layers]  # of all layers' tokens
        routed = sum(w * m.routed for w, m in zip(share, layers))  # f_e over all layers' tokens
        mean_prob = sum(w * m.mean_prob for w, m in zip(share, layers))  # P_e over all layers' tokens
        balance = layers[0].num_experts * (routed * mean_prob).sum()
        loss = layers[0].aux_loss_coef * balance + sum(m.z_loss_coef * m.z_loss for m in layers)
    else:
        loss = sum(m.loss() for m in layers)
    return {
        "moe/loss": loss,
        "moe/load_balance": torch.stack([m.aux_loss for m in layers]).mean(),
        "moe/z_loss": torch.stack([m.z_loss for m in layers]).mean(),
    }


def expert_fractions(model: nn.Module) -> Tensor | None:
    """(layers, E) fraction of token assignments each expert received in the last forward."""
    fr = [m.expert_fraction for m in moe_layers(model) if m.expert_fraction is not None]
    return torch.stack(fr) if fr else None
