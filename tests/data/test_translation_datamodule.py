"""TranslationDataModule: joint tokenizer, batch layout (masks, <bos>/<eos>), batching plans, copy split, TSV source."""

import logging

import lightning as L
import numpy as np
import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from attnlab.data.numbers import HELD_OUT_NAMES
from attnlab.data.translation_datamodule import BatchDataset, TranslationDataModule, collate, encode_sources
from attnlab.tasks.translation import decode_text

B = 16
SMALL = dict(train_size=600, val_size=80, test_size=80, copy_names=True, copy_test_size=40, batch_size=B,
             vocab_size=1024, seq_len=64, seed=0)  # fmt: skip


def make_dm(cache_dir, **kw):
    dm = TranslationDataModule(cache_dir=str(cache_dir), **{**SMALL, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def dm(cache_dir):
    return make_dm(cache_dir)


def check_batch(batch, dm):
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    n, S = src.shape
    T = tgt_in.shape[1]
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == batch["bucket"].dtype == torch.long
    assert batch["src_mask"].shape == (n, S) and batch["src_mask"].dtype == torch.bool
    assert tgt_out.shape == batch["tgt_mask"].shape == (n, T) and batch["tgt_mask"].dtype == torch.bool
    assert batch["bucket"].shape == (n,) and len(batch["src_text"]) == len(batch["tgt_text"]) == n
    # masks are True exactly at non-pad tokens; padding is on the right and dynamic (the longest row is unpadded)
    assert torch.equal(batch["src_mask"], src != dm.pad_id) and batch["src_mask"][:, -1].any()
    assert torch.equal(batch["tgt_mask"], tgt_out != dm.pad_id) and batch["tgt_mask"][:, -1].any()
    assert torch.equal(batch["tgt_mask"], tgt_in != dm.pad_id)
    lengths = batch["tgt_mask"].sum(1)
    assert torch.equal(batch["tgt_mask"], torch.arange(T) < lengths[:, None])
    rows = torch.arange(n)
    assert (tgt_in[:, 0] == dm.bos_id).all() and (tgt_out[rows, lengths - 1] == dm.eos_id).all()
    assert (src[rows, batch["src_mask"].sum(1) - 1] == dm.eos_id).all()  # src_eos
    assert torch.equal(tgt_in[:, 1:][batch["tgt_mask"][:, 1:]], tgt_out[:, :-1][batch["tgt_mask"][:, 1:]])
    specials = {dm.pad_id, dm.bos_id, dm.eos_id, 3}
    assert not set(tgt_out[batch["tgt_mask"]].tolist()) - set(range(len(specials), dm.vocab_size)) - {dm.eos_id}
    assert not set(tgt_in[:, 1:][batch["tgt_mask"][:, 1:]].tolist()) & specials
    assert [decode_text(dm.tokenizer, t) for t in tgt_out] == batch["tgt_text"]  # stops at <eos>, strips specials
    assert [decode_text(dm.tokenizer, s) for s in src] == batch["src_text"]
    assert S <= dm.max_src_len and T <= dm.max_tgt_len


def test_attributes(dm):
    assert dm.vocab_size == dm.src_vocab_size == dm.tgt_vocab_size == dm.tokenizer.vocab_size <= 1024
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 1, 2)
    assert dm.bucket_names == ["1-3", "4-6", "7-9", "10+"]
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 660, "val": 88, "test": 80, "copy_test": 40}
    assert 10 < dm.max_src_len <= 64 and 10 < dm.max_tgt_len <= 64
    assert dm.cache_path.parent.name == "numbers"


def test_tokenizer_roundtrip_on_every_text(dm):
    for pairs in dm.splits.values():
        for texts in ([p.tgt for p in pairs], [p.src for p in pairs]):
            ids = dm.tokenizer.encode_batch(texts)
            assert [dm.tokenizer.decode(i) for i in ids] == texts
            assert all(i > 3 for row in ids for i in row)  # never <unk> or another special
    # word-level in effect for the closed number vocabulary: one token per French word or hyphen
    ids = dm.tokenizer.encode("quatre-vingt-dix-sept mille")
    assert [dm.tokenizer.id_to_token(i) for i in ids] == ["quatre", "-", "vingt", "-", "dix", "-", "sept", "▁mille"]


def test_batches_have_documented_layout(dm):
    test, copy_test = dm.test_dataloader()  # with copy_names, testing covers the copy split too
    assert len(copy_test.dataset.dataset) == len(dm.copy_test_dataset)
    for loader in (dm.train_dataloader(), dm.val_dataloader(), test, copy_test):
        batches = list(loader)
        assert sum(len(b["src"]) for b in batches) == len(loader.dataset.dataset)
        for batch in batches[:3] + batches[-1:]:
            check_batch(batch, dm)


