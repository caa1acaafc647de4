"""Analyses of trained models: attention rollout, alignment with known chunks, surface forms, and the probes the
claims use on any model of a family (lm_probes: losses with/without the mask, attention entropy, q/k gradient;
translation_eval: decoding a test split side by side; equivariance: the shuffle test of an encoder). No training code.
"""
