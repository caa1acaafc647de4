"""``python -m attnlab.workspace <sweep or run dir>``: the W&B workspace that reviews a sweep, generated, not clicked.

It reads the folder's jobs (every ``<job>/.hydra/overrides.yaml`` below it: a ``-m`` sweep's numbered jobs, a
single run, or a claim's several sweeps) and their offline W&B runs (``<job>/wandb/offline-run-*``, read with
``wandb leet``: :mod:`attnlab.runs.wandb_runs`), takes the swept keys (the override keys whose values differ between
jobs; ``seed`` is counted, not grouped by) and builds, with the ``wandb-workspaces`` package (the
``wandb-workspaces`` extra), a workspace of:

* a review section: what was swept (settings × seeds), a parallel-coordinates panel over the swept keys and the
  metric (``optimized_metric``, default ``val/loss``; ``--metric``), the metric's curve and its final value per
  setting (mean ± std over seeds);
* validation curves, training curves, throughput/MFU (``perf/*``), test results, the attention explorer (the
  ``attention/explorer`` HTML page, one column per run), the attention maps, the attention health (one section per
  attention module, ``health.<module>``, with a line plot per metric and the heads as lines:
  :mod:`attnlab.analysis.attention_health`) and the other media (translation table, TTS mel/alignment images and
  audio, confusion matrices), each only where a run logged it.

The runs are grouped by the W&B config keys that carry the swept keys: an override of a value (``model.optimizer.lr``)
is that config key; a group choice (``norm=rms``) is not in the config itself (this project logs the composed,
flattened config), so it is carried by the fewest of its keys that tell the choices apart (``norm.placement``,
``norm.layer._target_``). The runs are filtered to this folder's run ids, which ``wandb sync`` keeps.

Offline (the default: no network, no account) it saves the definition, the W&B view as ``wandb-workspaces``
serializes it, to ``<dir>/wandb_workspace.json`` (``--out``) and prints the command that publishes it once the runs
are synced::

    wandb sync <dir>/*/wandb/offline-run-*
    python -m attnlab.workspace <dir> --publish [--entity E] [--project P]

Building and saving make no network call (``wandb_workspaces.workspaces.Workspace`` and its panels are pydantic
models; only ``save()`` talks to W&B). ``--publish`` uploads the saved file as a new workspace view of the project
with the package's own upsert call (what ``Workspace.save`` runs); entity: ``--entity``, else the one the runs were
logged under, else your W&B default entity.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files.atomic import write_atomic
from .input import check_output
from ..core.errors import UserError, WorkspaceError, one_line_message
from ..core.quoting import shell_path
from ..runs.sweep_jobs import SweepJob
from ..runs.wandb_runs import OfflineRun, offline_run_dirs, read_offline_runs

WORKSPACE_FILE = "wandb_workspace.json"
SEED_KEYS = ("seed",)
DEFAULT_METRIC = "val/loss"
STEP_KEY = "trainer/global_step"  # Lightning's WandbLogger logs every metric against it (define_metric)


# ---------------------------------------------------------------------------------------------------- reading
@dataclass
class Job:
    dir: Path
    overrides: dict[str, str]
    runs: list[OfflineRun] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[-1].config  # a resumed run's last part


def read_overrides(job_dir: Path) -> dict[str, str]:
    """``key -> value`` of ``<job>/.hydra/overrides.yaml`` (``+key``/``++key``/``~key``: the key)."""
    items = SweepJob(job_dir).override_list  # a damaged file is one line naming it (SweepJobError)
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def find_jobs(root: Path) -> list[Path]:
    """The job folders at or below ``root``: those with a ``.hydra/overrides.yaml``."""
    if (root / ".hydra" / "overrides.yaml").is_file():
        return [root]
    return sorted({p.parent.parent for p in root.rglob("overrides.yaml") if p.parent.name == ".hydra"})


def read_jobs(root: Path) -> tuple[list[Job], list[Path]]:
    """The jobs with an offline W&B run (their runs read), and the job folders without one."""
    dirs = find_jobs(root)
    if not dirs:
        raise WorkspaceError(f"{root}: no run or sweep here (no */.hydra/overrides.yaml)")
    jobs = [Job(d, read_overrides(d)) for d in dirs]
    with_runs = [j for j in jobs if offline_run_dirs(j.dir)]
    without = [j.dir for j in jobs if not offline_run_dirs(j.dir)]
    if not with_runs:
        raise WorkspaceError(f"{root}: no W&B run in its {len(jobs)} job(s) (train with logger=wandb, the default)")
    runs = iter(read_offline_runs([p for j in with_runs for p in offline_run_dirs(j.dir)]))
    for j in with_runs:
        # a log that holds no run record (empty, cut short before its first record) has no id, config or keys:
        # counting it would change the grouping keys and filter on an empty id
        j.runs = [r for r in (next(runs) for _ in offline_run_dirs(j.dir)) if r.run_id]
    without += [j.dir for j in with_runs if not j.runs]
    with_runs = [j for j in with_runs if j.runs]
    if not with_runs:
        raise WorkspaceError(f"{root}: no readable W&B run in its {len(jobs)} job(s) (their logs hold no run record)")
    return with_runs, without


# ---------------------------------------------------------------------------------------------------- swept keys
def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys whose value differs between jobs (a key some jobs lack counts as differing), in command order."""
    keys = list(dict.fromkeys(k for j in jobs for k in j.overrides))
    return [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1]


