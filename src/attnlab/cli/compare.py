"""Compare the settings of a seed sweep: ``python -m attnlab.compare <sweep dir> --by norm --metric val/loss``.

A sweep such as ``python train.py -m norm=pre,rms seed=0,1,2`` gives each setting (here a norm) several seeds. For
each setting this prints and writes the number of seeds, the mean ± standard deviation of the metric's final value
(``metrics.json``, else the last logged value), and its difference to a baseline setting with a confidence interval
and a p-value from Welch's t-test (unequal variances; scipy), so that "RMSNorm beats LayerNorm" is read against the
spread between seeds rather than from one run each. Differences whose interval excludes zero are significant. A
figure shows each setting's curve over steps: the mean over seeds with a ± std band.

``--test paired`` pairs the jobs of two settings by seed and tests the per-seed differences instead (a paired
t-test). A seed here draws the initialization and the data split, so two settings run at one seed share both; the
pairing removes that shared part of the seed-to-seed spread, and the interval is narrower when the settings move
together over seeds. Seeds that only one setting ran are left out of its pairs (and noted).

Writes ``<out>.md`` (the table), ``<out>.csv`` (the numbers, full precision) and ``<out>.png`` (the curves); by
default ``<sweep dir>/compare-<by>-<metric>``. The same code is a library: :func:`compare` returns a
:class:`Comparison` (the notebooks and the claims use it).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files.atomic import write_atomic
from ..core.errors import CompareError, UserError, one_line_message
from ..runs.sweep_jobs import SweepJob, sweep_jobs
from ..runs.sweep import override_key, setting_overrides

# metrics for which lower is better (--mode auto); anything else (acc, bleu, chrf, exact_match, mfu) is higher-better
LOWER_IS_BETTER = ("loss", "ppl", "perplexity", "error", "wer", "cer", "time", "_ms", "bpc")


@dataclass
class SettingStats:
    """One row of the comparison: a setting's seeds, and its difference to the baseline setting."""

    setting: str
    values: list[float]  # the metric's final value, one per seed, in job order
    seeds: list[int | None]
    jobs: list[str]  # job folder names
    mean: float = math.nan
    std: float | None = None  # sample standard deviation (ddof=1); None with one seed
    diff: float | None = None  # mean - baseline mean; None for the baseline itself
    ci_low: float | None = None  # the interval of diff at the comparison's confidence; None with n=1 on a side
    ci_high: float | None = None
    p_value: float | None = None  # Welch's (or the paired) t-test, two-sided
    pairs: list[int] | None = None  # --test paired: the seeds paired with the baseline's
    significant: bool | None = None  # the interval excludes 0 (p < 1 - confidence); None when not testable
    verdict: str = ""  # "baseline", "better", "worse", "no significant difference", "n/a (n=1)", ...

    @property
    def n(self) -> int:
        return len(self.values)


