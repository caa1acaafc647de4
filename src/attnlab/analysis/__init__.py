"""Analyses of trained models (attention rollout, ...): pure functions on tensors, no training code."""