def config_keys_for(key: str, jobs: list[Job]) -> list[str]:
    """The W&B config keys that carry the swept override ``key`` across ``jobs``.

    A key the runs logged as a config value (``model.optimizer.lr``, ``seed``) is itself. A group choice
    (``norm=rms``) is the fewest config keys under ``norm.`` (shallowest first) whose values tell the jobs' choices
    apart. [] where the runs' configs do not differ (the same value spelled two ways, choices that compose alike)."""
    configs = [j.config for j in jobs]
    if any(key in c for c in configs):  # a value: itself, if the runs really differ in it (not `False` vs `false`)
        return [key] if _distinct(configs, [key]) > 1 else []
    choices = [j.overrides.get(key) for j in jobs]
    prefix = key + "."
    under = sorted({k for c in configs for k in c if k.startswith(prefix)}, key=lambda k: (k.count("."), k))
    varying = [k for k in under if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    n_choices, chosen = len(set(choices)), []
    for k in varying:
        before = _distinct(configs, chosen)
        if _distinct(configs, chosen + [k]) > before:
            chosen.append(k)
        if _distinct(configs, chosen) >= n_choices:
            break
    return chosen


def _distinct(configs: list[dict], keys: list[str]) -> int:
    return len({tuple(json.dumps(c.get(k), sort_keys=True, default=str) for k in keys) for c in configs})


@dataclass
class Sweep:
    root: Path
    jobs: list[Job]
    without_runs: list[Path]
    swept: list[str]  # override keys whose text varies, seed included
    group_keys: dict[str, list[str]]  # swept key (not seed) -> the W&B config keys carrying it, where the runs differ
    metric: str
    scalar_keys: list[str]  # every scalar any run logged
    media_keys: dict[str, str]  # media key -> image | table | audio | html
    project: str
    entity: str

    @property
    def wandb_group_keys(self) -> list[str]:
        return list(dict.fromkeys(k for keys in self.group_keys.values() for k in keys))

    def settings(self) -> Counter:
        """Setting (the swept keys but seed, as ``k=v`` text) -> number of jobs (seeds)."""
        keys = list(self.group_keys)
        return Counter(" ".join(f"{k}={j.overrides.get(k, '(default)')}" for k in keys) or "(one setting)"
                       for j in self.jobs)

    def run_ids(self) -> list[str]:
        return list(dict.fromkeys(r.run_id for j in self.jobs for r in j.runs))


def read_sweep(root: Path, metric: str | None = None) -> Sweep:
    root = Path(root)
    if not root.is_dir():
        raise WorkspaceError(f"{root}: no such folder")
    jobs, without = read_jobs(root)
    swept = swept_keys(jobs)
    group_keys = {k: keys for k in swept if k not in SEED_KEYS and (keys := config_keys_for(k, jobs))}
    runs = [r for j in jobs for r in j.runs]
    scalars = sorted(set().union(*(r.scalar_keys() for r in runs)))
    media = {k: v for r in runs for k, v in r.media_keys().items()}
    metric = metric or str(jobs[0].config.get("optimized_metric") or DEFAULT_METRIC)
    if metric not in scalars:
        logged = ", ".join(k for k in scalars if k.startswith("val/")) or "none"
        raise WorkspaceError(f"metric {metric!r} was never logged by these runs (validation metrics: {logged})")
    projects = {r.project for r in runs if r.project}
    entities = {r.entity for r in runs if r.entity}
    return Sweep(root=root, jobs=jobs, without_runs=without, swept=swept, group_keys=group_keys, metric=metric,
                 scalar_keys=scalars, media_keys=dict(sorted(media.items())),
                 project=sorted(projects)[0] if len(projects) == 1 else "",
                 entity=sorted(entities)[0] if len(entities) == 1 else "")


# ---------------------------------------------------------------------------------------------------- building
def _import_workspaces():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as e:
        raise WorkspaceError(f"needs the wandb-workspaces package: pip install 'attnlab[wandb-workspaces]' ({e})")
    return ws, wr


def _config_name(key: str) -> str:
    """A W&B config key as this project logs it: flat (``norm.layer._target_`` is one top-level key), which W&B
    stores as ``{"norm.layer._target_": {"value": ...}}``: the ``.value`` goes at the end (wandb-workspaces assumes
    nested keys, ``norm.value.layer...``, unless the path already holds ``value``)."""
    return f"{key}.value"


def _flat_config_column(wr, key: str):
    """A parallel-coordinates axis over the flat config ``key``. The package writes a Config axis's accessor as a
    nested key (``config:norm.value.layer._target_``) whatever the name says; this one writes the flat form."""

    class FlatConfigColumn(wr.ParallelCoordinatesPlotColumn):
        def _to_model(self):
            model = super()._to_model()
            model.accessor = f"config:{key}.value"
            return model

    return FlatConfigColumn(metric=wr.Config(key), display_name=key)


def description(sweep: Sweep) -> str:
    """The review section's text: the folder, what was swept and how the runs are grouped."""
    lines = [f"**{sweep.root.name}**: {len(sweep.jobs)} run(s), metric `{sweep.metric}`.", ""]
    if sweep.group_keys:
        lines.append("Swept (grouped by): " + "; ".join(
            f"`{k}` → " + ", ".join(f"`{c}`" for c in keys) for k, keys in sweep.group_keys.items()))
    seeds = [k for k in sweep.swept if k in SEED_KEYS]
    if seeds:
        lines.append(f"Seeds: `{seeds[0]}` varies; curves and bars show the mean ± std over them.")
    lines += ["", "| setting | runs |", "|---|---|"]
    lines += [f"| {s} | {n} |" for s, n in sweep.settings().items()]
    return "\n".join(lines)


def build_workspace(sweep: Sweep, entity: str | None = None, project: str | None = None, name: str | None = None):
    """The ``wandb_workspaces.workspaces.Workspace`` reviewing ``sweep`` (no network)."""
    ws, wr = _import_workspaces()
    from wandb_workspaces import expr

    group = sweep.wandb_group_keys
    x = STEP_KEY if STEP_KEY in sweep.scalar_keys else "Step"
    agg = {"groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"}
    if len(group) == 1:  # a panel groups by one key; more are grouped by the runset (below), which all panels follow
        agg["groupby"] = wr.Config(_config_name(group[0]))

    def line(key: str):
        return wr.LinePlot(title=key, x=x, y=[key], **agg)

    def bar(key: str):
        return wr.BarPlot(title=f"{key} (final)", metrics=[key], **agg)

    review = [wr.MarkdownPanel(markdown=description(sweep))]
    if group:
        review.append(wr.ParallelCoordinatesPlot(
            title=f"{', '.join(sweep.group_keys)} → {sweep.metric}",
            columns=[_flat_config_column(wr, k) for k in group] + [wr.ParallelCoordinatesPlotColumn(
                metric=wr.SummaryMetric(sweep.metric))]))
    review += [line(sweep.metric), bar(sweep.metric)]

    def scalars(prefix: str) -> list[str]:
        return [k for k in sweep.scalar_keys if k.startswith(prefix)]

    shown = {sweep.metric, STEP_KEY, "epoch"}
    sections = [ws.Section(name=f"Review: {sweep.root.name}", panels=review, is_open=True, pinned=True)]

    def add(title: str, keys: list[str], panel, **kw) -> None:
        keys = [k for k in keys if k not in shown]
        shown.update(keys)
        if keys:
            sections.append(ws.Section(name=title, panels=[panel(k) for k in keys], is_open=True, **kw))

    add("Validation", scalars("val/"), line)
    add("Training", scalars("train/") + scalars("lr-"), line)
    add("Throughput and MFU", scalars("perf/"), line)
    add("Test", scalars("test/"), bar)
    from ..explorer.page import EXPLORER_KEY

    explorer = [k for k in sweep.media_keys if k == EXPLORER_KEY]
    if explorer:  # the interactive page (wandb.Html): a wide panel, one column per run
        sections.append(ws.Section(name="Attention explorer", is_open=True, panels=[
            wr.MediaBrowser(title=k, media_keys=[k], gallery_axis="run", layout=wr.Layout(w=24, h=20))
            for k in explorer]))
    attention = [k for k in sweep.media_keys if k.startswith("attention/") and k not in explorer]
    if attention:
        sections.append(ws.Section(name="Attention maps", is_open=True, panels=[
            wr.MediaBrowser(title=k, media_keys=[k], gallery_axis="run") for k in attention]))
    sections += health_sections(ws, wr, [k for k in sweep.scalar_keys if k not in shown], x, agg, shown)
    samples = []
    for k, kind in sweep.media_keys.items():
        if k in attention or k in explorer:
            continue
        if kind == "table":
            samples.append(wr.WeavePanelSummaryTable(table_name=k, layout=wr.Layout(w=24, h=12)))
        else:  # images and audio: one column per run
            samples.append(wr.MediaBrowser(title=k, media_keys=[k], gallery_axis="run"))
    if samples:
        sections.append(ws.Section(name="Samples", panels=samples, is_open=True))
    add("Other metrics", [k for k in sweep.scalar_keys if "/" in k], line)

    return ws.Workspace(
        entity=entity or sweep.entity or "",
        project=project or sweep.project or "attnlab",
        name=name or f"attnlab review: {sweep.root.name}",
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=x, max_runs=max(10, len(sweep.run_ids()))),
        runset_settings=ws.RunsetSettings(
            filters=[expr.Metric("ID").isin(sweep.run_ids())],
            groupby=[ws.Config(_config_name(k)) for k in group],
        ),
    )