@dataclass
class Comparison:
    sweep_dir: Path
    metric: str
    by: list[str]
    baseline: str
    mode: str  # "min": lower is better, "max": higher is better
    confidence: float
    rows: list[SettingStats]
    test: str = "welch"  # "welch": two independent samples; "paired": per-seed differences
    jobs: dict[str, list[SweepJob]] = field(repr=False, default_factory=dict)  # setting -> its jobs
    notes: list[str] = field(default_factory=list)  # skipped jobs, pooled settings: printed under the table

    def row(self, setting: str) -> SettingStats:
        for r in self.rows:
            if r.setting == setting:
                return r
        raise CompareError(f"{setting!r} is not a setting; settings: {', '.join(r.setting for r in self.rows)}")

    # ---- the table -------------------------------------------------------------------------------------------
    def header(self) -> list[str]:
        ci = f"{self.confidence:.0%} CI"
        return [" ".join(self.by) or "setting", "n", "seeds", f"{self.metric} (mean ± std)",
                f"Δ vs {self.baseline}", ci, f"p ({self.test_name})", "significant"]

    @property
    def test_name(self) -> str:
        return "Welch" if self.test == "welch" else "paired t"

    def cells(self, r: SettingStats) -> list[str]:
        mean = _num(r.mean) + ("" if r.std is None else f" ± {_num(r.std)}")
        seeds = ",".join("?" if s is None else str(s) for s in r.seeds)
        if r.diff is None:
            return [r.setting, str(r.n), seeds, mean, "baseline", "", "", ""]
        ci = "" if r.ci_low is None else f"[{_num(r.ci_low, signed=True)}, {_num(r.ci_high, signed=True)}]"
        p = "" if r.p_value is None else f"{r.p_value:.3g}"
        return [r.setting, str(r.n), seeds, mean, _num(r.diff, signed=True), ci, p, r.verdict]

    def to_markdown(self) -> str:
        lines = ["| " + " | ".join(self.header()) + " |", "|" + "---|" * len(self.header())]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in self.cells(r)) + " |" for r in self.rows]
        better = "lower" if self.mode == "min" else "higher"
        how = ("Welch's t-test" if self.test == "welch" else
               "the paired t-test over the seeds both settings ran (Δ: the mean per-seed difference)")
        lines += ["", f"{self.metric}: final value per seed, {better} is better; Δ = setting − {self.baseline}, "
                      f"{self.confidence:.0%} confidence interval and p-value of {how}; significant when "
                      f"the interval excludes 0. Sweep: {self.sweep_dir}"]
        lines += [f"- note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def print(self, file=None) -> None:
        """The table as a rich table (plain text when not a terminal), then the notes."""
        from rich.console import Console
        from rich.table import Table

        console = Console(file=file or sys.stdout, width=160)
        table = Table(title=f"{self.metric} by {' '.join(self.by)} ({self.sweep_dir})", title_justify="left")
        for i, h in enumerate(self.header()):
            table.add_column(h, justify="left" if i in (0, 2, 7) else "right")
        for r in self.rows:
            style = "green" if r.verdict == "better" else "red" if r.verdict == "worse" else None
            table.add_row(*self.cells(r), style=style)
        console.print(table)
        for n in self.notes:
            console.print(f"note: {n}", highlight=False)

    def to_csv(self, path: str | Path) -> None:
        keys = ["setting", "n", "seeds", "mean", "std", "diff", "ci_low", "ci_high", "p_value", "significant",
                "verdict", "jobs", "paired_seeds"]
        text = io.StringIO(newline="")
        w = csv.writer(text)
        w.writerow(keys)
        for r in self.rows:
            w.writerow([r.setting, r.n, " ".join(str(s) for s in r.seeds), r.mean, _csv(r.std), _csv(r.diff),
                       _csv(r.ci_low), _csv(r.ci_high), _csv(r.p_value), _csv(r.significant), r.verdict,
                       " ".join(r.jobs), "" if r.pairs is None else " ".join(map(str, r.pairs))])
        write_atomic(path, text.getvalue(), durable=False)

    # ---- the figure ------------------------------------------------------------------------------------------
    def plot(self, path: str | Path | None = None, ax=None, key: str | None = None,
             labels: dict[str, str] | None = None):
        """Each setting's curve of ``key`` (default: the compared metric) over steps: the mean over its seeds at
        the steps they all logged, with a ± std band. ``labels``: a legend name per setting. Saved to ``path`` if
        given; returns the figure (None when no job logged a curve of it)."""
        import matplotlib.pyplot as plt

        key = key or self.metric
        curves = {s: _mean_curve(jobs, key) for s, jobs in self.jobs.items()}
        curves = {s: c for s, c in curves.items() if c is not None}
        if not curves:
            return None
        if ax is None:
            fig, ax = plt.subplots(figsize=(6.4, 4))
        else:
            fig = ax.figure
        for setting, (steps, mean, std, n) in curves.items():
            name = (labels or {}).get(setting, setting)
            label = f"{name} (n={n})" + (" – baseline" if setting == self.baseline else "")
            (line,) = ax.plot(steps, mean, marker="o", ms=3, label=label)
            if std is not None:
                ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
        ax.set(xlabel="step", ylabel=key, title=f"{key} by {' '.join(self.by)}: mean ± std over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        if path is not None:
            write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=90), durable=False)
        return fig

    def write(self, out: str | Path) -> list[Path]:
        """``<out>.md``, ``<out>.csv`` and (when there are curves) ``<out>.png``; returns the paths written."""
        import matplotlib.pyplot as plt

        out = Path(out)
        base = out.with_suffix("") if out.suffix in (".md", ".csv", ".png") else out
        base.parent.mkdir(parents=True, exist_ok=True)
        md, table = base.with_name(base.name + ".md"), base.with_name(base.name + ".csv")
        fig = self.plot()  # first: it reads every job's curves, and a damaged one must stop before any file is written
        write_atomic(md, self.to_markdown(), durable=False)
        self.to_csv(table)
        written = [md, table]
        if fig is not None:
            png = base.with_name(base.name + ".png")
            write_atomic(png, lambda f: fig.savefig(f, format="png", dpi=90), durable=False)
            plt.close(fig)
            written.append(png)
        return written


