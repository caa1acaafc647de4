"""LMDataModule: cached tokens, window shapes/shift, split hygiene, deterministic offsets (streaming and shards:\ntest_shards.py)."""

import lightning as L
import numpy as np
import pytest
import torch

import attnlab.data.lm_datamodule as lmdm
import attnlab.data.tokenizer as tokmod
from attnlab.data.corpus import pydoc_text
from attnlab.data.lm_datamodule import LMDataModule

T, B, VOCAB = 32, 8, 512


def make_dm(cache_dir, **kw):
    args = dict(vocab_size=VOCAB, seq_len=T, batch_size=B, cache_dir=str(cache_dir))
    args.update(kw)
    dm = LMDataModule(**args)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def dm(cache_dir):
    return make_dm(cache_dir)


def offsets(ds, epoch):
    ds.set_epoch(epoch)
    return [ds.offset(i) for i in range(len(ds))]


def test_attributes_after_setup(dm):
    assert dm.hparams.source == "pydoc" and dm.hparams.vocab_size == VOCAB
    assert dm.vocab_size == dm.tokenizer.vocab_size <= VOCAB
    n_train = len(dm.train_dataset.tokens)
    assert len(dm.train_dataset) == n_train // T  # default epoch length
    assert len(dm.val_dataset) > 0 and len(dm.test_dataset) > 0


def test_batches_have_shapes_and_shifted_labels(dm):
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        batch = next(iter(loader))
        x, y = batch["input_ids"], batch["labels"]
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert 0 <= int(x.min()) and int(x.max()) < dm.vocab_size


def test_train_items_are_slices_of_the_train_split(dm):
    ds = dm.train_dataset
    tokens = torch.from_numpy(np.asarray(ds.tokens, dtype=np.int64))
    ds.set_epoch(0)
    for i in range(0, len(ds), 97):
        o, item = ds.offset(i), ds[i]
        assert torch.equal(item["input_ids"], tokens[o : o + T])
        assert torch.equal(item["labels"], tokens[o + 1 : o + T + 1])


def test_splits_are_contiguous_and_val_is_outside_train(dm):
    n_train, n_val = len(dm.train_dataset.tokens), len(dm.val_dataset.tokens)
    n = n_train + n_val + len(dm.test_dataset.tokens)
    assert abs(n_val / n - 0.05) < 1e-3
    # every train window (labels included) ends inside the train split
    for epoch in (0, 1):
        assert max(offsets(dm.train_dataset, epoch)) + T + 1 <= n_train
    # val windows are consecutive, non-overlapping slices of the val split, in order
    val = torch.from_numpy(np.asarray(dm.val_dataset.tokens, dtype=np.int64))
    assert len(dm.val_dataset) == (n_val - 1) // T
    for j in (0, 1, len(dm.val_dataset) - 1):
        assert torch.equal(dm.val_dataset[j]["input_ids"], val[j * T : (j + 1) * T])
    # the three splits tile the cached token array
    full = np.concatenate([dm.train_dataset.tokens, dm.val_dataset.tokens, dm.test_dataset.tokens])
    assert np.array_equal(full, dm.tokenizer.encode(pydoc_text()))


def test_val_loader_is_deterministic(dm):
    a = torch.cat([b["input_ids"] for b in dm.val_dataloader()])
    b = torch.cat([b["input_ids"] for b in dm.val_dataloader()])
    assert torch.equal(a, b) and len(a) == len(dm.val_dataset)  # no drop_last


def test_train_offsets_depend_on_seed_and_epoch_only(dm, cache_dir):
    other = make_dm(cache_dir)  # same seed, fresh object
    e0, e1 = offsets(dm.train_dataset, 0), offsets(dm.train_dataset, 1)
    assert offsets(other.train_dataset, 0) == e0 and offsets(other.train_dataset, 1) == e1
    assert e0 != e1
    assert offsets(make_dm(cache_dir, seed=1).train_dataset, 0) != e0
    assert len(set(e0)) > 0.9 * len(e0)  # spread, not a handful of repeated offsets


def test_loader_passes_sampler_epoch_to_dataset(dm):
    loader = dm.train_dataloader()
    for epoch in (0, 3):
        loader.sampler.set_epoch(epoch)  # what Lightning does at every epoch start
        got = next(iter(loader))["input_ids"]
        dm.train_dataset.set_epoch(epoch)
        want = torch.stack([dm.train_dataset[i]["input_ids"] for i in range(B)])
        assert torch.equal(got, want)


