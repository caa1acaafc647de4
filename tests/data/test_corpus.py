"""Text sources: the offline pydoc corpus and user text files with one-line errors."""

from pathlib import Path

import pytest

from attnlab.data.corpus import pydoc_text, read_text_file
from attnlab.core.errors import DataError, DataFileNotFoundError, UserError


def test_pydoc_text_is_large_english_and_deterministic():
    text = pydoc_text()
    assert isinstance(text, str) and len(text) > 300_000
    assert "assignment statement" in text.lower()
    assert pydoc_text() == text


def test_pydoc_text_stdlib_docstrings_append_more_text():
    base, more = pydoc_text(), pydoc_text(include_stdlib_docstrings=True)
    assert len(more) > len(base)
    assert more.startswith(base.rstrip("\n"))
    assert more == pydoc_text(include_stdlib_docstrings=True)


def test_read_text_file_roundtrip_unicode_and_bom(tmp_path):
    s = "héllo wörld — 日本語 🤖\r\nline two\n"
    p = tmp_path / "a.txt"
    p.write_bytes(s.encode("utf-8"))
    assert read_text_file(p) == s
    p.write_bytes(b"\xef\xbb\xbf" + s.encode("utf-8"))
    assert read_text_file(str(p)) == s


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_missing_file_error_names_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFileNotFoundError) as e:
        read_text_file("nope.txt")
    assert _one_line(e) == f"text file not found: {tmp_path / 'nope.txt'}"
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, UserError)  # train.py: one line, exit 2


def test_a_folder_is_not_a_text_file(tmp_path):
    with pytest.raises(DataFileNotFoundError) as e:
        read_text_file(tmp_path)
    assert _one_line(e) == f"text file is a folder, not a file: {tmp_path}"


def test_non_utf8_error_names_file_offset_and_line(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"first line\nsecond caf\xe9 line\n")
    with pytest.raises(DataError) as e:
        read_text_file(p)
    msg = _one_line(e)
    assert str(p) in msg and "UTF-8" in msg
    assert "byte offset 21" in msg and "line 2" in msg and "0xe9" in msg


@pytest.mark.parametrize("content", [b"", b"  \n\t\r\n  "])
def test_empty_or_whitespace_file_is_an_error(tmp_path, content):
    p = tmp_path / "empty.txt"
    p.write_bytes(content)
    with pytest.raises(DataError) as e:
        read_text_file(p)
    assert _one_line(e) == f"text file is empty: {Path(p).absolute()}"
