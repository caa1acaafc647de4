"""Where conf/ is, and the root (ATTNLAB_ROOT) that conf/paths puts outputs/, .cache/ and data/ under.

* From a checkout (``src/attnlab`` beside ``conf/train.yaml``, e.g. ``pip install -e .``): the repository's conf/,
  and the repository root as the root, whatever the current directory.
* From an installed wheel: the conf/ shipped inside the package (``attnlab/conf``, copied from the repository's by
  the build, see setup.py), and the current directory as the root: ``attnlab-train`` run in ``~/work`` writes
  ``~/work/outputs/`` and ``~/work/.cache/``.

ATTNLAB_ROOT, when set, is the root in both cases (it does not move conf/); ATTNLAB_CACHE moves only the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # (this file: attnlab/core/)
_CHECKOUT = PACKAGE_DIR.parents[1]
IN_CHECKOUT = PACKAGE_DIR.parent.name == "src" and (_CHECKOUT / "conf" / "train.yaml").is_file()

CONF_DIR = _CHECKOUT / "conf" if IN_CHECKOUT else PACKAGE_DIR / "conf"
ROOT = Path(os.environ.get("ATTNLAB_ROOT") or (_CHECKOUT if IN_CHECKOUT else Path.cwd()))
os.environ.setdefault("ATTNLAB_ROOT", str(ROOT))  # conf/paths/default.yaml reads it (also in subprocesses)