def health_sections(ws, wr, keys: list[str], x: str, agg: dict, shown: set[str]) -> list:
    """One collapsed section per attention module that logged health metrics, named as W&B names it (the key's
    part before the ``/``: ``health.<module>``), in the explorer's module order (encoder, decoder, by layer), with
    a line plot per metric whose lines are the mean over heads and each head. Adds the keys it uses to ``shown``."""
    from ..analysis.attention_health import METRICS, health_key, health_section, parse_health_key
    from ..explorer.record import module_order

    found: dict[str, dict[str, list[int | None]]] = {}
    for k in keys:
        if (parsed := parse_health_key(k)) is not None:
            module, metric, head = parsed
            found.setdefault(module, {}).setdefault(metric, []).append(head)
    sections = []
    for module in sorted(found, key=module_order):
        panels = []
        for metric in (m for m in METRICS if m in found[module]):
            heads = sorted(found[module][metric], key=lambda h: -1 if h is None else h)  # the mean first
            ys = [health_key(module, metric, h) for h in heads]
            shown.update(ys)
            panels.append(wr.LinePlot(title=f"{metric}: mean and per head", x=x, y=ys, **agg))
        sections.append(ws.Section(name=health_section(module), panels=panels, is_open=False))
    return sections


def named_keys(view: dict) -> dict[str, set[str]]:
    """The keys a saved definition's panels name: ``metrics`` (curves, bars, parallel-coordinates summaries),
    ``config`` (grouping and parallel-coordinates axes, without their ``.value``), ``media`` (media panels and
    tables). For checks and tests: every one should be a key the runs logged."""
    found: dict[str, set[str]] = {"metrics": set(), "config": set(), "media": set()}
    section = view["spec"]["section"]
    for rs in section["runSets"]:
        for g in rs.get("grouping", []):
            found["config"].add(g["name"].removesuffix(".value"))
    for sec in section["panelBankConfig"]["sections"]:
        for p in sec["panels"]:
            cfg = p.get("config", {})
            found["metrics"].update(cfg.get("metrics", []))
            if isinstance(cfg.get("groupBy"), str):
                found["config"].add(cfg["groupBy"].removesuffix(".value"))
            for col in cfg.get("columns", []):
                kind, _, key = col["accessor"].partition(":")
                found["config" if kind == "config" else "metrics"].add(key.removesuffix(".value"))
            found["media"].update(cfg.get("mediaKeys", []))
            table = _weave_table_name(cfg)
            if table:
                found["media"].add(table)
    return found


