"""P7: what ``ThroughputMonitor`` logs during training (``perf/tokens_per_sec``, ``perf/mfu``) vs the bench's own
measurement, on the P2 runs (shared with P2 when both are selected; monitor window 2 steps, warm-up window
dropped). The monitor is given the bench's measured fp32 matmul peak, so MFU differs only through throughput
and the FLOP count (the task's ``flops_per_token`` vs ``CausalLM.flops_per_token`` called here).

Two references: the same Lightning runs timed from outside (end of each step, steady state), and the plain loop
of P2 (the bench's number for this model; it excludes Lightning's overhead, so it may read a few % higher).
"""

from __future__ import annotations

from .common import Table, median
from .p2_lightning import _steady, measure, peak_cached


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    peak = peak_cached()
    res = measure(quick, repeats or (2 if quick else 3), peak)
    tok = res["batch"] * res["seq"]
    mon_tps = median([w[0] for w in res["monitor"]])
    mfus = [w[1] for w in res["monitor"] if w[1] is not None]
    mon_mfu = median(mfus) if mfus else float("nan")
    ext_tps = median([tok / _steady(t.ends, res["warm"]) for t in res["external"]])
    plain_tps = tok / median(res["plain"])
    table = Table("P7 ThroughputMonitor (logged during training) vs the bench, P2's runs",
                  ["quantity", "monitor (median of windows)", "bench", "monitor/bench", "within 10%"])

    def row(name, mon, ref):
        r = mon / ref
        table.add(name, mon, ref, f"{r:.3f}", "yes" if abs(r - 1) <= 0.10 else "no")

    row("tokens/s vs the same Lightning runs timed from outside", mon_tps, ext_tps)
    row("tokens/s vs the plain loop (P2)", mon_tps, plain_tps)
    fpt = res["fpt"]
    table.add("MFU vs the same runs timed from outside", f"{100 * mon_mfu:.2f}%",
              f"{100 * ext_tps * fpt / peak:.2f}%", f"{mon_mfu / (ext_tps * fpt / peak):.3f}",
              "yes" if abs(mon_mfu / (ext_tps * fpt / peak) - 1) <= 0.10 else "no")
    table.add("MFU vs the plain loop (P2)", f"{100 * mon_mfu:.2f}%", f"{100 * plain_tps * fpt / peak:.2f}%",
              f"{mon_mfu / (plain_tps * fpt / peak):.3f}",
              "yes" if abs(mon_mfu / (plain_tps * fpt / peak) - 1) <= 0.10 else "no")
    table.notes.append(f"fp32 matmul peak measured by the bench: {peak / 1e9:.1f} GFLOP/s; "
                       f"{len(res['monitor'])} monitor windows.")
    return [table]
