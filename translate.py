"""`echo "twenty-one" | python translate.py ckpt=...` — translate with a trained checkpoint (see docs/translation.md)."""

from attnlab.cli.translate import main

if __name__ == "__main__":
    main()