def _weave_table_name(node: Any) -> str | None:
    """The summary key a WeavePanelSummaryTable reads: the constant ``key`` of its Weave ``pick`` expression."""
    if isinstance(node, dict):
        key = node.get("key")
        if isinstance(key, dict) and key.get("nodeType") == "const" and isinstance(key.get("val"), str):
            return key["val"]
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            if (found := _weave_table_name(child)) is not None:
                return found
    return None


# ---------------------------------------------------------------------------------------------------- save/publish
def save(workspace, path: Path) -> dict:
    """Write the workspace's W&B view (the model ``Workspace.save`` uploads) as JSON; return it as a dict."""
    view = workspace._to_model()  # the documented save() path without the upload: pydantic, no network
    text = view.model_dump_json(by_alias=True, exclude_none=True, indent=1)
    try:
        write_atomic(path, text + "\n", durable=False)
    except OSError as e:
        raise WorkspaceError(f"cannot save the workspace to {path}: {e.strerror or e} ({e.filename or path}); "
                             f"give --out a writable path") from None
    return json.loads(text)


def sync_command(sweep: Sweep) -> str:
    """``wandb sync`` of every offline run of the folder, as shell globs (one per depth of its jobs)."""
    depths = sorted({len(j.dir.relative_to(sweep.root).parts) for j in sweep.jobs})
    # the folder quoted for the shell, the globs after it left for the shell to expand
    return "wandb sync " + " ".join(f"{shell_path(sweep.root)}/{'*/' * d}wandb/offline-run-*" for d in depths)


