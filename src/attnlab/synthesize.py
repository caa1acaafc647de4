"""``python -m attnlab.synthesize``, as the docs spell it: :mod:`attnlab.cli.synthesize`."""

from attnlab.cli.synthesize import main

if __name__ == "__main__":
    main()