def welch(a, b, confidence: float = 0.95) -> tuple[float, float | None, float | None, float | None]:
    """(mean(a) - mean(b), interval low, interval high, two-sided p) of Welch's t-test (unequal variances). The
    interval and p are None when a side has a single value (no variance to estimate) or neither side varies."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return diff, None, None, None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, None, None, None
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return diff, diff - half, diff + half, p


def paired_t(a, b, confidence: float = 0.95) -> tuple[float, float | None, float | None, float | None]:
    """(mean(a - b), interval low, interval high, two-sided p) of the paired t-test: ``a[i]`` and ``b[i]`` are one
    seed's values under two settings. The interval and p are None with fewer than 2 pairs or identical
    differences."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    diff = float(d.mean())
    if len(d) < 2:
        return diff, None, None, None
    se = float(d.std(ddof=1)) / math.sqrt(len(d))
    if se == 0:
        return diff, None, None, None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(d) - 1)) * se
    p = float(stats.ttest_rel(a, b).pvalue)
    return diff, diff - half, diff + half, p


def compare(sweep_dir: str | Path, by: str | list[str] | None = None, metric: str = "val/loss",
            baseline: str | None = None, mode: str = "auto", confidence: float = 0.95,
            job_class: type[SweepJob] = SweepJob, test: str = "welch") -> Comparison:
    """Group the sweep's finished jobs by the values of ``by`` (a key or a list; dotted config keys, config groups
    and overrides all work; None: the overrides that vary, seed aside) and compare ``metric``'s final value.
    ``test``: "welch" (independent samples) or "paired" (the settings' jobs paired by seed).
    ``job_class``: what ``Comparison.jobs`` holds (the claims read more from a job)."""
    if not 0 < confidence < 1:
        raise CompareError(f"confidence must be between 0 and 1, got {confidence}")
    if test not in ("welch", "paired"):
        raise CompareError(f"--test must be welch or paired, got {test!r}")
    by = [k for part in ([by] if isinstance(by, str) else by or []) for k in part.split(",") if k]
    sweep_dir = Path(sweep_dir)
    try:
        jobs = sweep_jobs(sweep_dir, job_class)
    except FileNotFoundError as e:
        raise CompareError(str(e)) from None
    notes = []
    finished = [j for j in jobs if j.finished]
    for j in jobs:
        if not j.finished:
            notes.append(f"job {j.name} left out: it did not finish ({j.why_unfinished()})")
    if not finished:
        raise CompareError(f"no finished job under {sweep_dir} (no <job>/metrics.json; {len(jobs)} job folders)")
    blind = [j.name for j in finished if not (j.dir / ".hydra" / "overrides.yaml").is_file()]
    if blind:  # without its overrides a job's setting and seed are unknown: pooling it would mix settings
        raise CompareError(f"job(s) {', '.join(blind)} of {sweep_dir} have no .hydra/overrides.yaml: their setting "
                           f"and seed are unknown (move them out of the sweep folder to compare the others)")
    values = {j.name: j.final_value(metric) for j in finished}
    if all(v is None for v in values.values()):
        available = sorted({k for j in finished for k in j.final} | {k for j in finished for k in j.history.keys()})
        raise CompareError(f"no job logged {metric!r}; available: {', '.join(available) or 'none'}")
    for j in finished:
        if values[j.name] is None:
            notes.append(f"job {j.name} left out: it logged no {metric!r}")
        elif not math.isfinite(values[j.name]):  # a diverged run: no mean or interval survives a NaN
            notes.append(f"job {j.name} left out: its {metric} is {values[j.name]}")
    measured = [j for j in finished if values[j.name] is not None and math.isfinite(values[j.name])]
    if not measured:
        raise CompareError(f"no job has a finite {metric!r} under {sweep_dir}")

    if mode == "auto":
        mode = "min" if any(s in metric.lower() for s in LOWER_IS_BETTER) else "max"
    if mode not in ("min", "max"):
        raise CompareError(f"--mode must be min, max or auto, got {mode!r}")

    if not by:  # the swept keys: the overrides (seed and bookkeeping aside) whose value differs between jobs
        by = swept_keys(measured)
    groups: dict[str, list[SweepJob]] = {}
    for j in measured:
        groups.setdefault(_setting(j, by, measured), []).append(j)
    for setting, members in groups.items():
        rest = {tuple(o for o in setting_overrides(j.override_list) if override_key(o) not in by) for j in members}
        if len(rest) > 1:  # the keys whose override is not the same in every job of the setting
            common = set.intersection(*map(set, rest))
            differ = sorted({override_key(o) for r in rest for o in r if o not in common})
            notes.append(f"the jobs of {setting} differ in more than the seed ({', '.join(differ) or '?'}); "
                         f"they are pooled: add those keys to --by to separate them")
        seeds = [j.seed for j in members]
        if len(set(seeds)) < len(seeds):
            notes.append(f"{setting}: repeated seeds {seeds}: repeats of one seed are not independent samples")

    baseline = list(groups)[0] if baseline is None else str(baseline)
    if baseline not in groups:
        raise CompareError(f"--baseline {baseline!r} is not a setting of {' '.join(by)}; settings: {', '.join(groups)}")
    base_values = [values[j.name] for j in groups[baseline]]
    if test == "paired":
        for setting, members in groups.items():
            seeds = [j.seed for j in members]
            if None in seeds or len(set(seeds)) < len(seeds):
                raise CompareError(f"--test paired pairs jobs by seed, but the seeds of {setting} are {seeds}: "
                                   f"each job of a setting needs its own seed (or use --test welch)")
        base_by_seed = {j.seed: values[j.name] for j in groups[baseline]}
    rows = []
    for setting, members in groups.items():
        vals = [values[j.name] for j in members]
        arr = np.asarray(vals, dtype=float)
        row = SettingStats(setting, vals, [j.seed for j in members], [j.name for j in members], mean=float(arr.mean()),
                           std=float(arr.std(ddof=1)) if len(arr) > 1 else None)
        if setting == baseline:
            row.verdict = "baseline"
        else:
            if test == "welch":
                row.diff, row.ci_low, row.ci_high, row.p_value = welch(vals, base_values, confidence)
                n_smaller = min(len(vals), len(base_values))
            else:
                row.pairs = [j.seed for j in members if j.seed in base_by_seed]
                unpaired = sorted({j.seed for j in members} ^ set(base_by_seed))
                if unpaired:
                    notes.append(f"{setting}: seeds {unpaired} are not in both {setting} and {baseline}; "
                                 f"the paired test leaves them out")
                if not row.pairs:
                    raise CompareError(f"--test paired: {setting} and {baseline} share no seed "
                                       f"({sorted(s for s in row.seeds)} vs {sorted(base_by_seed)})")
                by_seed = {j.seed: values[j.name] for j in members}
                row.diff, row.ci_low, row.ci_high, row.p_value = paired_t(
                    [by_seed[s] for s in row.pairs], [base_by_seed[s] for s in row.pairs], confidence)
                n_smaller = len(row.pairs)
            if row.p_value is None:
                row.verdict = f"n/a (n={n_smaller})" if n_smaller < 2 else "n/a (no spread)"
            else:
                row.significant = row.p_value < 1 - confidence
                better = row.diff < 0 if mode == "min" else row.diff > 0
                row.verdict = ("better" if better else "worse") if row.significant else "no significant difference"
        rows.append(row)
    for r in rows:
        if r.n == 1:
            notes.append(f"{r.setting} has a single seed: no spread and no interval")
    return Comparison(sweep_dir, metric, by, baseline, mode, confidence, rows, test, groups, notes)


