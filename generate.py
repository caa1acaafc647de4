"""`python generate.py ckpt=... prompt="..."` — sample from a trained language model (see docs/language_model.md)."""

from attnlab.cli.generate import main

if __name__ == "__main__":
    main()
