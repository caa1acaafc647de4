"""``python -m bench --quick --only P8``: the mha / gqa / mqa table, through the real entry point (~3 s)."""

import pytest
from helpers import run_bench_quick


def test_p8_quick_table_has_cache_ratios_and_speeds():
    out = run_bench_quick("P8")
    assert "**P8 KV cache of mha / gqa / mqa" in out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith(("| 1 |", "| 8 |"))]
    assert [tuple(r[:3]) for r in rows] == [(b, a, kv) for b in ("1", "8")
                                            for a, kv in (("mha", "6"), ("gqa", "2"), ("mqa", "1"))]
    # the cache shrinks by n_heads / kv_heads exactly, and so do the bytes; every row has a speed
    assert [r[5] for r in rows] == ["1.0×", "3.0×", "6.0×"] * 2
    mb = [float(r[4]) for r in rows]
    assert [3 * mb[1], 6 * mb[2], mb[3] / 8] == pytest.approx([mb[0]] * 3, rel=0.01)  # printed to 3 digits
    assert all(float(r[6].replace(",", "")) > 0 for r in rows)
