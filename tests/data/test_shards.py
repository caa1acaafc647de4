"""Streaming tokenization into shards: token-for-token equal to encoding the whole text, many files, interrupted runs
that never trust a half-written shard, the tokenizer trained from chunks, and training from the shards."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

import attnlab.data.lm_datamodule as lmdm
import folder_tokenizers
import attnlab.data.shards as shards
from attnlab.data.corpus import pydoc_text
from attnlab.core.errors import DataError, DataFileNotFoundError
from attnlab.data.loading import StridedSampler
from attnlab.data.normalization import TextNormalization
from attnlab.data.shards import TokenStream, build_shards, read_manifest
from attnlab.data.text_sources import TextSource, iter_chunks, resolve_files
from attnlab.data.tokenizer import EOS_ID, train_bpe

CHUNK = 2048  # bytes: ~30 chunks in the text below, so that many cuts are exercised


def sample_text(n_chars: int = 60_000) -> str:
    """pydoc prose plus what chunk cuts must get right: CRLF lines, runs of blank lines, trailing spaces, accents
    (composed and decomposed), a long run (cut at 64 characters by the pre-tokenizer), non-ASCII at line ends."""
    rng = np.random.default_rng(0)
    lines = pydoc_text()[:n_chars].split("\n")
    extra = ["café\r", "cafe\u0301 au lait\r", "   indented", "trailing   ", "", "", "", "x" * 150, "naïve — ΟΔΟΣ",
             "日本語の文。", "tab\tseparated\tvalues", "\r"]
    for i in rng.choice(len(lines), 300):
        lines.insert(int(i), extra[int(rng.integers(len(extra)))])
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "corpus.txt"
    p.write_bytes(b"\xef\xbb\xbf" + sample_text().encode("utf-8"))  # a BOM, as some editors write it
    return p


def stream(out_dir) -> np.ndarray:
    return np.asarray(TokenStream.open(out_dir), dtype=np.int64)


NORMALIZATIONS = {
    "default": {"unicode": "NFC"},
    # the whitespace collapse strips the text's ends (never a chunk's), remove= characters never sit at a cut
    "collapse-lower-remove": {"unicode": "NFKC", "remove": ".,()", "whitespace": True, "case": "lower"},
}


@pytest.mark.parametrize("spec", NORMALIZATIONS)
def test_streamed_shards_equal_encoding_the_whole_text(spec, text_file, tmp_path):
    norm = TextNormalization.from_config(NORMALIZATIONS[spec])
    text = text_file.read_bytes().decode("utf-8-sig")  # line endings as they are
    normalizer = norm.normalizer([text])
    tok = train_bpe(normalizer.normalize_str(text), 300, normalizer)
    src = [TextSource.from_file(text_file)]
    assert len(list(iter_chunks(src, CHUNK, avoid=norm.remove))) > 20
    m = build_shards(src, tok, tmp_path, chunk_bytes=CHUNK, shard_tokens=5000, avoid=norm.remove)
    assert m["complete"] and len(m["shards"]) > 3 and m["dtype"] == "uint16"
    ids = stream(tmp_path)
    assert ids.tolist() == tok.encode(text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"] + [s["file"] for s in m["shards"]]


def test_one_giant_line_is_cut_mid_line_with_a_warning(tmp_path, caplog):
    p = tmp_path / "line.txt"
    text = " ".join(f"w{i % 97}é" for i in range(3000))  # no line break at all, 2-byte characters
    p.write_text(text, encoding="utf-8")
    tok = train_bpe(text, 300)
    with caplog.at_level(logging.WARNING):
        build_shards([TextSource.from_file(p)], tok, tmp_path / "s", chunk_bytes=256)
    assert "cut mid-line" in caplog.text
    assert tok.decode(stream(tmp_path / "s")) == text  # every character once, in order


def test_folder_and_glob_are_files_in_sorted_order_separated_by_eos(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("second file\nwith two lines\n")
    (d / "a.txt").write_text("first file\n")
    (d / "sub" / "c.md").write_text("third, in a subfolder\n")
    (d / ".hidden.txt").write_text("not part of the corpus\n")
    assert [p.name for p in resolve_files(d)] == ["a.txt", "b.txt", "c.md"]
    assert [p.name for p in resolve_files(f"{d}/*.txt")] == ["a.txt", "b.txt"]
    assert [p.name for p in resolve_files(f"{d}/**/*.md")] == ["c.md"]
    files = resolve_files(d)
    texts = [p.read_text() for p in files]
    tok = train_bpe("".join(texts), 300)
    build_shards([TextSource.from_file(p) for p in files], tok, tmp_path / "s", chunk_bytes=16)
    want = tok.encode(texts[0]) + [EOS_ID] + tok.encode(texts[1]) + [EOS_ID] + tok.encode(texts[2])
    assert stream(tmp_path / "s").tolist() == want
    with pytest.raises(DataFileNotFoundError, match=r"^no text files match .*docs/\*\.csv$"):
        resolve_files(f"{d}/*.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileNotFoundError, match=r"^no text files in folder .*empty$"):
        resolve_files(tmp_path / "empty")


def test_a_changed_file_gets_new_shards(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("some text here\n" * 50)
    tok = train_bpe(p.read_text(), 300)
    before = shards.shards_dir([TextSource.from_file(p)], tok, tmp_path)
    p.write_text("other text here\n" * 50)
    assert shards.shards_dir([TextSource.from_file(p)], tok, tmp_path) != before


def test_a_run_interrupted_midway_resumes_where_its_last_shard_ended(text_file, tmp_path, monkeypatch):
    text = text_file.read_bytes().decode("utf-8-sig")  # line endings as they are
    tok = train_bpe(text, 300)
    src = [TextSource.from_file(text_file)]
    straight = tmp_path / "straight"
    build_shards(src, tok, straight, chunk_bytes=CHUNK, shard_tokens=4000, batch_chunks=2)

    calls, fail = [], [True]
    real = shards.ChunkEncoder.encode

    def failing(self, chunks):
        calls.append(len(chunks))
        if fail[0] and len(calls) == 6:
            raise RuntimeError("interrupted")  # an error (or Ctrl-C) in the middle of a shard
        return real(self, chunks)

    out = tmp_path / "cut"
    monkeypatch.setattr(shards.ChunkEncoder, "encode", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        build_shards(src, tok, out, chunk_bytes=CHUNK, shard_tokens=4000, batch_chunks=2)
    m = read_manifest(out)
    assert not m["complete"] and 0 < len(m["shards"]) < len(read_manifest(straight)["shards"])
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [s["file"] for s in m["shards"]]
    with pytest.raises(FileNotFoundError, match="no complete token shards"):
        TokenStream.open(out)

    calls.clear()
    fail[0] = False
    done = build_shards(src, tok, out, chunk_bytes=CHUNK, shard_tokens=4000, batch_chunks=2)
    assert done["complete"] and sum(calls) < len(list(iter_chunks(src, CHUNK)))  # resumed, not restarted
    assert done["shards"] == read_manifest(straight)["shards"]
    assert np.array_equal(stream(out), stream(straight))
    assert stream(out).tolist() == tok.encode(text)


def test_a_killed_process_leaves_no_trusted_half_shard(text_file, tmp_path):
    """SIGKILL in the middle of a shard: its temp file is never trusted; a truncated shard the manifest lists (a
    disk that lost its tail) is not either; the next run completes with the straight run's tokens."""
    out = tmp_path / "s"
    script = textwrap.dedent(f"""
        import os, signal
        import attnlab.data.shards as shards
        from attnlab.data.tokenizer import train_bpe
        from attnlab.data.text_sources import TextSource
        text = open({str(text_file)!r}, "rb").read().decode("utf-8-sig")
        real = shards._ShardWriter.write
        def write(self, ids):
            real(self, ids)
            if self.index == 2 and self.tokens > 1000:  # the third shard, half written
                self.f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        shards._ShardWriter.write = write
        shards.build_shards([TextSource.from_file({str(text_file)!r})], train_bpe(text, 300), {str(out)!r},
                            chunk_bytes={CHUNK}, shard_tokens=4000, batch_chunks=2)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    m = read_manifest(out)
    assert not m["complete"] and m["shards"]
    temps = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert temps and not any(s["file"] in temps for s in m["shards"])  # the half shard exists only as a temp file
    first = out / m["shards"][0]["file"]
    first.write_bytes(first.read_bytes()[:-2])  # a listed shard that lost its tail is not trusted either

    text = text_file.read_bytes().decode("utf-8-sig")  # line endings as they are
    tok = train_bpe(text, 300)
    done = build_shards([TextSource.from_file(text_file)], tok, out, chunk_bytes=CHUNK, shard_tokens=4000)
    assert done["complete"] and stream(out).tolist() == tok.encode(text)


def test_tokenizer_trained_from_chunks_is_the_whole_text_tokenizer(text_file, tmp_path, monkeypatch):
    monkeypatch.setattr(lmdm, "CHUNK_BYTES", CHUNK)
    text = text_file.read_bytes().decode("utf-8-sig")  # line endings as they are
    norm = TextNormalization.from_config({"unicode": "NFC"})
    normalizer = norm.normalizer([text])
    src = [TextSource.from_file(text_file)]
    streamed = lmdm.corpus_tokenizer(src, 400, tmp_path, norm)
    assert streamed.to_str() == train_bpe(normalizer.normalize_str(text), 400, normalizer).to_str()

    # a corpus larger than the sample: trained on ~sample_bytes spread over it, never more
    seen = []
    real = lmdm.tokmod.train_bpe_from_texts
    monkeypatch.setattr(lmdm.tokmod, "train_bpe_from_texts",
                        lambda texts, *a: real([seen.append(t) or t for t in texts], *a))
    sampled = lmdm.corpus_tokenizer(src, 400, tmp_path / "sampled", norm, sample_bytes=8 * CHUNK)
    n = sum(len(t.encode()) for t in seen)
    assert 4 * CHUNK < n <= 8 * CHUNK and len(seen) == 8 and sampled.vocab_size <= 400
    assert seen[-1] in normalizer.normalize_str(text) and seen[0] != seen[1]  # normalized pieces, spread


def test_empty_and_not_utf8_files_fail_in_one_line(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("\n  \n")
    (d / "b.txt").write_text(" ")
    with pytest.raises(DataError, match=r"^text files are empty: .*a\.txt, .*b\.txt$"):
        lmdm.tokenize_corpus(lmdm.text_sources("text_file", str(d)), 300, tmp_path / "c")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\n" * 500 + b"caf\xe9\n")
    with pytest.raises(DataError, match=r"not valid UTF-8: .*bad\.txt:501 \(byte 0xe9 at byte offset 5003"):
        build_shards([TextSource.from_file(bad)], train_bpe("fine line\n", 300), tmp_path / "s", chunk_bytes=256)


def test_token_stream_reads_across_shards_and_pickles_without_data(tmp_path):
    import pickle

    ids = np.arange(50, dtype=np.uint16)
    for k, (a, b) in enumerate([(0, 7), (7, 30), (30, 50)]):
        ids[a:b].tofile(tmp_path / f"s{k}")
    ts = TokenStream([tmp_path / f"s{k}" for k in range(3)], [7, 23, 20], "uint16")
    assert ts[5:33].tolist() == list(range(5, 33)) and ts[-1] == 49 and len(ts) == 50
    v = ts.view(6, 40)
    assert len(v) == 34 and v[0:3].tolist() == [6, 7, 8] and v[33] == 39
    assert np.asarray(v).tolist() == list(range(6, 40))
    assert len(pickle.dumps(v)) < 1000  # paths and counts, not the 50 ids (nor a corpus)
    assert pickle.loads(pickle.dumps(v))[1:4].tolist() == [7, 8, 9]


@pytest.mark.parametrize("n", [7, 8, 13])
def test_strided_sampler_is_distributed_samplers_order(n):
    for world in (2, 3):
        for drop_last in (False, True):
            for rank in range(world):
                kw = dict(num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
                assert list(StridedSampler(range(n), **kw)) == list(DistributedSampler(range(n), **kw))


def test_train_py_on_a_folder_trains_from_its_shards(tmp_path, cache_dir):
    """``python train.py model=causal_lm data=text_file data.path=<folder> debug=fast``, composed as train.py does."""
    from helpers import compose_train

    from attnlab.cli.train import run

    d = tmp_path / "books"
    d.mkdir()
    for k in range(3):
        (d / f"part{k}.txt").write_text(pydoc_text()[k * 20_000 : (k + 1) * 20_000])
    cfg = compose_train(["model=causal_lm", "data=text_file", f"data.path={d}", "debug=fast", "logger=csv",
                         "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "test=false",
                         "callbacks.attention_maps=null", "trainer.max_steps=3"], tmp_path / "run", cache_dir)
    metrics = run(cfg)
    assert np.isfinite(metrics["train/loss"])
    manifests = [read_manifest(p) for p in (Path(cache_dir) / "tokens").iterdir()]
    (m,) = [m for m in manifests if m and [s.get("path") for s in m["sources"]] == [str(p) for p in sorted(d.iterdir())]]
    assert m["complete"] and m["tokens"] > 10_000


def test_a_glob_does_not_follow_symlinked_folders_and_reads_a_file_once(tmp_path):
    """`data.path='/data/**/*.txt'` with a link to a parent folder inside: glob.glob followed it 40 levels deep
    (2 links: 2^40 paths, never returned, memory without bound); now each file is listed once."""
    d = tmp_path / "books"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("a\n")
    (d / "sub" / "b.txt").write_text("b\n")
    (d / ".hidden.txt").write_text("h\n")
    (d / "sub" / "up").symlink_to("..")
    (d / "sub" / "self").symlink_to(".")
    (d / "also_a.txt").symlink_to("a.txt")
    assert resolve_files(f"{d}/**/*.txt") == [d / "a.txt", d / "sub" / "b.txt"]
    assert resolve_files(f"{d}/**") == [d / "a.txt", d / "sub" / "b.txt"]  # glob.glob's ** matched files too
    assert resolve_files(d) == resolve_files(f"{d}/**/*.txt")  # a folder: links to folders were never followed
    assert resolve_files(f"{d}/.h*") == [d / ".hidden.txt"]  # a pattern that names hidden files gets them


@pytest.mark.parametrize("manifest", ["[]", '"x"', '{"complete": true}',
                                      '{"complete": true, "dtype": "uint16", "shards": [{"file": "shard-00000.bin"}]}'])
def test_a_manifest_of_the_wrong_shape_is_rebuilt(tmp_path, manifest):
    """Valid JSON that is not a manifest (a crash in another tool, an edit by hand) is treated like a missing one,
    not a traceback (AttributeError, KeyError): the shards are built again, the same tokens."""
    p = tmp_path / "t.txt"
    p.write_text(sample_text(3_000))
    sources = [TextSource.from_file(p)]
    tok, stream = lmdm.tokenize_corpus(sources, 300, tmp_path / "cache")
    (out,) = (tmp_path / "cache" / "tokens").iterdir()
    (out / shards.MANIFEST).write_text(manifest)
    again = lmdm.tokenize_corpus(sources, 300, tmp_path / "cache")[1]
    assert np.array_equal(np.asarray(again), np.asarray(stream)) and read_manifest(out)["complete"]


@pytest.mark.parametrize("kind", folder_tokenizers.KINDS)
def test_a_model_folders_tokenizer_streams_each_file_as_it_encodes_the_whole_file(kind, text_file, tmp_path):
    """A GPT-2's, LLaMA's or BERT's tokenizer (init_from=<folder>): a file cut in chunks gives the ids of encoding
    it whole, so its prepended ``▁`` and its ``<s>`` (BERT's ``[CLS]`` and ``[SEP]``) come once, at the file's ends,
    and files are separated by the tokenizer's own end token."""
    from attnlab.data.tokenizer import BPETokenizer

    text = text_file.read_bytes().decode("utf-8-sig")
    tok = BPETokenizer(folder_tokenizers.folder_tokenizer(kind, [text]))
    src = [TextSource.from_file(text_file)]
    build_shards(src, tok, tmp_path / "one", chunk_bytes=CHUNK, shard_tokens=5000)
    assert stream(tmp_path / "one").tolist() == tok.encode(text)
    assert tok.encode(text)[0] == (tok.bos_id if kind != "gpt2" else tok.encode(text[:1])[0])

    files = [tmp_path / f"{i}.txt" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(text[i * 5000:(i + 1) * 5000 - 1].encode("utf-8"))
    build_shards([TextSource.from_file(f) for f in files], tok, tmp_path / "many", chunk_bytes=512)
    parts = [tok.encode(f.read_bytes().decode("utf-8")) for f in files]
    between = [] if parts[0][-1] == tok.eos_id else [tok.eos_id]  # (BERT's [SEP] already ends each text)
    assert stream(tmp_path / "many").tolist() == parts[0] + between + parts[1] + between + parts[2]


def test_shards_of_a_framing_tokenizer_are_not_those_an_earlier_writer_framed_per_chunk(text_file, tmp_path):
    """The cache key as before for attnlab's own tokenizers (their shards are kept); a new one for a model folder's
    tokenizer that frames a text, whose shards an earlier writer framed at every chunk."""
    import hashlib

    from attnlab.data.text_sources import fingerprint
    from attnlab.data.tokenizer import BPETokenizer

    src = [TextSource.from_file(text_file)]
    text = text_file.read_bytes().decode("utf-8-sig")

    def earlier_key(tok) -> str:  # shards_dir as it was
        h = hashlib.sha256(f"{shards.FORMAT_VERSION}\n{shards.CHUNK_BYTES}\n{shards.SHARD_TOKENS}\n"
                           f"{fingerprint(src)}\n".encode())
        h.update(tok.to_str().encode("utf-8"))
        return h.hexdigest()[:16]

    own = train_bpe(text, 300, TextNormalization.from_config(NORMALIZATIONS["collapse-lower-remove"]).normalizer(
        [text]))
    gpt2, llama, bert = (BPETokenizer(folder_tokenizers.folder_tokenizer(k, [text])) for k in ("gpt2", "llama", "bert"))
    for tok, kept in ((own, True), (gpt2, True), (llama, False), (bert, False)):
        assert (shards.shards_dir(src, tok, tmp_path).name == earlier_key(tok)) is kept
