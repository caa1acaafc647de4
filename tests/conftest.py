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


# Tests measured at 15 s or more (2 AVX2-only cores): collected first, so that under xdist the last tests to run
# are short ones and neither worker idles through another's long tail. Only the order changes.
# The longest first.
LONG_FIRST = ("tests/test_optuna_sweeper.py",
              "tests/test_sweep_continue.py", "tests/test_two_nodes.py",
              "tests/claims/test_framework.py::test_quick_claim_end_to_end", "tests/test_wheel_install.py",
              "tests/test_offline.py", "tests/test_notebooks.py", "tests/test_preloaded_python.py",
              "tests/test_resume_anywhere.py", "tests/test_bad_inputs.py::test_every_generated_bad_value",
              "tests/callbacks/test_preemption.py", "tests/test_ddp_equivalence.py", "tests/test_compare.py",
              "tests/models/test_transformer_nat.py", "tests/callbacks/test_nonfinite.py", "tests/test_run_lock.py",
              "tests/bench/test_bench_runs.py", "tests/test_files_stay_in_folder.py",
              "tests/test_init_from_library_lm.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:  # the longest first, in LONG_FIRST's order; the rest as collected (a stable sort)
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)


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
