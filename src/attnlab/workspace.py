"""``python -m attnlab.workspace``, as the docs spell it: :mod:`attnlab.cli.workspace`."""

from attnlab.cli.workspace import main

if __name__ == "__main__":
    main()
