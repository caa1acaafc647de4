"""Timing, tables and machine facts shared by every comparison.

Every comparison times its sides *alternately in one process* (A B A B ...), after a warm-up of each, and keeps the
median: on a shared machine the load drifts over seconds, and alternating gives each side the same drift.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch


CLOCKS = {
    "wall": time.perf_counter,
    # CPU time of this process: on a machine shared with other jobs, the time it actually ran (one thread: with
    # several it adds them up, so only meaningful with --threads 1)
    "cpu": time.process_time,
}
_clock = CLOCKS["wall"]


def set_clock(name: str) -> None:
    """The clock every comparison times with (``python -m bench --clock``)."""
    global _clock
    _clock = CLOCKS[name]


def alternate(sides: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each side ``warmup`` times, then ``repeats`` rounds of one call per side; seconds per call per side."""
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeats):
        # reverse the order every other round so that neither side always runs right after the other's caches
        order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
        for name, fn in order:
            t0 = _clock()
            fn()
            times[name].append(_clock() - t0)
    return times


def choose_threads(requested: int | None) -> tuple[int, str]:
    """Intra-op threads for the whole bench, and why (printed with the machine facts): train.py's rule, the cores
    other processes leave free (attnlab.runs.threads)."""
    if requested:
        return requested, "--threads"
    from attnlab.runs.threads import choose, read_machine

    choice = choose(read_machine(), env=os.environ.get("OMP_NUM_THREADS"), option="--threads N")
    return choice.threads, choice.why


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    """min–max of the repeats relative to the median, so a reader sees how noisy a row was."""
    m = median(xs)
    return f"±{100 * max(m - min(xs), max(xs) - m) / m:.0f}%" if m > 0 and len(xs) > 1 else "-"


@dataclass
class Table:
    """One printed result table; ``ratio`` columns are what the comparison is about."""

    title: str
    columns: list[str]
    rows: list[list[object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # machine-readable facts beside the rows (e.g. which kernel ran), written by ``--json`` only
    meta: dict[str, object] = field(default_factory=dict)

    def add(self, *row: object) -> None:
        self.rows.append(list(row))

    def markdown(self) -> str:
        fmt = lambda v: f"{v:,.3g}" if isinstance(v, float) and abs(v) < 100 else (  # noqa: E731
            f"{v:,.0f}" if isinstance(v, float) else str(v))
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.rows]
        lines += [f"\n{n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        """The table for ``--json``: the raw values (unrounded numbers), each row also as a column -> value dict."""
        return {"title": self.title, "columns": self.columns, "rows": self.rows,
                "records": [dict(zip(self.columns, row)) for row in self.rows], "notes": self.notes,
                "meta": self.meta}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, str]:
    from attnlab.runs.hardware import cpu_flags

    flags = cpu_flags()
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"]
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    info = {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "cpu flags": " ".join(f"{f}{'+' if f in flags else '-'}" for f in wanted),
        "load average at start (1, 5, 15 min)": load,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:  # the version without importing it (seconds)
        info["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        info["transformers"] = "not installed (pip install -e '.[bench]')"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def fast_bf16() -> bool:
    from attnlab.runs.hardware import cpu_has_fast_bf16

    return bool(cpu_has_fast_bf16())


def hf_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


_PEAKS: dict = {}


def matmul_peak(dtype: torch.dtype) -> float:
    """The best of three ``measure_matmul_peak`` calls (the same function ThroughputMonitor uses), cached: one
    call on a loaded machine can catch a bad moment and read low, which would inflate every MFU."""
    from attnlab.callbacks.throughput import measure_matmul_peak

    if dtype not in _PEAKS:
        _PEAKS[dtype] = max(measure_matmul_peak(dtype, "cpu") for _ in range(3))
    return _PEAKS[dtype]
