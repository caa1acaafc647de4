"""What the machine can do fast, to warn before a run takes a slow path."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_fast_bf16() -> bool | None:
    """True with AMX or AVX512-BF16 (native bf16 matmuls); False without; None if unknown (not Linux)."""
    flags = cpu_flags()
    if not flags:
        return None
    return bool({"amx_bf16", "avx512_bf16"} & flags)


def slow_bf16_warning(precision: str, accelerator: str) -> str | None:
    """A warning when bf16 would run emulated on this CPU (measured: ~50x slower than fp32 on AVX2 only)."""
    if "bf16" not in str(precision) or accelerator not in ("cpu", "auto"):
        return None
    if accelerator == "auto":
        import torch

        if torch.cuda.is_available():
            return None
    if cpu_has_fast_bf16() is False:
        return (f"precision={precision} on a CPU without AMX/AVX512-BF16: bf16 matmuls are emulated and much "
                "slower than fp32 here; use precision=32-true on this machine")
    return None
