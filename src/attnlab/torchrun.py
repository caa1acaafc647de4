"""``python -m attnlab.torchrun``, as the docs spell it: :mod:`attnlab.cli.torchrun`."""

import sys

from attnlab.cli.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
