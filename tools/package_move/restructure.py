"""Move attnlab's flat modules into packages and rewrite every reference (imports, dotted strings, file paths).

usage: python /tmp/restructure.py <repo root>
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()
PKG = ROOT / "src" / "attnlab"

MAP = {  # old module (relative to attnlab) -> new
    # core: the words every layer shares
    "errors": "core.errors", "special_tokens": "core.special_tokens", "choices": "core.choices",
    "paths": "core.paths", "quoting": "core.quoting", "value_checks": "core.value_checks",
    # files: writes that never leave a partial file or leave their folder
    "atomic_files": "files.atomic", "folder_paths": "files.folder_paths", "log_file": "files.log_file",
    "utils.checkpoint_io": "files.checkpoint_io",
    # checkpoints: the file format (read, upgrade, allow-list, fit, loop position)
    "checkpoint_upgrade": "checkpoints.upgrade", "allowed_targets": "checkpoints.allowed_targets",
    "state_fit": "checkpoints.state_fit", "loop_position": "checkpoints.loop_position",
    # plots: figures from arrays
    "utils.plotting": "plots.figures", "utils.vision_plots": "plots.vision", "utils.tts_plots": "plots.tts",
    # probes: measurements that run a task
    "analysis.lm_probes": "probes.language_model", "analysis.translation_eval": "probes.translation",
    # runs: a run's folder, plan, build, outcome, resume, history, sweep
    "run_folder": "runs.folder", "run_lock": "runs.lock", "run_history": "runs.history", "resume": "runs.resume",
    "sweep_jobs": "runs.sweep_jobs", "wandb_runs": "runs.wandb_runs", "run_plan": "runs.plan",
    "run_build": "runs.build", "run_outcome": "runs.outcome", "ddp": "runs.ddp", "utils.sweep": "runs.sweep",
    "utils.run_summary": "runs.summary", "utils.console": "runs.console", "utils.config": "runs.config_tree",
    "utils.threads": "runs.threads", "utils.hardware": "runs.hardware", "utils.model_memory": "runs.model_memory",
    "utils.validate": "runs.validate", "data.preflight": "runs.data_check", "checkpoint_read": "checkpoints.read", "checkpoints": "runs.load",
    # cli: the entry points, their input and Hydra's errors
    "train": "cli.train", "translate": "cli.translate", "generate": "cli.generate", "synthesize": "cli.synthesize",
    "explore": "cli.explore", "compare": "cli.compare", "workspace": "cli.workspace", "cli_input": "cli.input",
    "hydra_errors": "cli.hydra_errors", "analysis.surface_forms": "cli.surface_forms",
    "explorer.inputs": "cli.explore_inputs",  # any input, per family: explore's (it translates through the CLI's code)
    "explorer.views": "plots.views",  # the views a task fills for the page: tasks hand data down, not up
}
# `python -m attnlab.<old>` spellings the docs use: kept working by a shim at the old place
SHIMS = {"explore": "cli.explore", "compare": "cli.compare", "workspace": "cli.workspace",
         "train": "cli.train", "translate": "cli.translate", "generate": "cli.generate", "synthesize": "cli.synthesize"}

MAP = {k: v for k, v in MAP.items() if (PKG / (k.replace(".", "/") + ".py")).is_file()}
missing = [k for k in MAP if not (PKG / (k.replace(".", "/") + ".py")).is_file()]
print("moving", len(MAP), "modules")


def module_of(path: Path) -> str:
    parts = path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def new_name(mod: str) -> str:
    """Map an old absolute module (relative to attnlab) to its new name; deeper names follow their module."""
    for old in sorted(MAP, key=len, reverse=True):
        if mod == old or mod.startswith(old + "."):
            return MAP[old] + mod[len(old):]
    return mod


KNOWN_OLD = {module_of(p) for p in PKG.rglob("*.py")}
# names that left checkpoints.py for checkpoint_read.py (split before the move)
_read = PKG / "checkpoint_read.py"
READ_NAMES = {n.name for n in ast.parse(_read.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
    t.id for n in ast.parse(_read.read_text()).body if isinstance(n, ast.Assign) for t in n.targets
    if isinstance(t, ast.Name)} if _read.exists() else set()


def moved_name(module: str, name: str) -> str:
    """The module (old name) that defines ``name`` now imported from old ``module``."""
    return "checkpoint_read" if module == "checkpoints" and name in READ_NAMES else module


def is_module(mod: str) -> bool:
    return mod in KNOWN_OLD


def rel(from_pkg: list[str], target: str) -> str:
    """A relative import spelling of ``target`` (relative to attnlab) from package ``from_pkg``."""
    t = target.split(".") if target else []
    common = 0
    while common < len(from_pkg) and common < len(t) and from_pkg[common] == t[common]:
        common += 1
    level = len(from_pkg) - common + 1
    return "." * level + ".".join(t[common:])


def rewrite_imports(text: str, old_mod: str, new_mod: str, is_pkg: bool, relative_style: bool) -> str:
    """Rewrite the attnlab imports of one file (its old module name -> its new one)."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    old_pkg = (old_mod.split(".") if old_mod else []) if is_pkg else old_mod.split(".")[:-1]
    new_pkg = (new_mod.split(".") if new_mod else []) if is_pkg else new_mod.split(".")[:-1]
    edits = []  # (start line idx, end line idx, new text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # import attnlab.x.y [as z]
            names = [(a.name, a.asname) for a in node.names]
            if any(n == "attnlab" or n.startswith("attnlab.") for n, _ in names):
                indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
                spelled = ", ".join(("attnlab." + new_name(n.removeprefix("attnlab.")) if n.startswith("attnlab.") else n)
                                    + (f" as {a}" if a else "") for n, a in names)
                edits.append((node.lineno - 1, node.end_lineno - 1, f"{indent}import {spelled}\n"))
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = old_pkg[: len(old_pkg) - (node.level - 1)]
                absmod = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "attnlab" or (node.module or "").startswith("attnlab."):
                absmod = node.module.removeprefix("attnlab").lstrip(".")
            else:
                continue
            # split names that are modules themselves (from . import resume, run_folder)
            groups: dict[str, list[str]] = {}
            for alias in node.names:
                full = f"{absmod}.{alias.name}" if absmod else alias.name
                if is_module(full) and new_name(full) != full:
                    new_full = new_name(full)
                    parent, _, leaf = new_full.rpartition(".")
                    asname = alias.asname or (alias.name if leaf != alias.name else None)
                    groups.setdefault(parent, []).append(leaf + (f" as {asname}" if asname else ""))
                else:
                    target = new_name(moved_name(absmod, alias.name))
                    groups.setdefault(target, []).append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
            unchanged = (len(groups) == 1 and next(iter(groups)) == absmod
                         and (not node.level or new_pkg == old_pkg))
            if unchanged:
                continue
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            comment = ""
            last = lines[node.end_lineno - 1]
            m = re.search(r"\)?\s*(#.*)$", last)
            if m and "#" in last:
                comment = "  " + m.group(1).strip()
            stmts = []
            for target, names in groups.items():
                if relative_style and (node.level or True):
                    spelled = rel(new_pkg, target) if (node.level or relative_style) else f"attnlab.{target}"
                else:
                    spelled = f"attnlab.{target}" if target else "attnlab"
                stmt = f"{indent}from {spelled} import {', '.join(names)}"
                if len(stmt) > 118:
                    stmt = f"{indent}from {spelled} import (\n" + "".join(f"{indent}    {n},\n" for n in names) + f"{indent})"
                stmts.append(stmt)
            stmts[0] += comment
            edits.append((node.lineno - 1, node.end_lineno - 1, "\n".join(stmts) + "\n"))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end + 1] = [new]
    return "".join(lines)


