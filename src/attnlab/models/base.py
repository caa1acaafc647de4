"""What every transformer family here shares: parameter counts (total and active), the FLOPs estimate, the weight
initialization, and the config groups' parts.

A family's model subclasses :class:`TransformerModel`, builds its stacks with :func:`~attnlab.modules.stack.build_stack`
and says two things about itself: which parameters are lookup tables (:meth:`lookup_tables`: token and position
tables, a class token; read by index, not multiplied) and which output layers run once per sequence rather than per
token (:meth:`sequence_heads`: a classifier's head). Everything else is derived.

Init schemes (``init`` in each model config):

* ``gpt2`` (language model, translation): every linear map and embedding N(0, 0.02), biases 0; the projections that
  write into the residual stream (attention ``out_proj``, feed-forward ``down_proj``) N(0, 0.02/√(2L)) with L the
  layers of all stacks, so the stream's variance does not grow with depth (GPT-2).
* ``xavier`` (ViT, TTS, sequence classifier): Xavier-uniform linear maps (and the ViT's patch convolution, as the
  linear map it is), biases 0, embeddings left at PyTorch's N(0, 1). GPT's fixed 0.02 is made for d ≈ 768; at the
  widths a CPU trains (d = 64) it starts every attention map uniform and, measured on digits, the ViT learned ~2×
  slower.
"""

from __future__ import annotations

import math

from torch import nn

from ..modules.attention import is_attention_module
from ..modules.moe import moe_layers
from ..modules.stack import TransformerStack

INIT_SCHEMES = ("gpt2", "xavier")


class TransformerModel(nn.Module):
    d_model: int

    # --- what a family says about itself ------------------------------------------------------------------------
    def lookup_tables(self) -> list[nn.Parameter]:
        """Parameters read by index (token/position tables, class tokens): not counted as non-embedding."""
        return []

    def sequence_heads(self) -> list[nn.Module]:
        """Output layers applied once per sequence (a classifier's head), not once per token."""
        return []

    @property
    def default_seq_len(self) -> int:
        return self.max_len

    # --- derived ---------------------------------------------------------------------------------------------
    def stacks(self) -> list[TransformerStack]:
        return [m for m in self.modules() if isinstance(m, TransformerStack)]

    @property
    def n_layers_total(self) -> int:
        return sum(len(s) for s in self.stacks())

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters (each shared one once); without the lookup tables with ``non_embedding`` (scaling laws)."""
        total = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return total
        tables = {id(p): p for p in self.lookup_tables() if p is not None}
        return total - sum(p.numel() for p in tables.values())

    def active_params(self) -> int:
        """Non-embedding parameters one token passes through: a mixture of experts counts its router and top-k of
        its E experts."""
        n = self.num_params(non_embedding=True)
        for m in moe_layers(self):
            n -= sum(p.numel() for p in m.experts[0].parameters()) * (m.num_experts - m.top_k)
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), the PaLM/nanoGPT estimate: 6 per weight a token is
        multiplied by, plus 12·d·T per attention module for the scores and their weighted sum.

        A head tied to the token table is a matmul though its weight is a lookup table: counted. A head run once
        per sequence is spread over its T tokens."""
        t = seq_len or self.default_seq_len
        matmul = self.active_params()
        tables = {id(p) for p in self.lookup_tables() if p is not None}
        for head in self._token_heads():
            matmul += sum(p.numel() for p in head.parameters() if id(p) in tables)
        per_sequence = sum(p.numel() for h in self.sequence_heads() for p in h.parameters())
        attention = sum(1 for m in self.modules() if is_attention_module(m))
        return float(6 * (matmul - per_sequence) + 6 * per_sequence / t + 12 * attention * self.d_model * t)

    def _token_heads(self) -> list[nn.Module]:
        head = getattr(self, "head", None)
        return [head] if isinstance(head, nn.Module) and head not in self.sequence_heads() else []

    def init_weights(self, scheme: str, *, zero_heads: tuple[nn.Module, ...] = ()) -> None:
        """Initialize every linear map (and embedding) by ``scheme`` (see the module docstring); ``zero_heads``
        start at zero (ViT: uniform predictions)."""
        if scheme not in INIT_SCHEMES:
            raise ValueError(f"unknown init {scheme!r}; choose one of {', '.join(INIT_SCHEMES)}")
        for m in self.modules():
            if scheme == "gpt2" and isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            elif scheme == "xavier" and isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.xavier_uniform_(m.weight.view(m.weight.shape[0], -1))
            else:
                continue
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        if scheme == "gpt2":
            std = 0.02 / math.sqrt(2 * max(1, self.n_layers_total))
            for stack in self.stacks():
                for name, p in stack.named_parameters():
                    if name.endswith(("out_proj.weight", "down_proj.weight")):
                        nn.init.normal_(p, mean=0.0, std=std)
        for head in zero_heads:
            for p in head.parameters():
                nn.init.zeros_(p)
