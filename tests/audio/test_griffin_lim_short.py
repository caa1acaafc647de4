"""Griffin-Lim on the very short mels an untrained TTS model emits in free-running validation (1-3 frames).

Reflect padding needs more than n_fft/2 samples; before the fix a 2-3 frame output crashed the whole training run
at its first validation ("Padding size should be less than the corresponding input dimension").
"""

import pytest
import torch

from attnlab.audio.features import MelConfig, MelExtractor
from attnlab.audio.wav import read_wav, write_wav


@pytest.mark.parametrize("frames", [1, 2, 3, 4, 6])
def test_short_mels_give_a_waveform_of_the_right_length(frames, tmp_path):
    cfg = MelConfig()
    wave = MelExtractor(cfg).griffin_lim(torch.randn(frames, cfg.n_mels), n_iter=2)
    assert wave.shape == ((frames - 1) * cfg.hop_length,)
    assert torch.isfinite(wave).all()
    if frames > 1:
        assert 0.9 < float(wave.abs().max()) <= 0.95 + 1e-6  # peak-normalized, not silence
    back = read_wav(write_wav(tmp_path / "w.wav", wave, cfg.sample_rate), cfg.sample_rate)
    assert len(back) == wave.shape[0]
