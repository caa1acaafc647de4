"""``python -m attnlab.torchrun <torchrun's flags> train.py ...``: torchrun whose waits are bounded and whose
failures are one line.

Why a wrapper and not only ``train.py``: torchrun meets the other nodes *before* it starts the script, so no script
can shorten or explain a node that never arrives. Plain torchrun waits 600 s in silence on node 0 (its static
rendezvous), retries the connection on the others, then prints two tracebacks; a worker that fails is reported in a
30-line box after the worker's own traceback. This runs torchrun's own code with torchrun's own parser (every flag
means what it means there) and changes three things:

- a missing node is waited for ``--rdzv-conf=timeout=<s>`` seconds, 50 by default (torchrun's own: 600);
  node 0 then names how many arrived, another node names the master it could not reach: one line each;
- the workers meet once more after their preflight, as long (:func:`attnlab.runs.ddp.meet_the_other_ranks`: a
  rank that refused its setting or crashed before Lightning's rendezvous, which waits 30 minutes, is named);
- a failed worker is one line naming the node, the rank and how it ended (its own last line, above it, says why),
  and the exit status is the worker's (2 for a refused setting, 1 for a failed run);
- torchrun's own error logging is quiet (the line above replaces it); its warnings stay.

Anything else (a bug in torchrun or here) keeps its traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time

DEFAULT_TIMEOUT_S = 50  # (+ start-up: a missing node is named within a minute)


def _with_timeout(rdzv_conf: str) -> tuple[str, int]:
    """``--rdzv-conf`` with ``timeout=`` added when the user gave none; and that timeout."""
    pairs = [p for p in rdzv_conf.split(",") if p.strip()]
    for p in pairs:
        key, _, value = p.partition("=")
        if key.strip() == "timeout" and value.strip().isdigit():
            return rdzv_conf, int(value)
    return ",".join([*pairs, f"timeout={DEFAULT_TIMEOUT_S}"]), DEFAULT_TIMEOUT_S


def _wait_for_master(addr: str, port: int, timeout_s: int) -> bool:
    """A node other than 0: True once node 0's rendezvous port accepts a connection (torchrun's own client
    retries for about twice its timeout, and names no node)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def _failure_line(node_rank: int, error) -> tuple[str, int]:
    """torchrun's ChildFailedError as one line and the exit status to end with (the first failure's)."""
    rank, failure = error.get_first_failure()
    how = (f"was ended by {failure.signal_name()}" if failure.exitcode < 0
           else f"ended with exit status {failure.exitcode}")
    more = len(error.failures) - 1
    others = f" ({more} more rank{'s' if more > 1 else ''} of this node failed after it)" if more else ""
    status = 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode
    return (f"attnlab.torchrun: node {node_rank}: rank {rank} (local rank {failure.local_rank}) {how}{others}; "
            f"its output above says why"), status


def main(argv: list[str] | None = None) -> int:
    from attnlab.runs.ddp import RENDEZVOUS_TIMEOUT_ENV
    from torch.distributed import DistError, run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv if argv is not None else sys.argv[1:])
    args.rdzv_conf, timeout_s = _with_timeout(args.rdzv_conf)
    os.environ[RENDEZVOUS_TIMEOUT_ENV] = str(timeout_s)  # the workers' own meeting (attnlab.runs.ddp) waits as long
    nnodes = args.nnodes
    static = args.rdzv_backend == "static" and not args.rdzv_endpoint and nnodes not in ("1", "1:1")
    addr, port = args.master_addr, args.master_port or 29500
    # the error lines of torchrun's agent repeat, as a log record, the failure reported below in one line
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    if static and args.node_rank > 0 and not _wait_for_master(addr, port, timeout_s):
        print(f"attnlab.torchrun: node {args.node_rank}: node 0 (the master, {addr}:{port}) did not answer within "
              f"{timeout_s} s: start it with the same command and --node-rank=0 (--rdzv-conf=timeout=<s> waits "
              f"longer)", file=sys.stderr, flush=True)
        return 1
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        line, status = _failure_line(args.node_rank, e)
        print(line, file=sys.stderr, flush=True)
        return status
    except DistError as e:  # the rendezvous: node 0 waited for the others, or a node lost the master
        message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        if "clients joined" in message:
            message = (f"not every node arrived at {addr}:{port} within {timeout_s} s ({message.rstrip('.')}): start "
                       f"the same command on each node with its own --node-rank (--rdzv-conf=timeout=<s> waits "
                       f"longer)")
        print(f"attnlab.torchrun: node {args.node_rank}: {message}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
