"""The import layers of docs/layout.md hold over every module of src/attnlab: no import points up, none goes where
its row says "never imports", no modules import each other round a circle, and neither do the packages.

The table names top-level packages (and the entry points' shims), each on one layer; a module belongs to its
package's layer, and a module under no listed package fails (it must be placed). The layers are read from the
table in docs/layout.md, so the documentation and the check cannot drift apart. Every import statement counts: at
module level or inside a function, relative or absolute (a late import still ties the two modules together).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnlab"
LAYOUT = ROOT / "docs" / "layout.md"


@dataclass(frozen=True)
class Row:
    layer: int
    names: tuple[str, ...]  # module prefixes, relative to attnlab ("models", "utils.plotting")
    never: tuple[str, ...]


def read_table(text: str) -> list[Row]:
    """The rows of the table under "## Import layers": ``| layer | modules | never imports |``."""
    section = text.split("## Import layers", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            names = lambda cell: tuple(re.findall(r"`([\w.]+)`", cell))  # noqa: E731 - the code spans of a cell
            rows.append(Row(int(cells[0]), names(cells[1]), names(cells[2])))
    return rows


def module_files(package: Path) -> dict[str, Path]:
    """Dotted name relative to the package ("data.tokenizer"; a package's ``__init__`` is the package) -> file."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[tuple[str, int]]:
    """``(module, line)`` for each attnlab module ``name`` imports, resolved to the module file that runs: ``from
    .x import y`` is module ``x.y`` when that is a file, else ``x``. The root package (``attnlab``) is ""."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if name else []
    package = here if is_package else here[:-1]

    def resolve(dotted: str) -> str | None:
        while dotted not in known:
            if not dotted:
                return None
            dotted = dotted.rpartition(".")[0]
        return dotted

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "attnlab" or alias.name.startswith("attnlab."):
                    found.add((resolve(alias.name.removeprefix("attnlab").lstrip(".")), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "attnlab" or (node.module or "").startswith("attnlab."):
                module = node.module.removeprefix("attnlab").lstrip(".")
            else:
                continue
            for alias in node.names:
                inner = f"{module}.{alias.name}" if module else alias.name
                found.add((resolve(inner if inner in known else module), node.lineno))
    return {(m, line) for m, line in found if m is not None and m != name}


def libraries(path: Path) -> set[tuple[str, int]]:
    """``(library, line)`` for each import of a package from outside attnlab (``hydra``, ``lightning``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
        found |= {(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] != "attnlab"}
    return found


def library_arrows(package: Path, rows: list[Row]) -> list[str]:
    """Every import of a library a module's row says it never imports (the parts import no Hydra)."""
    out = []
    for name, path in module_files(package).items():
        place = placement(rows, name) if name else None
        for library, line in sorted(libraries(path)) if place else ():
            if library in place[1]:
                out.append(f"{name}:{line} -> {library} (its row never imports {library})")
    return out


def graph(package: Path) -> dict[str, set[tuple[str, int]]]:
    files = module_files(package)
    return {name: imports(name, path, set(files)) for name, path in files.items()}


def package(module: str) -> str:
    """The top-level package (or flat module) a module belongs to: ``runs.plan`` -> ``runs``."""
    return module.split(".")[0]


def placement(rows: list[Row], module: str) -> tuple[int, tuple[str, ...]] | None:
    """(layer, never-imports packages) of the row naming ``module``'s package; None if no row names it."""
    for row in rows:
        if package(module) in row.names:
            return row.layer, row.never
    return None


def unplaced(edges: dict, rows: list[Row]) -> list[str]:
    """Modules under no package the table names (the root package itself excepted)."""
    return sorted(m for m in edges if m and placement(rows, m) is None)


def package_edges(edges: dict[str, set[tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    """The import graph between packages: ``a -> b`` when a module of ``a`` imports one of ``b``."""
    out: dict[str, set[tuple[str, int]]] = {}
    for source, targets in edges.items():
        if not source:
            continue
        out.setdefault(package(source), set())
        for target, line in targets:
            if target and package(target) != package(source):
                out[package(source)].add((package(target), line))
    return out


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def wrong_arrows(edges: dict[str, set[tuple[str, int]]], rows: list[Row]) -> list[str]:
    """Every import that points up a layer or into a module its row never imports, as text for the report."""
    out = []
    for source in sorted(edges):
        if placement(rows, source) is None:
            continue  # (reported by unplaced)
        layer, never = placement(rows, source)
        for target, line in sorted(edges[source]):
            if not target or placement(rows, target) is None:
                continue
            target_layer, _ = placement(rows, target)
            if target_layer > layer:
                out.append(f"{source}:{line} -> {target} (layer {layer} imports layer {target_layer})")
            elif under(target, never):
                out.append(f"{source}:{line} -> {target} (its row never imports {', '.join(never)})")
    return out


def cycles(edges: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    succ = {m: sorted({t for t, _ in e if t in edges}) for m, e in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return read_table(LAYOUT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def edges() -> dict[str, set[tuple[str, int]]]:
    return graph(PACKAGE)


def test_no_import_points_up_or_across(rows, edges):
    arrows = wrong_arrows(edges, rows)
    assert not arrows, f"{len(arrows)} import(s) against docs/layout.md's layers:\n" + "\n".join(arrows)


def test_no_library_its_row_excludes(rows):
    arrows = library_arrows(PACKAGE, rows)
    assert not arrows, f"{len(arrows)} import(s) of excluded libraries:\n" + "\n".join(arrows)


def test_no_import_cycles(edges):
    found = cycles(edges)
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_package_cycles(edges):
    """The packages point one way: no two import each other, directly or round a circle."""
    found = cycles(package_edges(edges))
    assert not found, f"{len(found)} package cycle(s):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_is_placed_and_no_package_is_split(rows, edges):
    """Each module is in a package the table names; the table names whole packages, each on one row."""
    assert not unplaced(edges, rows), f"modules under no package of docs/layout.md's layers: {unplaced(edges, rows)}"
    names = [n for r in rows for n in r.names]
    assert all("." not in n for n in names), f"the table splits a package: {[n for n in names if '.' in n]}"
    assert len(names) == len(set(names)), f"a package on two rows: {sorted(n for n in names if names.count(n) > 1)}"


def test_the_table_names_modules_that_exist(rows, edges):
    """A renamed or removed package would leave its row naming nothing."""
    import importlib.util

    names = [n for r in rows for n in r.names + r.never]
    assert len(rows) >= 5 and "core" in names
    missing = [n for n in names if not any(package(m) == n for m in edges if m)
               and not (n in {x for r in rows for x in r.never} and importlib.util.find_spec(n))]  # or a library
    assert not missing, f"docs/layout.md's import layers name packages that do not exist: {missing}"


def test_the_check_sees_each_kind_of_import(tmp_path, rows):
    """The checker itself: a late, a relative and an absolute import that point up, one into a "never" row, a circle
    of modules, a circle of packages and a module under no listed package are all reported (a checker that saw
    nothing would pass the tests above)."""
    pkg = tmp_path / "attnlab"
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/errors.py": "",
        "cli/__init__.py": "",
        "cli/train.py": "",
        "modules/__init__.py": "",
        "modules/a.py": "def f():\n    from ..cli.train import main\n",  # late, relative: up
        "modules/b.py": "import attnlab.data.c\n",  # absolute: across (modules never imports data)
        "modules/e.py": "import torch\ndef f():\n    from hydra.utils import instantiate\n",  # a library it never imports
        "data/__init__.py": "",
        "data/c.py": "from attnlab.data import d\n",
        "data/d.py": "from . import c\nfrom attnlab.core.errors import X\n",  # a circle with c; core is below: fine
        "optim/__init__.py": "from ..metrics import m\n",  # optim and metrics: one layer, importing each other
        "metrics/__init__.py": "",
        "metrics/m.py": "from attnlab import optim\n",
        "stray.py": "",  # in no package of the table
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    found = graph(pkg)
    arrows = wrong_arrows(found, rows)
    assert [a.split(" ")[0] for a in arrows] == ["modules.a:2", "modules.b:1"], arrows
    assert cycles(found) == [["data.c", "data.d"], ["metrics.m", "optim"]]
    assert cycles(package_edges(found)) == [["metrics", "optim"]]
    assert unplaced(found, rows) == ["stray"]
    assert library_arrows(pkg, rows) == ["modules.e:3 -> hydra (its row never imports hydra)"]
