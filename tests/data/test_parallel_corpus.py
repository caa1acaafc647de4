"""Parallel TSV corpora: Tatoeba-style reading, one-line errors naming file and line, grouped splits, buckets."""

import logging

import pytest

from attnlab.core.errors import ConfigError, DataError, DataFileNotFoundError
from attnlab.data.parallel import (
    Pair,
    bucket_names,
    length_bucket,
    pairs_from_tsv,
    pairs_to_tsv,
    read_parallel_tsv,
    split_pairs,
    write_split_dir,
)

TATOEBA = (
    "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)\n"
    "Go.\tMarche.\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #8090732 (Micsmithel)\n"
    "Who are you?\tQui êtes-vous ?\tCC-BY 2.0\n"
    "I'm   fine.  \t  Je vais bien.\n"
)


def write(tmp_path, content, name="corpus.tsv"):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return p


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_reads_pairs_ignoring_extra_columns(tmp_path, caplog):
    p = write(tmp_path, TATOEBA + "\n\n")  # blank trailing lines are fine, silently
    with caplog.at_level(logging.WARNING):
        pairs = read_parallel_tsv(p)
    assert [(q.src, q.tgt) for q in pairs] == [
        ("Go.", "Va !"), ("Go.", "Marche."), ("Who are you?", "Qui êtes-vous ?"), ("I'm   fine.", "Je vais bien."),
    ]  # fmt: skip
    assert [q.line for q in pairs] == [1, 2, 3, 4]
    assert [q.bucket for q in pairs] == [0, 0, 0, 0] and pairs[0].n is None and pairs[0].name is None
    assert not caplog.records


def test_crlf_bom_and_anki_header(tmp_path):
    content = "#separator:tab\r\n#html:false\r\nHi.\tSalut.\r\nRun!\tCours !\r\n"
    pairs = read_parallel_tsv(write(tmp_path, b"\xef\xbb\xbf" + content.encode("utf-8")))
    assert [(q.src, q.tgt, q.line) for q in pairs] == [("Hi.", "Salut.", 3), ("Run!", "Cours !", 4)]


def test_blank_lines_inside_are_skipped_with_one_warning(tmp_path, caplog):
    p = write(tmp_path, "a\tb\n\n  \nc\td\n\ne\tf\n\n")
    with caplog.at_level(logging.WARNING):
        pairs = read_parallel_tsv(p)
    assert [q.src for q in pairs] == ["a", "c", "e"] and [q.line for q in pairs] == [1, 4, 6]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{p}: skipped 3 blank line(s) (first: line 2)"]


def test_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFileNotFoundError) as e:  # a UserError (train.py: one line, exit 2), a FileNotFoundError
        read_parallel_tsv("nope.tsv")
    assert one_line(e) == f"parallel corpus not found: {tmp_path / 'nope.tsv'}"


def test_a_folder_is_not_a_corpus(tmp_path):
    (tmp_path / "corpus.tsv").mkdir()
    with pytest.raises(DataFileNotFoundError) as e:
        read_parallel_tsv(tmp_path / "corpus.tsv")
    assert one_line(e) == f"parallel corpus is a folder, not a file: {tmp_path / 'corpus.tsv'}"


@pytest.mark.parametrize(
    "content,line,what",
    [
        ("a\tb\nno tab here\nc\td\n", 2, "no tab between source and target: 'no tab here'"),
        ("a\tb\nc\td\n\t target only\n", 3, "empty source sentence"),
        ("a\tb\n  \t\tattribution\n", 2, "empty source sentence"),
        ("a\tb\nsource only \t  \n", 2, "empty target sentence"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, content, line, what):
    p = write(tmp_path, content)
    with pytest.raises(DataError) as e:
        read_parallel_tsv(p)
    msg = one_line(e)
    assert msg.startswith(f"{p}:{line}: {what}")


def test_non_utf8_names_file_line_and_byte_offset(tmp_path):
    p = write(tmp_path, b"Hi.\tSalut.\nCoffee.\tCaf\xe9.\n")
    with pytest.raises(DataError) as e:
        read_parallel_tsv(p)
    assert one_line(e) == f"parallel corpus is not valid UTF-8: {p}:2 (byte 0xe9 at byte offset 22, line 2)"


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"#separator:tab\n"])
def test_no_pairs_is_an_error(tmp_path, content):
    p = write(tmp_path, content)
    with pytest.raises(DataError) as e:
        read_parallel_tsv(p)
    assert one_line(e) == f"parallel corpus has no sentence pairs: {p}"


def test_length_buckets():
    assert bucket_names((3, 6, 9)) == ["1-3", "4-6", "7-9", "10+"]
    assert bucket_names((1, 2)) == ["1", "2", "3+"]
    words = ["w"] * 12
    got = [length_bucket(" ".join(words[:k])) for k in range(1, 13)]
    assert got == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert length_bucket("twenty-one thousand") == 0  # a hyphenated compound is one word


def test_split_is_deterministic_and_grouped_by_source():
    pairs = [Pair(f"s{i // 3}", f"t{i}") for i in range(600)]  # 200 sources, 3 translations each
    a = split_pairs(pairs, 0.1, 0.2, seed=0)
    assert split_pairs(pairs, 0.1, 0.2, seed=0) == a
    assert split_pairs(pairs, 0.1, 0.2, seed=1) != a
    sources = {k: {p.src for p in v} for k, v in a.items()}
    assert [len(sources[k]) for k in ("train", "val", "test")] == [140, 20, 40]
    assert not sources["train"] & sources["val"] and not sources["train"] & sources["test"]
    assert sum(len(v) for v in a.values()) == 600
    for v in a.values():  # file order kept inside a split
        assert [int(p.tgt[1:]) for p in v] == sorted(int(p.tgt[1:]) for p in v)
    with pytest.raises(ConfigError, match="must be in"):
        split_pairs(pairs, 0.6, 0.5, seed=0)
    with pytest.raises(DataError, match="too few"):
        split_pairs(pairs[:2], 0.1, 0.1, seed=0)


def test_cache_format_roundtrip_and_atomic_dir(tmp_path):
    pairs = [Pair("Alice has one", "Alice a un", 0, 1, "Alice"), Pair("two", "deux", 0, 2, None)]
    d = write_split_dir(tmp_path / "k", {"train.tsv": pairs_to_tsv(pairs)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]
    back = pairs_from_tsv(d / "train.tsv")
    assert [(p.src, p.tgt, p.bucket, p.n, p.name) for p in back] == [
        (p.src, p.tgt, p.bucket, p.n, p.name) for p in pairs]  # fmt: skip
    # a second writer finding the directory complete keeps it
    assert write_split_dir(tmp_path / "k", {"train.tsv": "other"}) == d
    assert pairs_from_tsv(d / "train.tsv") == back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]
    with pytest.raises(ValueError, match="tab or newline"):
        pairs_to_tsv([Pair("a\tb", "c")])
