""""Nothing is downloaded": the default job (numbers corpus, joint BPE, transformer, W&B offline) prepares its data
into an empty cache and trains with every socket to the outside world refused.

pytest-socket's `disable_socket(allow_unix_socket=True)` replaces `socket.socket` in this process: creating any
socket but a Unix one raises `SocketBlockedError` (a RuntimeError), and so do name lookups. Code that swallows
exceptions could hide a refused attempt, so the test also records every such attempt and asserts there was none.
Unix sockets stay allowed (they never leave the machine; W&B offline needs one, see `sockets_refused`); no TCP socket
is allowed, not even to localhost. Subprocesses are not covered by an in-process patch, so data preparation and
training run in this process (`train.run`). W&B's own service process (wandb-core) is covered by the second test,
which runs `python train.py` inside a network namespace where no interface is up, not even loopback (`unshare -n`;
skipped where the machine does not allow one).
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import socket
import subprocess
import sys

import hydra
import pytest
import pytest_socket  # the dev extra's pytest-socket
from helpers import compose_train

from attnlab.cli.compare import main as compare_main
from attnlab.core.paths import ROOT
from attnlab.cli.train import run, write_metrics
from attnlab.cli.workspace import main as workspace_main

if str(ROOT) not in sys.path:  # the claims live in experiments/ at the repository root (as tests/claims/ does)
    sys.path.insert(0, str(ROOT))
from experiments.claims.report import write_report  # noqa: E402

# pytest-socket warns on every refusal; the refusals here are this file's own checks
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket")

# The default job with a smaller corpus and model: the same code paths (num2words, BPE training, the transformer,
# W&B offline, checkpoints, attention maps, translation tables), seconds instead of minutes.
TINY_DEFAULT = ["debug=fast", "data.train_size=600", "data.val_size=40", "data.test_size=40", "data.max_digits=4",
                "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]


@pytest.fixture
def sockets_refused():
    """pytest-socket's guard for this test, Unix sockets allowed; yields the list of every other socket this process
    tried to create and every name it tried to resolve, recorded even when the caller catches the refusal.

    Unix sockets: W&B talks to its service process (wandb-core) over one, and asyncio's event loop wakes itself
    through a Unix socket pair; neither can leave the machine. With them refused too, `wandb.init` waited for its
    service forever (measured: no error after 10 minutes), hence also the watchdog below.
    """
    # urllib3 probes for IPv6 support when first imported (urllib3.util.connection._has_ipv6: it binds a socket to
    # ::1, connects nowhere); a library imports it lazily mid-run, so import it before the guard goes on
    import urllib3.util.connection  # noqa: F401

    true_socket, true_getaddrinfo = socket.socket, socket.getaddrinfo
    pytest_socket.disable_socket(allow_unix_socket=True)
    guarded_socket, guarded_getaddrinfo = socket.socket, socket.getaddrinfo
    attempts: list = []

    class RecordingSocket(guarded_socket):
        def __new__(cls, family=-1, type=-1, proto=-1, fileno=None):  # noqa: A002
            if family != socket.AF_UNIX:
                attempts.append(("socket", family, type))
            return guarded_socket.__new__(cls, family, type, proto, fileno)

    def recording_getaddrinfo(*args, **kwargs):
        attempts.append(("getaddrinfo", args[:2]))
        return guarded_getaddrinfo(*args, **kwargs)

    socket.socket, socket.getaddrinfo = RecordingSocket, recording_getaddrinfo
    # a refused socket that some library retries forever must fail the suite, not hang it
    faulthandler.dump_traceback_later(300, exit=True)
    try:
        yield attempts
    finally:
        faulthandler.cancel_dump_traceback_later()
        pytest_socket.enable_socket()
        # enable_socket only restores what it replaced itself; the recording wrappers are ours to undo
        socket.socket, socket.getaddrinfo = true_socket, true_getaddrinfo


def test_a_swallowed_attempt_is_still_recorded(sockets_refused):
    """What the main test relies on: a library that catches the refusal cannot hide the attempt."""
    import urllib.request

    try:
        urllib.request.urlopen("http://example.com/", timeout=1)  # noqa: S310
    except Exception:  # noqa: BLE001 - swallowed, as a careless downloader would
        pass
    assert sockets_refused and sockets_refused[0][0] in ("getaddrinfo", "socket")


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="W&B's service needs a Unix socket to run offline here")
def test_default_job_prepares_data_and_trains_with_sockets_refused(tmp_path, one_thread, sockets_refused,
                                                                    monkeypatch):
    # WANDB_MODE unset, as on a user's machine (the suite sets it to offline; the namespace test below keeps that):
    # the logger's own `offline: true` must keep W&B off the network
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(RuntimeError):  # the guard is really on
        socket.create_connection(("example.com", 443), timeout=1)
    with pytest.raises(RuntimeError):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))
    sockets_refused.clear()

    cache = tmp_path / "cache"  # empty: the corpus and the tokenizer are made here, not read from a warm cache
    cfg = compose_train(TINY_DEFAULT, tmp_path / "run", str(cache))
    assert cfg.data.source == "numbers" and cfg.logger.wandb.offline is True  # the default job's data and logger

    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert list(cache.glob("numbers/*/train.tsv")) and list(cache.glob("tokenizers/bpe-*.json"))

    metrics = run(cfg)
    assert "test/bleu" in metrics and "val/loss" in metrics  # fit and test finished
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert sockets_refused == []

    # the review tools on that run, still with every socket refused: compare and the W&B workspace builder (on a
    # sweep of copies of it under two settings; the workspace reads their offline W&B runs), the claims report
    # (docs/results/*.json)
    sweep = tmp_path / "sweep"
    for i, norm in enumerate(["pre", "pre", "rms", "rms"]):
        job = sweep / str(i)
        shutil.copytree(run_dir, job, ignore=shutil.ignore_patterns("*.ckpt"))
        (job / ".hydra").mkdir(exist_ok=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- norm={norm}\n- seed={i % 2}\n")
        write_metrics(job, metrics)  # as train.py writes it after run()
    assert compare_main([str(sweep), "--by", "norm", "--out", str(tmp_path / "comparison")]) == 0
    assert workspace_main([str(sweep), "--out", str(tmp_path / "workspace.json")]) == 0
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "results", docs / "results")
    assert write_report(docs).is_file()
    assert sockets_refused == []


def _network_namespace_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _network_namespace_available(), reason="`unshare -n` (a network namespace) is not allowed here")
def test_train_py_runs_in_a_network_namespace(tmp_path):
    """The whole process tree, W&B's service process included, in a network namespace: no interface up, not even
    loopback, so no connection can leave the process tree."""
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    env = {**os.environ, "WANDB_SILENT": "true", "ATTNLAB_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(["unshare", "-n", sys.executable, "train.py", *TINY_DEFAULT, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert (run_dir / "metrics.json").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_sockets_work_again_after_the_guarded_test():
    """The guard is undone for the tests that follow in the same process (name lookups included)."""
    assert socket.getaddrinfo("localhost", None)
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