def test_train_plan_per_epoch(dm):
    ds = dm.train_dataloader().dataset
    assert isinstance(ds, BatchDataset) and len(ds) == -(-660 // B)
    p0, p1 = ds.plan(0), ds.plan(1)
    for plan in (p0, p1):
        assert sorted(np.concatenate(plan).tolist()) == list(range(660))  # every example once
    assert [b.tolist() for b in p0] != [b.tolist() for b in p1]
    again = dm.train_dataloader().dataset
    assert [b.tolist() for b in again.plan(1)] == [b.tolist() for b in p1]  # function of (seed, epoch)


def test_sorting_by_length_reduces_padding(dm, cache_dir):
    def pad_fraction(module):
        batches = list(module.train_dataloader())
        return sum(int((~b["src_mask"]).sum()) for b in batches) / sum(b["src_mask"].numel() for b in batches)

    unsorted = make_dm(cache_dir, sort_by_length=False)
    assert pad_fraction(dm) < 0.5 * pad_fraction(unsorted)
    val = [t for b in unsorted.val_dataloader() for t in b["src_text"]]
    assert val == [p.src for p in unsorted.splits["val"]]  # unsorted eval keeps split order


def test_example_pair_and_decode_text(dm):
    ex = dm.example_pair()
    assert ex["src"].shape[0] == 1 and ex["tgt_in"].shape[0] == 1
    assert ex["src_text"][0] == dm.example_pair()["src_text"][0]
    assert ex["src_text"][0] in {p.src for p in dm.splits["val"]}
    ids = dm.tokenizer.encode("vingt et un")
    assert decode_text(dm.tokenizer, [dm.bos_id, *ids, dm.eos_id, *ids, dm.pad_id]) == "vingt et un"
    assert [decode_text(dm.tokenizer, r) for r in torch.tensor([[*ids, dm.eos_id], [dm.eos_id, *ids]])] == \
        ["vingt et un", ""]
    src, src_mask = encode_sources(dm.tokenizer, ["twenty-one", "eighty"], dm.hparams.src_eos)
    assert src.shape == src_mask.shape and src_mask.sum(1).tolist() == [4, 2]


def test_copy_test_names_are_unseen(dm):
    train_text = " ".join(f"{p.src} {p.tgt}" for s in ("train", "val") for p in dm.splits[s])
    assert not any(name in train_text for name in HELD_OUT_NAMES)
    assert all(p.name in HELD_OUT_NAMES for p in dm.splits["copy_test"])
    names = {n for b in dm.copy_test_dataloader() for t in b["tgt_text"] for n in HELD_OUT_NAMES if n in t}
    assert len(names) > 5


def test_without_copy_names_there_is_no_copy_split(cache_dir):
    dm = make_dm(cache_dir, copy_names=False)
    assert "copy_test" not in dm.datasets and all(p.name is None for p in dm.splits["train"])
    with pytest.raises(RuntimeError, match="copy_names=true"):
        dm.copy_test_dataloader()
    with pytest.raises(RuntimeError, match="setup"):
        TranslationDataModule().train_dataloader()


def test_numbers_longer_than_seq_len_are_an_error(cache_dir):
    with pytest.raises(ValueError, match="longer than seq_len=8 tokens .*use a larger seq_len"):
        make_dm(cache_dir, seq_len=8, copy_names=False)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown data source 'wmt'; valid sources: numbers, tsv"):
        TranslationDataModule(source="wmt")
    with pytest.raises(ValueError, match="source='tsv' needs path"):
        TranslationDataModule(source="tsv")
    with pytest.raises(ValueError, match="copy_names applies to source='numbers' only"):
        TranslationDataModule(source="tsv", path="x.tsv", copy_names=True)
    with pytest.raises(ValueError, match="bucket_edges"):
        TranslationDataModule(bucket_edges=[3, 3])


# ---------------------------------------------------------------------------------------------- tsv
WORDS = "the a cat dog sees likes big small red house garden old".split()
MOTS = "le un chat chien voit aime grand petit rouge maison jardin vieux".split()


def write_corpus(path, n, seed=0, long_every=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        k = rng.integers(2, 9) if not (long_every and i % long_every == 0) else 40
        idx = rng.integers(0, len(WORDS), k)
        lines.append(" ".join(WORDS[j] for j in idx) + "\t" + " ".join(MOTS[j] for j in idx) + "\tCC-BY 2.0")
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


def test_tsv_source(tmp_path, cache_dir):
    p = write_corpus(tmp_path / "en-fr.tsv", 400)
    dm = TranslationDataModule(source="tsv", path=str(p), vocab_size=300, batch_size=8, cache_dir=str(cache_dir),
                               val_fraction=0.1, test_fraction=0.1)  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    srcs = {k: {q.src for q in v} for k, v in dm.splits.items()}
    assert set(srcs) == {"train", "val", "test"}
    assert not srcs["train"] & srcs["val"] and not srcs["train"] & srcs["test"]
    assert sum(len(v) for v in dm.splits.values()) == 400 and dm.vocab_size <= 300
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        check_batch(next(iter(loader)), dm)
    for q in dm.splits["test"]:
        assert dm.tokenizer.decode(dm.tokenizer.encode(q.tgt)) == q.tgt


def test_tsv_val_and_test_files_and_long_pairs_dropped(tmp_path, cache_dir, caplog):
    train = write_corpus(tmp_path / "train.tsv", 200, long_every=50)
    val = write_corpus(tmp_path / "val.tsv", 20, seed=1)
    test = write_corpus(tmp_path / "test.tsv", 30, seed=2)
    with caplog.at_level(logging.WARNING):
        dm = TranslationDataModule(source="tsv", path=str(train), val_path=str(val), test_path=str(test),
                                   vocab_size=300, seq_len=32, batch_size=8, cache_dir=str(cache_dir))  # fmt: skip
        dm.setup("fit")
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [196, 20, 30]
    assert any("4 of 200 train pairs are longer than seq_len=32" in r.getMessage() for r in caplog.records)
    assert dm.max_src_len <= 32 and dm.max_tgt_len <= 32


def test_tsv_bad_file_fails_in_prepare_data(tmp_path, cache_dir):
    p = tmp_path / "bad.tsv"
    p.write_text("Hi.\tSalut.\nBye.\n", encoding="utf-8")
    dm = TranslationDataModule(source="tsv", path=str(p), cache_dir=str(cache_dir))
    with pytest.raises(ValueError, match=rf"^{p}:2: no tab between source and target"):
        dm.prepare_data()


# ---------------------------------------------------------------------------------------------- configs, Trainer
@pytest.mark.parametrize("override", ["data=numbers", "data=tsv"])
def test_configs_instantiate(override, tmp_path, cache_dir):
    extra = [f"data.path={write_corpus(tmp_path / 'c.tsv', 100)}", "data.vocab_size=300"] if "tsv" in override else [
        "data.train_size=100", "data.val_size=20", "data.test_size=20"]  # fmt: skip
    cfg = compose_train([override, *extra], tmp_path / "out", cache_dir=str(cache_dir))
    dm = instantiate(cfg.data)
    assert isinstance(dm, TranslationDataModule) and dm.hparams.seed == cfg.seed
    dm.prepare_data()
    dm.setup("fit")
    check_batch(next(iter(dm.val_dataloader())), dm)


def test_trainer_epochs_reach_persistent_workers(cache_dir):
    """Lightning calls set_epoch on the sampler; the worker's batch plan must follow the epoch."""

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen = {}

        def training_step(self, batch, i):
            self.seen.setdefault(self.current_epoch, []).append(batch["src_text"])
            check_batch(batch, dm)
            return self.w.sum()

        def validation_step(self, batch, i):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = TranslationDataModule(cache_dir=str(cache_dir), **{**SMALL, "copy_names": False, "batch_size": 64,
                                                            "num_workers": 1})  # fmt: skip
    model = Recorder()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=3, limit_val_batches=1,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    ds = dm.train_dataloader().dataset
    for epoch in (0, 1):
        want = [[dm.train_dataset.pairs[int(j)].src for j in b] for b in ds.plan(epoch)[:3]]
        assert model.seen[epoch] == want
    assert isinstance(collate([dm.train_dataset[0]]), dict)


def test_overfit_batches_sees_the_same_batches_every_epoch(cache_dir):
    seen = {}

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            seen.setdefault(self.current_epoch, []).append(batch["src_text"])
            return self.w.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = TranslationDataModule(cache_dir=str(cache_dir), **{**SMALL, "copy_names": False})
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, overfit_batches=2, limit_val_batches=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(Recorder(), datamodule=dm)
    assert len(seen[0]) == 2 and seen[0] == seen[1] == seen[2]
