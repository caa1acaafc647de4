"""``python -m attnlab.generate``, as the docs spell it: :mod:`attnlab.cli.generate`."""

from attnlab.cli.generate import main

if __name__ == "__main__":
    main()
