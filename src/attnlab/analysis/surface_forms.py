"""``python -m attnlab.analysis.surface_forms`` moved: one line naming the new spelling."""

import sys

if __name__ == "__main__":
    sys.exit("attnlab.analysis.surface_forms moved: run python -m attnlab.cli.surface_forms " + " ".join(sys.argv[1:]))
