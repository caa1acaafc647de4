"""LJSpeech-format speech corpora: ``<folder>/metadata.csv`` (``id|raw text|normalized text``, no header, UTF-8) and
``<folder>/wavs/<id>.wav`` (mono, 22,050 Hz, 16-bit). Read for ``data=ljspeech data.path=…``; written by the eSpeak
corpus generator (``data=espeak``), so the same reader serves both.

Every problem with the folder is one line naming the file (and line): a missing folder, metadata or WAV; a
malformed metadata line; stereo audio; another sample rate (see :func:`attnlab.audio.wav.read_wav`). Torch-free:
train.py reads a corpus through these functions before it imports Lightning (:mod:`attnlab.runs.data_check`), the data
module (:mod:`attnlab.data.speech_datamodule`) through the same ones after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio.wav import read_wav, write_wav
from ..core.errors import AudioFileError, CorpusError
from ..files.folder_paths import plain_name
from .characters import CharVocab

METADATA = "metadata.csv"


@dataclass(frozen=True)
class Entry:
    id: str
    text: str  # the normalized text (3rd column) when present, else the raw one
    wav: Path


def corpus_folder(path: str | os.PathLike | None) -> Path:
    """The folder ``data.path`` names; one line when it is not set."""
    if not path:
        raise CorpusError("data.path is not set: give the LJSpeech folder, e.g. data.path=~/data/LJSpeech-1.1")
    return Path(path).expanduser()


def read_metadata(folder: str | Path) -> list[Entry]:
    folder = Path(folder).expanduser().absolute()
    meta = folder / METADATA
    if not folder.is_dir():
        raise CorpusError(f"LJSpeech folder not found: {folder} (set data.path to a folder with {METADATA} and wavs/)")
    if not meta.is_file():
        raise CorpusError(f"LJSpeech metadata not found: {meta}")
    try:
        lines = meta.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        line = meta.read_bytes().count(b"\n", 0, e.start) + 1
        raise CorpusError(f"{meta} is not valid UTF-8 (line {line}, byte offset {e.start})") from None
    entries = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 2 or not fields[0] or not fields[-1].strip():
            raise CorpusError(f"{meta}:{n}: expected 'id|text|normalized text', got {line[:80]!r}")
        if not plain_name(fields[0]):  # the id names a file of wavs/: never a path out of the corpus folder
            raise CorpusError(f"{meta}:{n}: the id {fields[0][:80]!r} is not a plain file name (wavs/<id>.wav)")
        text = fields[2] if len(fields) >= 3 and fields[2].strip() else fields[1]
        entries.append(Entry(fields[0], text.strip(), folder / "wavs" / f"{fields[0]}.wav"))
    if not entries:
        raise CorpusError(f"{meta} lists no utterances")
    return entries


def utterances(folder: str | Path, vocab: CharVocab, max_chars: int,
               limit: int | None = None) -> tuple[list[tuple[Entry, list[int]]], int]:
    """The metadata's entries (only the first ``limit`` when given) whose text is 1 to ``max_chars`` characters, each
    with its character ids; and how many were left out for their text (their audio is never read)."""
    entries = read_metadata(folder)
    if limit:
        entries = entries[:limit]
    kept = [(e, ids) for e in entries if (ids := vocab.encode(e.text)) and len(ids) <= max_chars]
    return kept, len(entries) - len(kept)


def load_audio(entry: Entry, sample_rate: int) -> np.ndarray:
    try:
        return read_wav(entry.wav, sample_rate)
    except AudioFileError as e:
        raise CorpusError(str(e)) from e


def write_ljspeech(folder: str | Path, items: list[tuple[str, str, np.ndarray]], sample_rate: int) -> Path:
    """Write ``(id, text, int16 samples)`` items as an LJSpeech folder, atomically (a half-written folder never
    appears under ``folder``: it is built next to it and renamed)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        lines = []
        for uid, text, samples in items:
            if "|" in text or "\n" in text:
                raise ValueError(f"utterance {uid}: text may not contain '|' or a newline: {text!r}")
            write_wav(tmp / "wavs" / f"{uid}.wav", samples, sample_rate)
            lines.append(f"{uid}|{text}|{text}")
        (tmp / METADATA).write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process wrote it first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
