"""Shared test set-up: offline W&B, one torch thread per xdist worker, a composed-config fixture."""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: a second intra-op thread per worker only contends (measured ~10x slower); set before
    # torch loads its OpenMP runtime, so the processes the tests start (train.py, DDP ranks) use one thread too
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One data/tokenizer cache for the whole session (tokenizers take a second or two to train)."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-matrix tests: on a small shared CPU a second thread only contends
    for a busy core (measured 10-30x slower). Modules opt in with ``pytestmark = pytest.mark.usefixtures(...)``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
