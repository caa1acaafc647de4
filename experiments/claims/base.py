"""What a claim is made of, and what its analysis gets to work with.

A :class:`Claim` names its training commands (``python train.py -m experiment=eNN_... a=x,y``, exactly what a user
would type) and an ``analyze(ctx) -> Result`` function. The runner (:mod:`experiments.claims.runner`) gives each command
its own sweep folder ``<claim dir>/<i>/``; :class:`Context` reads the jobs back from there (their overrides, final
``metrics.json``, CSV curves, checkpoints), and the analysis draws the figure into ``ctx.figure_path``. The verdict
is computed by the analysis from the numbers, by a rule written in the claim's module (:func:`verdict`,
:func:`verdict_of_parts`), never typed by hand.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from statistics import median
from typing import Any

from attnlab.runs.sweep_jobs import SweepJob, sweep_job_dirs

VERDICTS = ("reproduced", "partly reproduced", "not reproduced")

# --quick overrides shared by the claims of one family (tiny models; the runner adds short limits)
QUICK_LM = ["model.net.d_model=32", "model.net.n_layers=1", "data.seq_len=32", "data.batch_size=8"]
QUICK_MT = ["model.net.d_model=32", "model.net.n_layers=1", "model.net.n_heads=2"]
QUICK_RNN_NUMBERS = ["++model.net.d_model=32", "data.train_size=600", "data.val_size=40", "data.test_size=60",
                     "data.batch_size=16", "data.vocab_size=512"]
STEP_TIMES = ["callbacks.throughput.log_every_n_steps=1"]  # a step time per step, for claims that read perf/*


def verdict(full: bool, partly: bool) -> str:
    """The verdict of a rule: ``full`` reproduces the claim, else ``partly`` reproduces part of it."""
    return VERDICTS[0] if full else VERDICTS[1] if partly else VERDICTS[2]


def verdict_of_parts(*parts: bool) -> str:
    """Reproduced when every part of the claim holds, partly when some do, not when none does."""
    return verdict(all(parts), any(parts))


def interval_rule(diff: float, low: float | None, high: float | None, sign: int, bound: float = 0.0,
                  margin: float = 0.0) -> tuple[bool, bool]:
    """(holds, leans) of a difference claimed to lie on one side of ``bound`` (``sign`` +1: above, -1: below),
    e.g. from :func:`attnlab.cli.compare.welch` over the seeds. ``holds``: the whole interval lies on the claimed side
    (significant at its confidence); ``leans``: the mean does. With one seed per setting there is no interval:
    ``holds`` then needs the point difference beyond ``bound`` by more than ``margin`` (the run-to-run noise the
    claim allows a single run). A claim's verdict: reproduced when its parts hold, partly when some lean."""
    beyond = sign * (diff - bound)
    if low is None or high is None:
        return beyond > margin, beyond > 0
    nearest = low if sign > 0 else high  # the end of the interval nearest the bound
    return sign * (nearest - bound) > 0, beyond > 0


def interval(low: float | None, high: float | None, digits: int = 3) -> str | None:
    """An interval for the table and the text, ``[-0.012, +0.034]``; None without one (a single seed)."""
    return None if low is None else f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def reading(diff: float, low: float | None, high: float | None, p: float | None, holds: bool, leans: bool,
            claimed: str, single: str, digits: int = 3) -> str:
    """One part of a claim in words, for the evidence: ``+0.012, 95% interval [-0.004, +0.028] (Welch over the
    seeds, p = 0.12): higher on average, not significantly`` (``claimed``: "higher"; ``holds``/``leans`` from
    :func:`interval_rule`). Without an interval (one seed, or no spread between the seeds) it names the single-run
    rule ``single`` that decided instead."""
    if low is None:
        return f"{diff:+.{digits}f} (no interval; the single-run rule: {single})"
    way = (f"significantly {claimed}" if holds else f"{claimed} on average, not significantly" if leans
           else f"not {claimed}")
    return f"{diff:+.{digits}f}, 95% interval {interval(low, high, digits)} (Welch over the seeds, p = {p:.2g}): {way}"


@dataclass(frozen=True)
class Claim:
    id: str  # "E9"
    title: str  # "RMSNorm vs LayerNorm"
    statement: str  # the seed's claim, in English (docs/claims.md)
    commands: list[str]  # shell commands, run in order from the repository root
    analyze: Callable[["Context"], "Result"]
    # appended to every train.py command with --quick (tiny models for the tests), besides the runner's limits
    quick: list[str] = field(default_factory=list)
    # appended under --quick to the commands other than train.py (a bench), when they need other flags than those
    # train.py gets; None: ``quick`` goes to every command
    quick_other: list[str] | None = None
    # other claims whose runs this one's analysis reads (ctx.other(id)); the runner runs them first if missing
    uses: tuple[str, ...] = ()
    minutes: float = 5.0  # expected wall time on 2 CPU cores, all commands together
    # seeds per setting: the runner adds `seed=0,…,seeds-1` to each train.py sweep (2 with --quick) that sets no
    # seed, and the analysis compares settings with intervals over them (ctx.compare); 1 = a single run each
    seeds: int = 1


