"""Moved: the seeds' claims are experiments outside the package, ``experiments/claims/`` in the repository
(``python -m experiments.claims`` from its root). ``python -m attnlab.claims ...`` still forwards there, with a note."""
