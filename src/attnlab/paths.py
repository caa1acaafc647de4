"""Where the repository's conf/ lives, and the ATTNLAB_ROOT that conf/paths resolves against."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(os.environ.get("ATTNLAB_ROOT") or Path(__file__).resolve().parents[2])
CONF_DIR = ROOT / "conf"
os.environ.setdefault("ATTNLAB_ROOT", str(ROOT))
