"""Experiments that use attnlab but are not part of it (the seeds' claims: ``python -m experiments.claims``).

Run from the repository root, like ``python -m bench``: they call the repository's ``train.py`` and write into its
``docs/`` and ``outputs/``.
"""
