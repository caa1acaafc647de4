"""``python -m attnlab.export``, as the docs spell it: :mod:`attnlab.cli.export`."""

from attnlab.cli.export import main

if __name__ == "__main__":
    main()