@dataclass
class Result:
    rows: list[dict[str, Any]]  # the comparison table: one dict per setting, same keys in every row
    headline: str  # one sentence with the number that answers the claim
    verdict: str  # one of VERDICTS
    evidence: str  # why that verdict, from the numbers
    notes: str = ""  # caveats, sizes, what was not tried

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}; choose one of {', '.join(VERDICTS)}")


class Job(SweepJob):
    """One finished Hydra job (a run directory) of a claim's sweep: its overrides, group choices, config and seed
    (read by :class:`attnlab.runs.sweep_jobs.SweepJob`, shared with ``python -m attnlab.compare``), and what the claims
    read from it."""

    @cached_property
    def metrics(self) -> dict[str, float]:
        """Final metrics (after fit and test) from ``metrics.json``; a one-line error if the job did not finish."""
        if not self.finished:
            raise RuntimeError(f"{self.dir} has no metrics.json (the job did not finish: {self.why_unfinished()})")
        return self.final

    def metric(self, key: str) -> float:
        if key not in self.metrics:
            raise KeyError(f"{self.dir}/metrics.json has no {key!r}; it has {sorted(self.metrics)}")
        return self.metrics[key]

    def curve(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one logged metric from the CSV logger (``csv/version_*/metrics.csv``)."""
        steps, values = [], []
        for path in sorted(self.dir.glob("csv/version_*/metrics.csv")):
            with path.open() as f:
                for row in csv.DictReader(f):
                    if row.get(key) not in (None, ""):
                        steps.append(int(float(row["step"])))
                        values.append(float(row[key]))
        if not steps:
            raise KeyError(f"{self.dir} logged no {key!r} (is the csv logger on? the experiment configs add it)")
        return steps, values

    def median_step_ms(self) -> float:
        """Median training step time of the throughput callback's windows (the first, with warm-up, left out)."""
        _, times = self.curve("perf/step_time_ms")
        return median(times[1:] or times)

    @property
    def checkpoint(self) -> Path:
        """The best checkpoint (what the test used), else last.ckpt."""
        ckpts = self.dir / "checkpoints"
        best = sorted(p for p in ckpts.glob("*.ckpt") if p.name != "last.ckpt")
        if best:
            return best[-1]
        if (ckpts / "last.ckpt").is_file():
            return ckpts / "last.ckpt"
        raise FileNotFoundError(f"no checkpoint under {ckpts}")


@dataclass
class Context:
    """What ``analyze`` gets: where the claim's runs are, where to draw, and whether this is a --quick run."""

    claim: Claim
    dir: Path  # <out>/<id>: command i's sweep is dir/i
    figure_path: Path
    quick: bool = False
    out_root: Path | None = None  # <out>: other claims' runs are out_root/<id>

    def jobs(self, command: int = 0) -> list[Job]:
        return sweep_jobs(self.dir / str(command))

    def jobs_of(self, command: int = 0, **overrides: Any) -> list[Job]:
        """The jobs of command ``command`` whose overrides include these (``jobs_of(norm='rms')``: every seed of that
        setting; dots as ``__``)."""
        want = {k.replace("__", "."): str(v) for k, v in overrides.items()}
        return [j for j in self.jobs(command) if all(j.overrides.get(k) == v for k, v in want.items())]

    def job(self, command: int = 0, **overrides: Any) -> Job:
        """The one job of command ``command`` whose overrides include these (``job(norm='rms')``; dots as ``__``)."""
        found = self.jobs_of(command, **overrides)
        if len(found) != 1:
            seeds = f" (seeds {sorted(j.seed for j in found)}: use ctx.jobs_of or ctx.compare)" if found else ""
            raise LookupError(f"{len(found)} jobs of {self.dir / str(command)} match {overrides}{seeds}")
        return found[0]

    def compare(self, by: str, metric: str, baseline: Any = None, command: int = 0, mode: str = "auto",
                confidence: float = 0.95):
        """Command ``command``'s settings of ``by`` over their seeds (:func:`attnlab.cli.compare.compare`, the code of
        ``python -m attnlab.compare``): per setting n, mean ± std, and the difference to ``baseline`` with its
        interval and p-value."""
        from attnlab.cli.compare import compare

        return compare(self.dir / str(command), by, metric, None if baseline is None else str(baseline), mode,
                       confidence, job_class=Job)

    def settings(self, key: str, labels: dict[Any, str], command: int = 0):
        """(value, label, job) for each swept value of the override ``key`` (dots as in the command line), in the
        order of ``labels`` ({value: label for the table and the figure})."""
        for value, label in labels.items():
            yield value, label, self.job(command, **{key.replace(".", "__"): value})

    def other(self, claim_id: str) -> "Context":
        from . import get_claim

        root = self.out_root or self.dir.parent
        return Context(get_claim(claim_id), root / claim_id, self.figure_path, self.quick, root)


def sweep_jobs(sweep_dir: Path) -> list[Job]:
    """The jobs of one multirun folder in job order (0, 1, …, 10), or the folder itself if it is a single run."""
    if not Path(sweep_dir).is_dir():
        raise FileNotFoundError(f"no runs under {sweep_dir}")
    return [Job(p) for p in sweep_job_dirs(sweep_dir)]


def fmt(x: float, digits: int = 3) -> float | None:
    """A float rounded for the table (None for NaN, so the JSON stays valid)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)
