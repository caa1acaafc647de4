"""Decoding shared by every autoregressive model: a small step interface plus the search/sampling loops."""

from .beam import BeamResult, beam_search, greedy_search
from .options import DecodingOptions, SamplingOptions
from .sampling import filter_logits, generate, sample_next
from .step import CausalLMStepper, Stepper

__all__ = ["BeamResult", "CausalLMStepper", "DecodingOptions", "SamplingOptions", "Stepper", "beam_search",
           "filter_logits", "generate", "greedy_search", "sample_next"]