def test_epochs_reach_persistent_workers_under_trainer(cache_dir):
    """Lightning calls set_epoch only on samplers; the windows must still change per epoch."""

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen = {}

        def training_step(self, batch, i):
            self.seen.setdefault(self.current_epoch, []).append(batch["input_ids"])
            return self.w.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = LMDataModule(
        vocab_size=VOCAB, seq_len=T, batch_size=4, cache_dir=str(cache_dir),
        num_workers=1, train_windows_per_epoch=8,
    )
    model = Recorder()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    ds = dm.train_dataset
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        want = torch.stack([ds[i]["input_ids"] for i in range(8)])
        assert torch.equal(torch.cat(model.seen[epoch]), want)


def test_second_setup_reads_the_cache(dm, cache_dir, monkeypatch):
    (shard_dir,) = (cache_dir / "tokens").iterdir()
    files = sorted(shard_dir.iterdir()) + sorted((cache_dir / "tokenizers").iterdir())
    assert [p.name for p in files[:2]] == ["manifest.json", "shard-00000.bin"]  # no temp files left behind
    assert [p.suffix for p in files[2:]] == [".json", ".sha256"]  # the tokenizer and its record
    mtimes = [p.stat().st_mtime_ns for p in files]
    monkeypatch.setattr(tokmod, "train_bpe_from_texts", lambda *a: pytest.fail("retrained"))
    monkeypatch.setattr(lmdm, "build_shards", lambda *a, **k: pytest.fail("tokenized again"))
    again = make_dm(cache_dir)
    assert np.array_equal(again.val_dataset.tokens, dm.val_dataset.tokens)
    assert [p.stat().st_mtime_ns for p in files] == mtimes


def test_example_text_and_decode(dm):
    ids = dm.example_text(20)
    assert ids.shape == (1, 20) and ids.dtype == torch.long
    assert torch.equal(ids[0], dm.val_dataset[0]["input_ids"][:20])
    assert torch.equal(dm.example_text(20), ids)
    text = dm.decode(ids[0])
    assert isinstance(text, str) and dm.tokenizer.encode(text) == ids[0].tolist()


def test_text_file_source(tmp_path):
    p = tmp_path / "story.txt"
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "ζήτα", "🤖"]
    rng = np.random.default_rng(0)
    p.write_text(" ".join(rng.choice(words, 4000)) + "\n", encoding="utf-8")
    dm = make_dm(
        tmp_path / "c", source="text_file", path=str(p), vocab_size=300, seq_len=16,
        batch_size=4, val_fraction=0.1, test_fraction=0.1,
    )
    assert dm.vocab_size <= 300
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 16)
    assert dm.decode(dm.example_text(30)[0]) in p.read_text(encoding="utf-8")


def test_bad_arguments_raise_one_line_errors(tmp_path):
    valid = r"unknown data source 'wiki'; valid sources: pydoc, text_file"
    with pytest.raises(ValueError, match=valid):
        LMDataModule(source="wiki")
    with pytest.raises(ValueError, match="source='text_file' needs path"):
        LMDataModule(source="text_file")
    with pytest.raises(ValueError, match="val_fraction"):
        LMDataModule(val_fraction=0.6, test_fraction=0.5)
    missing = tmp_path / "missing.txt"
    dm = LMDataModule(source="text_file", path=str(missing), cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"^text file not found: {missing}$"):
        dm.prepare_data()
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(ValueError, match=r"not valid UTF-8: .*bad\.txt:2 .*byte offset 3, line 2"):
        LMDataModule(source="text_file", path=str(bad), cache_dir=str(tmp_path)).prepare_data()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="text file is empty: .*empty.txt"):
        LMDataModule(source="text_file", path=str(empty), cache_dir=str(tmp_path)).prepare_data()


def test_too_little_text_for_seq_len(tmp_path):
    p = tmp_path / "tiny.txt"
    p.write_text("a short text. " * 20)
    dm = LMDataModule(
        source="text_file", path=str(p), vocab_size=300, seq_len=64, batch_size=2,
        cache_dir=str(tmp_path),
    )
    dm.prepare_data()
    with pytest.raises(ValueError, match="split has .* tokens, fewer than seq_len"):
        dm.setup("fit")


def test_loaders_need_setup():
    with pytest.raises(RuntimeError, match="setup"):
        LMDataModule().train_dataloader()
