"""Log-mel features, their inversion (Griffin-Lim) and WAV I/O, on real signals (a sine, eSpeak speech)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch

from attnlab.audio.features import MelConfig, MelExtractor, hz_to_mel, mel_filterbank
from attnlab.core.errors import AudioFileError
from attnlab.audio.wav import read_wav, wav_data_sizes, write_wav

SR = 22050


def test_mel_filterbank_equals_librosa():
    librosa = pytest.importorskip("librosa")
    ours = mel_filterbank(SR, 1024, 80, 0.0, 8000.0).numpy()
    theirs = librosa.filters.mel(sr=SR, n_fft=1024, n_mels=80, fmin=0.0, fmax=8000.0)
    assert ours.shape == (80, 513)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-8)


def test_log_mel_of_a_sine_peaks_at_its_frequency_and_silence_is_the_floor():
    extract = MelExtractor()
    t = torch.arange(SR) / SR  # one second
    frames = extract(0.5 * torch.sin(2 * math.pi * 1000.0 * t))
    assert frames.shape == (SR // 256 + 1, 80)  # centered STFT: samples // hop + 1 frames
    peak_bin = int(frames[10:-10].mean(0).argmax())
    # the filter whose centre is nearest to 1 kHz on the mel scale
    centres = np.linspace(hz_to_mel(0.0), hz_to_mel(8000.0), 82)[1:-1]
    assert abs(peak_bin - int(np.abs(centres - hz_to_mel(1000.0)).argmin())) <= 1
    silence = extract(torch.zeros(SR // 4))
    cfg = extract.cfg
    assert torch.allclose(silence, torch.full_like(silence, (math.log(cfg.log_floor) - cfg.mean) / cfg.std))


def test_griffin_lim_inverts_a_speech_mel():
    from attnlab.audio.espeak import ESpeak

    wave = torch.from_numpy(ESpeak.get().synthesize("three hundred and five").astype(np.float32) / 32768)
    extract = MelExtractor()
    mel = extract(wave)
    rebuilt = extract.griffin_lim(mel, n_iter=16)
    assert rebuilt.shape[0] == (mel.shape[0] - 1) * 256 and rebuilt.abs().max() <= 0.95 + 1e-6
    again = extract(rebuilt)[: mel.shape[0]]
    err = (again - mel).abs().mean()
    # the mel of the rebuilt audio is close to the original one; a shuffled (wrong) mel is far from it
    assert err < 0.35, err
    assert (mel[torch.randperm(mel.shape[0])] - mel).abs().mean() > 2 * err


def test_mel_config_round_trips_as_a_dict():
    cfg = MelConfig(n_mels=40, mean=-4.0)
    assert MelConfig.from_cfg(cfg.to_dict()) == cfg and MelExtractor(cfg).basis.shape == (40, 513)


def test_wav_round_trip_and_one_line_errors(tmp_path):
    x = np.sin(np.linspace(0, 200, 4000)).astype(np.float32) * 0.5
    path = write_wav(tmp_path / "a.wav", x, SR)
    y = read_wav(path, SR)
    assert y.dtype == np.float32 and np.abs(y - x).max() < 1e-3

    sf.write(tmp_path / "stereo.wav", np.stack([x, x], axis=1), SR)
    sf.write(tmp_path / "rate.wav", x, 16000)
    (tmp_path / "junk.wav").write_bytes(b"not a wav file at all")
    cases = {"stereo.wav": "2 channels; expected mono", "rate.wav": "sample rate 16000 Hz; expected 22050 Hz",
             "junk.wav": "cannot read audio file", "missing.wav": "audio file not found"}
    for name, message in cases.items():
        with pytest.raises(AudioFileError) as e:
            read_wav(tmp_path / name, SR)
        assert message in str(e.value) and name in str(e.value) and "\n" not in str(e.value)


def test_a_truncated_wav_is_refused_with_the_sizes(tmp_path):
    # libsndfile reads a WAV cut short without complaint, returning the frames that are there: half an utterance
    x = (np.sin(np.linspace(0, 200, 4000)) * 0.5).astype(np.float32)
    whole = write_wav(tmp_path / "whole.wav", x, SR).read_bytes()  # 44-byte header + 8000 bytes of audio
    assert wav_data_sizes(tmp_path / "whole.wav") == (8000, 8000)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(whole[: len(whole) // 2])
    assert len(sf.read(cut)[0]) < len(x)  # what would have been trained on
    with pytest.raises(AudioFileError) as e:
        read_wav(cut, SR)
    assert str(e.value) == (f"{cut}: truncated: its header promises 8000 bytes of audio, the file holds 3978 "
                            "(an interrupted copy or download? copy the file again)")
    # a streaming writer's placeholder size (0xFFFFFFFF: "until the end") is no promise: read as it is
    streamed = bytearray(whole)
    streamed[40:44] = (0xFFFFFFFF).to_bytes(4, "little")
    (tmp_path / "streamed.wav").write_bytes(bytes(streamed))
    assert wav_data_sizes(tmp_path / "streamed.wav") is None
    # trailing bytes after the audio (a pad byte, a LIST chunk) are fine
    (tmp_path / "longer.wav").write_bytes(whole + b"\0")
    assert len(read_wav(tmp_path / "longer.wav", SR)) == len(x)