def publish_command(root: Path, out: Path) -> str:
    extra = "" if out == root / WORKSPACE_FILE else f" --out {shell_path(out)}"
    return f"python -m attnlab.workspace {shell_path(root)} --publish{extra} --entity <entity> --project <project>"


def publish(path: Path, entity: str | None, project: str | None) -> str:
    """Upload a saved definition as a new view of ``entity/project``; returns its URL. Needs ``wandb login``."""
    if not path.is_file():
        raise WorkspaceError(f"{path}: no saved workspace (run `python -m attnlab.workspace <dir>` first)")
    import wandb
    from wandb_workspaces._graphql import get_app_url

    _import_workspaces()
    from wandb_workspaces.workspaces import internal

    try:
        view = internal.View.model_validate_json(path.read_text())
    except ValueError as e:
        raise WorkspaceError(f"{path}: not a saved workspace ({one_line_message(e)})")
    try:
        api = wandb.Api()
        view.entity = entity or view.entity or api.default_entity
        view.project = project or view.project
        view.name, view.id = internal._generate_view_name(), ""
        internal.upsert_view2(view)  # what Workspace.save() runs, on the saved model as is
        url = get_app_url(api).rstrip("/")
    except Exception as e:  # no login, no network, no such project: W&B's own message, on one line
        raise WorkspaceError(f"publishing to W&B failed: {one_line_message(e)}")
    return f"{url}/{view.entity}/{view.project}?nw={internal._internal_name_to_url_query_str(view.name)}"


# ---------------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.workspace",
        description="Build the W&B workspace that reviews a sweep (or run) folder from its offline W&B runs and save "
                    "it there, with no network; --publish uploads it once the runs are synced (`wandb sync`).")
    parser.add_argument("dir", type=Path, help="a sweep folder (multiruns/<time>), a run folder, or a claim's folder")
    parser.add_argument("--metric", help="the metric to review (default: the runs' optimized_metric, else val/loss)")
    parser.add_argument("--entity", help="W&B entity (default: the runs', else your default entity at --publish)")
    parser.add_argument("--project", help="W&B project (default: the runs', attnlab)")
    parser.add_argument("--name", help="the workspace's name (default: 'attnlab review: <folder name>')")
    parser.add_argument("--out", type=Path, help=f"where to save the definition (default: <dir>/{WORKSPACE_FILE})")
    parser.add_argument("--publish", action="store_true",
                        help="upload the saved definition to W&B (after `wandb sync`; needs `wandb login`)")
    args = parser.parse_args(argv)
    root = args.dir.expanduser().resolve()
    out = root / WORKSPACE_FILE  # as named, never resolved: a link planted there is replaced, not followed
    if args.out is not None:
        out = args.out.expanduser().resolve()
        if out.is_dir():  # --out <folder>: the definition goes inside it
            out = out / WORKSPACE_FILE
    try:
        if not args.publish and args.out is not None:
            check_output("--out", out)  # before the runs are read: a path that cannot be written fails at once
        if args.publish:
            print(f"workspace published: {publish(out, args.entity, args.project)}")
            return 0
        sweep = read_sweep(root, args.metric)
        view = save(build_workspace(sweep, args.entity, args.project, args.name), out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    n_panels = sum(len(s["panels"]) for s in view["spec"]["section"]["panelBankConfig"]["sections"])
    grouping = "; ".join(f"{k} -> {', '.join(v)}" for k, v in sweep.group_keys.items())
    print(f"{len(sweep.jobs)} run(s), {len(sweep.settings())} setting(s); grouped by: {grouping or 'nothing swept'}")
    for d in sweep.without_runs:
        print(f"note: {d} has no readable W&B run (left out)")
    print(f"workspace saved: {out} ({n_panels} panels)")
    print("publish it once the runs are synced:")
    print(f"  {sync_command(sweep)}")
    print(f"  {publish_command(root, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