DOTTED = sorted(MAP, key=len, reverse=True)
dotted_re = re.compile(r"(?<![\w.])attnlab\.(" + "|".join(re.escape(m) for m in DOTTED) + r")(?![\w])")
path_re = re.compile(r"attnlab/(" + "|".join(re.escape(m.replace(".", "/")) for m in DOTTED) + r")\.py")


read_re = re.compile(r"(?<![\w.])attnlab\.checkpoints\.(" + "|".join(sorted(READ_NAMES)) + r")(?![\w])") if READ_NAMES \
    else None


def rewrite_strings(text: str, keep_dash_m: bool = True) -> str:
    if read_re is not None:  # (dotted names only: import statements are rewritten by rewrite_imports)
        text = "".join(x if re.match(r"\s*(from\s+\S+\s+import|import\s+attnlab)", x)
                       else read_re.sub(lambda m: "attnlab.checkpoint_read." + m.group(1), x)
                       for x in text.splitlines(keepends=True))

    def dotted(m):
        # a shim's bare name is the command `python -m attnlab.<name>`, which keeps working: left as written
        if m.group(1) in SHIMS and m.string[m.end():m.end() + 1] not in (".", ":"):
            before = m.string[:m.start()]
            if not keep_dash_m or before.endswith(("-m ", '"-m", "', "'-m', '", "entry point ")):
                return m.group(0)
        return "attnlab." + MAP[m.group(1)]

    def line(text_line: str) -> str:
        if re.match(r"\s*(from\s+\S+\s+import|import\s+attnlab)", text_line):
            return text_line  # import statements: rewritten by rewrite_imports, from the old names
        return dotted_re.sub(dotted, text_line)

    text = "".join(line(x) for x in text.splitlines(keepends=True))
    return path_re.sub(lambda m: "attnlab/" + MAP[m.group(1).replace("/", ".")].replace(".", "/") + ".py", text)


