"""``python -m attnlab.translate``, as the docs spell it: :mod:`attnlab.cli.translate`."""

from attnlab.cli.translate import main

if __name__ == "__main__":
    main()