def swept_keys(jobs: list[SweepJob]) -> list[str]:
    """The override keys, seed and run bookkeeping aside, whose value is not the same in every job (in the order
    of the first job's overrides)."""
    per_job = [{override_key(o): o for o in setting_overrides(j.override_list)} for j in jobs]
    keys = list(dict.fromkeys(override_key(o) for j in jobs for o in j.override_list))
    return [k for k in keys if len({p.get(k) for p in per_job}) > 1]


def _setting(job: SweepJob, by: list[str], jobs: list[SweepJob]) -> str:
    if not by:
        return "all jobs"
    values = []
    for key in by:
        value = job.value(key)
        if value is None:
            raise CompareError(f"job {job.dir} has no {key!r} (not an override, a config group or a config key); "
                               f"the sweep varies: {', '.join(swept_keys(jobs) + ['seed']) }")
        values.append(value)
    return values[0] if len(by) == 1 else ",".join(f"{k}={v}" for k, v in zip(by, values))


def _mean_curve(jobs: list[SweepJob], key: str):
    """(steps, mean, std or None, n) over the jobs' curves of ``key`` at the steps all of them logged."""
    series = [dict(zip(*j.history.series(key))) for j in jobs]
    series = [s for s in series if s]
    if not series:
        return None
    steps = sorted(set.intersection(*(set(s) for s in series)))
    if not steps:
        return None
    values = np.array([[s[t] for t in steps] for s in series])
    std = values.std(axis=0, ddof=1) if len(series) > 1 else None
    return np.array(steps), values.mean(axis=0), std, len(series)


