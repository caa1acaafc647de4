"""attnlab works from a non-editable install: a wheel built from this checkout, installed into a fresh venv, trains
from a directory outside the repository with the conf/ it ships (attnlab/conf) and writes its run folder and data
cache under that directory (src/attnlab/core/paths.py).

The venv sees the machine's packages (``--system-site-packages``: torch & co. are not downloaded) and gets only the
wheel (``--no-deps``); PYTHONPATH and ATTNLAB_ROOT are removed from its environment, so neither this checkout's
``src/`` nor its root can leak in, and the test checks that ``attnlab`` is imported from the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from attnlab.core.paths import ROOT

# what the wheel is built from (a copy: an in-tree build would leave build/ behind and could pack stale files from it)
SOURCES = ["src", "conf", "pyproject.toml", "setup.py", "README.md"]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ATTNLAB_ROOT", "ATTNLAB_CACHE", "PYTEST_XDIST_WORKER")}
    return {**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}


def run(argv: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=clean_env(), timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def outer_site_packages() -> list[str]:
    """This interpreter's site-packages folders (a virtual environment's when the suite runs in one)."""
    import site

    found = [*site.getsitepackages(), site.getusersitepackages()]
    return [p for p in dict.fromkeys(found) if Path(p).is_dir()]


def test_wheel_trains_outside_the_repository(tmp_path):
    source = tmp_path / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, source / name)
    (source / "conf" / "local" / "default.yaml").write_text("seed: 7\n")  # a machine-local file must not ship

    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                 tmp_path / "dist", "."], cwd=source)
    assert built.returncode == 0, built.stdout[-3000:]
    (wheel,) = (tmp_path / "dist").glob("attnlab-*.whl")

    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=tmp_path)
    assert made.returncode == 0, made.stdout
    python = venv / "bin" / "python"
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # --system-site-packages sees the base interpreter's packages only: where this suite runs in a virtual
    # environment (the usual install), torch & co. live in that environment's site-packages, so they are added
    # after the new venv's own (a .pth line is a plain sys.path entry: the outer env's editable attnlab finder,
    # itself a .pth, is not run, and the wheel installed here comes first)
    (site / "_outer_environment.pth").write_text("\n".join(outer_site_packages()) + "\n")
    # pip comes from the machine's site-packages and installs into the venv; --ignore-installed: the machine's
    # editable attnlab of the same version must not count as already installed
    installed = run([python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", wheel], cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout[-3000:]

    work = tmp_path / "work"  # a user's directory, outside the repository
    work.mkdir()
    where = run([python, "-c", "import json, attnlab, attnlab.core.paths as p; "
                 "print(json.dumps([attnlab.__file__, str(p.CONF_DIR), str(p.ROOT)]))"], cwd=work)
    print(where.stdout)  # the installed package's attnlab.__file__, not this checkout's (shown with -s)
    package_file, conf_dir, root = map(Path, json.loads(where.stdout.splitlines()[-1]))
    assert package_file == site / "attnlab" / "__init__.py"
    assert conf_dir == site / "attnlab" / "conf" and (conf_dir / "train.yaml").is_file()
    assert not (conf_dir / "local" / "default.yaml").exists()
    assert root == work

    trained = run([venv / "bin" / "attnlab-train", "debug=fast", "logger=none", "trainer.max_steps=2",
                   "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"], cwd=work, timeout=600)
    assert trained.returncode == 0, trained.stdout[-4000:]
    (run_dir,) = (work / "outputs" / "debug" / "runs").iterdir()
    assert json.loads((run_dir / "metrics.json").read_text())["test/loss"] > 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert any((work / ".cache").rglob("*.json")), "the data cache goes under the working directory too"
    assert not (source / "outputs").exists() and not (ROOT / "outputs" / "debug" / "runs" / run_dir.name).exists()
