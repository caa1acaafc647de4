"""How to decode, as typed objects: built once (from a CLI's config, a task's ``decoding.val`` / ``.test``, or in
code), checked once when built, and passed down to the search as they are.

:class:`DecodingOptions` is the search of a translation: beam search and greedy decoding read ``beam_size``,
``n_best``, ``length_penalty``, the length limit and ``force_eos_at_max_len``, ``min_len``, ``early_stopping`` (see
:func:`~attnlab.decoding.beam.beam_search`). The length limit of a row is ``max_new_tokens`` when given, else
``int(max_len_a · source length + max_len_b)`` (:meth:`DecodingOptions.limits`).

:class:`SamplingOptions` is a language model's continuation: ``max_new_tokens``, ``temperature``, ``top_k``,
``top_p`` (:func:`~attnlab.decoding.sampling.generate`).

A bad value is one line naming it and what is allowed: ``<key>=<value> is not allowed: <allowed>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from ..core.errors import OptionError


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # not NaN


class _Options:
    """What both option objects share: one message format for a bad value, and the build from a config."""

    def _check(self, rules: Iterable[tuple[str, bool, str]]) -> None:
        """Raise :class:`OptionError` for the first rule ``(key, ok, allowed)`` that fails."""
        for key, ok, allowed in rules:
            if not ok:
                value = getattr(self, key)
                shown = "null" if value is None else repr(value) if isinstance(value, str) else str(value)
                raise OptionError(f"{key}={shown} is not allowed: {allowed}")

    @classmethod
    def from_config(cls, cfg: Mapping, **overrides: Any):
        """The options a config names (a CLI's, a task's ``decoding.val``); its other keys are not these options'."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: cfg[k] for k in names if k in cfg}, **overrides)


@dataclass(frozen=True)
class DecodingOptions(_Options):
    beam_size: int = 1
    n_best: int = 1
    length_penalty: float = 1.0
    max_len_a: float = 2.0
    max_len_b: int = 10
    max_new_tokens: int | None = None
    force_eos_at_max_len: bool = True
    min_len: int = 0
    early_stopping: bool = False

    def __post_init__(self):
        rules = (
            ("beam_size", _int(self.beam_size) and self.beam_size >= 1, "an integer >= 1 (1 = greedy)"),
            ("n_best", _int(self.n_best) and 1 <= self.n_best <= (self.beam_size if _int(self.beam_size) else 1),
             f"an integer from 1 to beam_size ({self.beam_size})"),
            ("length_penalty", _number(self.length_penalty), "a number (0: plain sum of log-probabilities)"),
            ("max_len_a", _number(self.max_len_a) and self.max_len_a >= 0, "a number >= 0"),
            ("max_len_b", _int(self.max_len_b) and self.max_len_b >= 0, "an integer >= 0"),
            ("max_new_tokens", self.max_new_tokens is None or (_int(self.max_new_tokens) and self.max_new_tokens >= 1),
             "an integer >= 1"),
            ("force_eos_at_max_len", isinstance(self.force_eos_at_max_len, bool), "true (fairseq: EOS forced and "
             "scored at the length limit) or false (a hypothesis at the limit ends there without EOS)"),
            ("min_len", _int(self.min_len) and self.min_len >= 0, "an integer >= 0"),
            ("early_stopping", isinstance(self.early_stopping, bool), "true or false"),
        )
        self._check(rules)

    def limits(self, lengths: Tensor | Sequence[int], max_len: int | None = None) -> list[int]:
        """Each row's maximum of new tokens: ``max_new_tokens``, or ``a · length + b`` (at least 1); ``max_len``: the
        model's position table, of which the prefix (<bos>) takes one position (a forced EOS needs no input one)."""
        lengths = torch.as_tensor(lengths)
        if self.max_new_tokens is not None:
            limits = torch.full_like(lengths, self.max_new_tokens)
        else:
            limits = (self.max_len_a * lengths.float() + self.max_len_b).long()
        limits = limits.clamp(min=1)
        return (limits.clamp(max=max_len - 1) if max_len is not None else limits).tolist()


@dataclass(frozen=True)
class SamplingOptions(_Options):
    """How :func:`~attnlab.decoding.sampling.generate` continues a prefix: at most ``max_new_tokens`` tokens, each
    drawn from the softmax of the logits / ``temperature`` (0: the argmax) after the top-k and nucleus (top-p)
    filters. ``top_k`` 0 and ``top_p`` 1 mean no filter and are stored as None, so that no filter is one value."""

    max_new_tokens: int = 100
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        self._check((
            ("max_new_tokens", _int(self.max_new_tokens) and self.max_new_tokens >= 1, "an integer >= 1"),
            # logits / temperature overflows float32 below ~1e-30 (NaN probabilities); 1e-6 already samples the argmax
            ("temperature", _number(self.temperature) and (self.temperature == 0 or 1e-6 <= self.temperature <= 1e6),
             "0 (greedy) or a number from 1e-6 to 1e6"),
            ("top_k", self.top_k is None or (_int(self.top_k) and self.top_k >= 0),
             "an integer >= 1, or 0 / null for no top-k filter"),
            ("top_p", self.top_p is None or (_number(self.top_p) and 0 < self.top_p <= 1),
             "a number in (0, 1], or 1 / null for no nucleus filter"),
        ))
        object.__setattr__(self, "top_k", self.top_k or None)
        object.__setattr__(self, "top_p", None if self.top_p is None or self.top_p >= 1 else self.top_p)

    @property
    def greedy(self) -> bool:
        """Temperature 0: every token is the argmax (no draw, no filter)."""
        return self.temperature == 0
