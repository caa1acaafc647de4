"""Decoding shared by every autoregressive model: a small step interface plus the search/sampling loops."""

from .sampling import filter_logits, generate, sample_next
from .step import CausalLMStepper, Stepper

__all__ = ["CausalLMStepper", "Stepper", "filter_logits", "generate", "sample_next"]
