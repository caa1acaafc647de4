"""Every bad input gets one line: a real ``python train.py`` on a real bad file or a bad config value exits with
status 2 and prints one error line naming the file (and line / byte offset) or the key, the value and what is
allowed, with no traceback. Each case stops before any training step: each costs the few seconds of starting
train.py (~7 s of CPU, most of it importing Lightning).

The same checks one level down (every message, in-process) live in tests/data/, tests/audio/, tests/models/test_vit.py
and tests/utils/test_validate.py; this file is the promise where the user meets it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_cli

from attnlab.data.ljspeech import write_ljspeech
from vision_helpers import write_tiny_cifar

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAST = ["debug=fast", "logger=none", "callbacks=none", "trainer=cpu"]


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """One folder of real bad inputs."""
    d = tmp_path_factory.mktemp("bad_inputs")
    (d / "one_column.tsv").write_text("Hello.\tBonjour.\nno tab here\nBye.\tSalut.\n", encoding="utf-8")
    (d / "empty.tsv").write_bytes(b"")
    (d / "latin1.tsv").write_bytes("Hi.\tSalut.\nCoffee.\tCaf\xe9.\n".encode("latin-1"))  # 0xe9 at byte 22, line 2
    (d / "a_folder.tsv").mkdir()
    (d / "empty.txt").write_bytes(b" \n\n")
    (d / "cifar_is_a_file").write_text("not a folder\n")
    write_tiny_cifar(d / "cifar_empty_batch", n_per_batch=10)
    (d / "cifar_empty_batch" / "data_batch_3").write_bytes(b"")
    # an LJSpeech folder whose second WAV was cut to half its bytes (an interrupted copy): libsndfile reads it
    # without complaint, so this would otherwise train on half an utterance
    t = np.arange(11025) / 22050
    items = [(f"u{i}", f"utterance number {i}", (np.sin(2 * np.pi * 220 * (i + 1) * t) * 8000).astype(np.int16))
             for i in range(4)]
    write_ljspeech(d / "ljspeech", items, 22050)
    wav = d / "ljspeech" / "wavs" / "u1.wav"
    wav.write_bytes(wav.read_bytes()[: wav.stat().st_size // 2])
    return d


# (id, train.py arguments with {bad} for the folder above, the message's distinctive part, what else the line names)
CASES = [
    # a translation corpus (data=tsv)
    ("tsv-one-column", ["model=transformer_mt", "data=tsv", "data.path={bad}/one_column.tsv"],
     "no tab between source and target", ["{bad}/one_column.tsv:2:", "'no tab here'"]),
    ("tsv-empty", ["model=transformer_mt", "data=tsv", "data.path={bad}/empty.tsv"],
     "parallel corpus has no sentence pairs", ["{bad}/empty.tsv"]),
    ("tsv-not-utf8", ["model=transformer_mt", "data=tsv", "data.path={bad}/latin1.tsv"],
     "parallel corpus is not valid UTF-8", ["{bad}/latin1.tsv:2", "byte offset 22", "0xe9"]),
    ("tsv-folder", ["model=transformer_mt", "data=tsv", "data.path={bad}/a_folder.tsv"],
     "parallel corpus is a folder, not a file", ["{bad}/a_folder.tsv"]),
    ("tsv-path-not-given", ["model=transformer_mt", "data=tsv"],
     "data.path is not set: give it on the command line (data.path=...)", []),
    # a language-model text (data=text_file)
    ("text-missing", ["model=causal_lm", "data=text_file", "data.path={bad}/nowhere.txt"],
     "text file not found", ["{bad}/nowhere.txt"]),
    ("text-empty", ["model=causal_lm", "data=text_file", "data.path={bad}/empty.txt"],
     "text file is empty", ["{bad}/empty.txt"]),
    # CIFAR-10 (data=cifar10)
    ("cifar-missing", ["model=vit", "data=cifar10", "data.path={bad}/no_cifar", "data.num_workers=0"],
     "CIFAR-10 folder not found", ["{bad}/no_cifar", "data.download=true"]),
    ("cifar-file-not-folder", ["model=vit", "data=cifar10", "data.path={bad}/cifar_is_a_file", "data.num_workers=0"],
     "CIFAR-10 folder is a file, not a folder", ["{bad}/cifar_is_a_file"]),
    ("cifar-empty-batch", ["model=vit", "data=cifar10", "data.path={bad}/cifar_empty_batch", "data.num_workers=0"],
     "malformed CIFAR-10 file", ["{bad}/cifar_empty_batch/data_batch_3", "not a readable pickle"]),
    # LJSpeech (data=ljspeech)
    ("ljspeech-truncated-wav", ["model=tts", "data=ljspeech", "data.path={bad}/ljspeech", "data.val_size=1",
                                "data.test_size=1"],
     "truncated: its header promises 22050 bytes of audio, the file holds 11003", ["{bad}/ljspeech/wavs/u1.wav"]),
    # model and optimizer settings
    ("d_model-not-a-number", ["model=causal_lm", "model.net.d_model=abc"],
     "model.net.d_model=abc: must be a positive integer", []),
    ("n_heads-zero", ["model=transformer_mt", "model.net.n_heads=0"],
     "model.net.n_heads=0: must be a positive integer", []),
    ("n_layers-zero", ["model=vit", "model.net.n_layers=0"],
     "model.net.n_layers=0: must be a positive integer", []),
    ("lr-negative", ["model=causal_lm", "model.optimizer.lr=-1"],
     "model.optimizer.lr=-1: must be a number > 0", []),
    ("image-size-mismatch", ["model=vit", "data.image_size=16", "model.net.image_size=8"],
     "model.net.image_size=8 but data.image_size=16", ["set both alike"]),
    # a trainer for a machine this is not (Lightning's own answer is a 4-line instantiate traceback)
    ("ddp-without-gpu", ["model=causal_lm", "trainer=ddp"],
     "trainer.accelerator=gpu but this machine has no CUDA GPU", ["trainer=ddp_cpu"]),
]


# Each of these takes the same code path as a case kept in the default suite (a bad file found by the same reader,
# after the same Lightning start-up of ~8 s) and is unit-tested in tests/data/; through train.py with `-m slow`.
SLOW = {"tsv-empty", "tsv-folder", "text-empty", "cifar-file-not-folder", "cifar-empty-batch"}


@pytest.mark.parametrize("args,message,names", [
    pytest.param(*c[1:], id=c[0], marks=pytest.mark.slow if c[0] in SLOW else pytest.mark.skipif(
        c[0] == "ddp-without-gpu" and torch.cuda.is_available(), reason="this machine has a GPU")) for c in CASES])
def test_bad_input_is_one_line_and_exit_2(args, message, names, bad, tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # it would show the traceback on purpose
    fill = lambda s: s.replace("{bad}", str(bad))  # noqa: E731
    out = run_cli([*FAST, *map(fill, args), f"hydra.run.dir={tmp_path}/run"], cache_dir, timeout=180)
    text = ANSI.sub("", out.stdout)
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], text[-3000:]
    assert text.count(message) == 1, text[-3000:]  # said once, not also in a traceback or a wrapper's message
    for name in map(fill, names):
        assert name in errors[0], errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained
