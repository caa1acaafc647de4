"""``python -m attnlab.explore``, as the docs spell it: :mod:`attnlab.cli.explore`."""

from attnlab.cli.explore import main

if __name__ == "__main__":
    main()
