"""``python -m attnlab.compare``, as the docs spell it: :mod:`attnlab.cli.compare`."""

from attnlab.cli.compare import main

if __name__ == "__main__":
    main()
