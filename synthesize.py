"""`python synthesize.py ckpt=... text="twenty one"` — speak text with a trained TTS model (see docs/tts.md)."""

from attnlab.cli.synthesize import main

if __name__ == "__main__":
    main()
