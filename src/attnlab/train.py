"""``python -m attnlab.train``, as the docs spell it: :mod:`attnlab.cli.train`."""

from attnlab.cli.train import main

if __name__ == "__main__":
    main()