def main() -> None:
    # 1. rewrite every python file's imports (src: relative, others: absolute as written)
    for path in sorted(ROOT.rglob("*.py")):
        if any(p in path.parts for p in (".git", "__pycache__", "outputs", ".whl", "build", "tools")):
            continue
        text = path.read_text(encoding="utf-8")
        in_pkg = PKG in path.parents
        if in_pkg:
            old_mod = module_of(path)
            new_mod = new_name(old_mod)
            text = rewrite_imports(text, old_mod, new_mod, path.name == "__init__.py", relative_style=True)
        else:
            text = rewrite_imports(text, "__outside__.x", "__outside__.x", False, relative_style=False)
        text = rewrite_strings(text, keep_dash_m=True)
        path.write_text(text, encoding="utf-8")
    # 2. other text files: docs, conf, notebooks, pyproject
    import json
    for nb in ROOT.glob("notebooks/*.ipynb"):
        data = json.loads(nb.read_text(encoding="utf-8"))
        for cell in data["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code":
                try:
                    src = rewrite_imports(src, "__outside__.x", "__outside__.x", False, relative_style=False)
                except SyntaxError:
                    pass
            src = rewrite_strings(src)
            cell["source"] = src.splitlines(keepends=True)
        nb.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for pattern in ("docs/**/*.md", "*.md", "conf/**/*.yaml", "pyproject.toml", "setup.py",
                    ".ci/*", "bench/*.sh", "experiments/**/*.md"):
        for path in ROOT.glob(pattern):
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                new = rewrite_strings(text, keep_dash_m=False)
                if new != text:
                    path.write_text(new, encoding="utf-8")
    # 3. move the files
    for old, new in MAP.items():
        src = PKG / (old.replace(".", "/") + ".py")
        dst = PKG / (new.replace(".", "/") + ".py")
        dst.parent.mkdir(parents=True, exist_ok=True)
        init = dst.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
        src.rename(dst)
    # 4. shims for the documented `python -m attnlab.<old>` spellings
    for old, new in SHIMS.items():
        if old not in MAP:
            continue
        shim = PKG / (old.replace(".", "/") + ".py")
        shim.write_text(f'"""``python -m attnlab.{old}``, as the docs spell it: :mod:`attnlab.{new}`."""\n\n'
                        f"from attnlab.{new} import main\n\nif __name__ == \"__main__\":\n    main()\n")


main()
subprocess.run(["git", "add", "-A", "src", "tests", "docs", "conf", "notebooks", "bench", "experiments"], cwd=ROOT,
               check=True)
# paths.py finds the package from its own place: one folder deeper now
_paths = PKG / "core" / "paths.py"
_paths.write_text(_paths.read_text().replace("PACKAGE_DIR = Path(__file__).resolve().parent\n",
                                             "PACKAGE_DIR = Path(__file__).resolve().parents[1]  # (this file: attnlab/core/)\n"))
# utils/ is empty once its modules moved
import shutil as _shutil
if (PKG / "utils").is_dir() and [p.name for p in (PKG / "utils").iterdir() if p.name != "__pycache__"] == ["__init__.py"]:
    _shutil.rmtree(PKG / "utils")
subprocess.run(["git", "add", "-A", "src"], cwd=ROOT, check=True)

# natural_key: the views sort by it and sit below the explorer now
_rec = PKG / "explorer" / "record.py"
_t = _rec.read_text()
_def = """def natural_key(name: str) -> list:
    \"\"\"``blocks.2`` before ``blocks.10``: digits compare as numbers.\"\"\"
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


"""
assert _def in _t
_t = _t.replace(_def, "").replace("from ..tasks.protocols import AttentionSample\n",
                                 "from ..plots.views import natural_key\nfrom ..tasks.protocols import AttentionSample\n")
_rec.write_text(_t)
_views = PKG / "plots" / "views.py"
_v = _views.read_text()
_v = _v.replace("    from ..explorer.record import natural_key\n", "")
_v = _v.replace("\n\ndef png_data_uri(", "\n\n" + _def + "def png_data_uri(", 1)
if "\nimport re\n" not in _v:
    _v = _v.replace("import io\n", "import io\nimport re\n", 1)
_views.write_text(_v)
# python -m attnlab.analysis.surface_forms: one line naming the new spelling (analysis sits below the entry points)
(PKG / "analysis" / "surface_forms.py").write_text('''"""``python -m attnlab.analysis.surface_forms`` moved: one line naming the new spelling."""

import sys

if __name__ == "__main__":
    sys.exit("attnlab.analysis.surface_forms moved: run python -m attnlab.cli.surface_forms " + " ".join(sys.argv[1:]))
''')
# a run folder's saved config names the checkpoint plugin where it was
_up = PKG / "checkpoints" / "upgrade.py"
_u = _up.read_text()
_old = 'MOVED_TARGETS = {"attnlab.data.hf_source.hf_datamodule": "attnlab.families.hf_datamodule"}'
assert _old in _u
_up.write_text(_u.replace(_old, """MOVED_TARGETS = {"attnlab.data.hf_source.hf_datamodule": "attnlab.families.hf_datamodule",
                 "attnlab.utils.checkpoint_io.AtomicCheckpointIO": "attnlab.files.checkpoint_io.AtomicCheckpointIO"}"""))
subprocess.run(["git", "add", "-A", "src"], cwd=ROOT, check=True)