def _num(x: float, signed: bool = False) -> str:
    return f"{x:+.4g}" if signed else f"{x:.4g}"


def _csv(x):
    return "" if x is None else x


def default_out(sweep_dir: Path, by: list[str], metric: str) -> Path:
    slug = "-".join(by) + "-" + metric.replace("/", "_")
    return Path(sweep_dir) / f"compare-{slug}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.compare",
                                 description="Compare the settings of a seed sweep: per setting n, mean ± std over "
                                             "seeds, and the difference to a baseline with Welch's interval and "
                                             "p-value; writes a markdown table, a CSV and a figure of the curves.",
                                 epilog="Example: python -m attnlab.compare outputs/train/multiruns/<date> --by norm "
                                        "--metric val/loss --baseline pre")
    ap.add_argument("sweep_dir", type=Path, help="a multirun folder (its numbered job folders)")
    ap.add_argument("--by", default=None, help="the swept key(s) that define a setting, comma-separated (norm, "
                                               "model.net.d_model); default: the overrides that vary between jobs, "
                                               "seed aside")
    ap.add_argument("--metric", default="val/loss", help="a metric of metrics.json or of the logged curves")
    ap.add_argument("--baseline", default=None, help="the setting the others are compared to (default: the first)")
    ap.add_argument("--mode", default="auto", choices=("auto", "min", "max"),
                    help="min: lower is better; max: higher is better; auto: min for loss/ppl/error/time metrics")
    ap.add_argument("--confidence", type=float, default=0.95, help="of the intervals (default 0.95)")
    ap.add_argument("--test", default="welch", choices=("welch", "paired"),
                    help="welch: the settings' seeds as independent samples (default); paired: the jobs of two "
                         "settings paired by seed, a t-test of the per-seed differences")
    ap.add_argument("--out", type=Path, default=None,
                    help="write OUT.md, OUT.csv and OUT.png (default: <sweep dir>/compare-<by>-<metric>); a folder: "
                         "those files inside it")
    args = ap.parse_args(argv)
    try:
        result = compare(args.sweep_dir, args.by, args.metric, args.baseline, args.mode, args.confidence,
                         test=args.test)
        out = default_out(args.sweep_dir, result.by, args.metric)
        if args.out is not None:
            out = args.out / out.name if args.out.is_dir() else args.out  # --out <folder>: the default names inside
        try:
            written = result.write(out)
        except OSError as e:
            raise CompareError(f"cannot write the comparison to {out}: {e.strerror or e} "
                               f"({e.filename or out}); give --out a writable path") from None
    except UserError as e:  # CompareError, a damaged job file (SweepJobError, RunHistoryError)
        print(f"error: {one_line_message(e)}", file=sys.stderr)
        return 2
    result.print()
    print("written: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
