"""`translate.py` input handling as a user meets it: a line longer than the model reads, input that is not UTF-8,
bad options. On the committed tiny checkpoint (tests/fixtures, max 32 source tokens): what is asserted is what
reaches stdout and stderr and the exit status, not translation quality."""

from __future__ import annotations

import pytest
from test_safe_checkpoints import LEGACY_MT, cli, compose_cli

from attnlab.core.errors import OptionError
from attnlab.cli.translate import check_options

LONG = " ".join(["seventy-seven thousand"] * 20)  # ~200 tokens for this checkpoint's tokenizer: over its 32
LINES = ["twenty-one", "three hundred", LONG, "seven"]


def translate(tmp_path, cache_dir, *args: str, stdin: str | bytes | None = None):
    beam = [] if any(a.startswith("beam_size=") for a in args) else ["beam_size=1"]  # greedy unless asked
    return cli("translate.py", f"ckpt={LEGACY_MT}", *beam, f"hydra.run.dir={tmp_path / 'run'}", *args,
               stdin=stdin, cache_dir=cache_dir)


def one_line_error(proc, *words: str) -> str:
    """The one stderr line carrying the error: exit 2, no traceback, nothing on stdout."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if "ERROR" in x]
    assert all(w in line for w in words), line
    return line


@pytest.mark.slow  # the suite's 10-minute budget: test_on_too_long_truncate_and_error runs the same path
def test_a_too_long_line_is_skipped_and_the_others_translated(tmp_path, cache_dir):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n")
    proc = translate(tmp_path, cache_dir, f"input={src}")
    assert proc.returncode == 3, proc.stderr[-3000:]  # some lines skipped
    out = proc.stdout.split("\n")[:-1]
    assert len(out) == len(LINES)  # one output line per input line
    assert out[2] == "" and all(out[i] for i in (0, 1, 3)), out
    (note,) = [x for x in proc.stderr.splitlines() if "skipped" in x]
    assert "line(s) 3;" in note and str(src) in note and "32 tokens" in note, note
    # n_best > 1: lines carry their input index; a skipped input has none
    nbest = translate(tmp_path, cache_dir, f"input={src}", "beam_size=2", "n_best=2")
    assert nbest.returncode == 3, nbest.stderr[-3000:]
    assert [line.split("\t")[0] for line in nbest.stdout.splitlines()] == ["0", "0", "1", "1", "3", "3"]


def test_on_too_long_truncate_and_error(tmp_path, cache_dir):
    text = "\n".join(LINES) + "\n"
    cut = translate(tmp_path, cache_dir, "on_too_long=truncate", stdin=text)
    assert cut.returncode == 0, cut.stderr[-3000:]
    out = cut.stdout.split("\n")[:-1]
    assert len(out) == len(LINES) and out[2] != "", out
    assert any("first 32 tokens only of line(s) 3" in x for x in cut.stderr.splitlines()), cut.stderr[-2000:]
    stop = translate(tmp_path, cache_dir, "on_too_long=error", stdin=text)
    one_line_error(stop, "input line 3 has", "this model reads at most 32")


def test_invalid_utf8_is_named_by_line_or_replaced(tmp_path, cache_dir):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("twenty-one\nsoixante-dix-neuf \xe9t\xe9\nseven\n".encode("latin-1"))
    one_line_error(translate(tmp_path, cache_dir, f"input={bad}"), f"{bad} line 2 is not valid UTF-8",
                   "input_errors=replace")
    replaced = translate(tmp_path, cache_dir, f"input={bad}", "input_errors=replace")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert len(replaced.stdout.split("\n")[:-1]) == 3
    # stdin is read as bytes too (a text-mode read would raise UnicodeDecodeError with a traceback)
    proc = translate(tmp_path, cache_dir, stdin=b"one\n\xff\xfe\n")
    one_line_error(proc, "stdin line 2 is not valid UTF-8")


def test_bad_options_are_one_line(tmp_path, cache_dir):
    """Through the CLI once; every option's rule on the composed config (what the CLI checks first)."""
    one_line_error(translate(tmp_path, cache_dir, "beam_size=0", stdin="one\n"), "beam_size=0", "an integer >= 1")
    for args, words in [(["beam_size=2", "n_best=3"], ["n_best=3", "from 1 to beam_size (2)"]),
                        (["batch_size=0"], ["batch_size=0", "an integer >= 1"]),
                        (["max_len_b=-1"], ["max_len_b=-1", ">= 0"]),
                        (["on_too_long=drop"], ["on_too_long='drop'", "skip", "truncate", "error"]),
                        (["input_errors=ignore"], ["input_errors='ignore'", "strict or replace"]),
                        # checked before the model runs: a bad output= is refused before anything is translated
                        ([f"output={tmp_path}"], [f"output={tmp_path} is a folder"]),
                        ([f"output={__file__}/out.txt"], [f"{__file__} is a file, not a folder"])]:
        with pytest.raises(OptionError) as e:
            check_options(compose_cli("translate", ["ckpt=x.ckpt", *args]))
        assert all(w in str(e.value) for w in words), (args, str(e.value))
    check_options(compose_cli("translate", ["ckpt=x.ckpt", "beam_size=3", "n_best=3"]))


def test_missing_input_file_is_one_line(tmp_path, cache_dir):
    one_line_error(translate(tmp_path, cache_dir, f"input={tmp_path / 'none.txt'}"), "input file not found")


def test_a_beam_wider_than_the_vocabulary_is_one_line(tmp_path, cache_dir):
    proc = translate(tmp_path, cache_dir, "beam_size=100000", stdin="twenty-one\n")
    one_line_error(proc, "beam_size=100000 is wider than this model's vocabulary")
