"""The bench package lives at the repository root, not in the installed package: importable from these tests
whether pytest runs as ``pytest`` or ``python -m pytest`` (as tests/claims does for experiments/)."""

import sys

from attnlab.core.paths import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
