"""Audio: log-mel features, Griffin-Lim inversion, WAV files (used by the text-to-speech model)."""
