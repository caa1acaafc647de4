"""data=hf: Hugging Face `datasets` read from files the test writes (parquet, jsonl, a saved DatasetDict); a hub name
offline fails in one line naming the caches. The library and its readers are real; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import pytest
import torch
from helpers import compose_train, run_cli

from attnlab.core.errors import ConfigError, DataError, DataFileNotFoundError
from attnlab.data.hf_source import hf_pairs, iter_text, load_hf
from attnlab.data.lm_datamodule import LMDataModule
from attnlab.data.translation_datamodule import TranslationDataModule
from attnlab.runs.validate import validate_config

datasets = pytest.importorskip("datasets")

EN = ["one", "two", "three", "four hundred", "five", "six thousand and six", "seven", "eight", "nine", "ten"]
FR = ["un", "deux", "trois", "quatre cents", "cinq", "six mille six", "sept", "huit", "neuf", "dix"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    rows = [{"translation": {"en": e, "fr": f}, "text": f"{e} = {f}"} for e, f in zip(EN, FR)]
    datasets.Dataset.from_list(rows).to_parquet(str(d / "pairs.parquet"))
    (d / "pairs.jsonl").write_text("".join(json.dumps({"en": e, "fr": f}) + "\n" for e, f in zip(EN, FR)))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:6]),
                          "validation": datasets.Dataset.from_list(rows[6:8]),
                          "test": datasets.Dataset.from_list(rows[8:])}).save_to_disk(str(d / "saved"))
    (d / "pairs.txt").write_text("not a format datasets reads by suffix\n")
    return d


def test_a_translation_column_and_two_columns_give_the_same_pairs(files, tmp_path):
    (parquet,) = load_hf(str(files / "pairs.parquet"), cache_dir=str(tmp_path)).values()
    (jsonl,) = load_hf(str(files / "pairs.jsonl"), cache_dir=str(tmp_path)).values()
    a = hf_pairs(parquet, src_lang="en", tgt_lang="fr")
    b = hf_pairs(jsonl, src_column="en", tgt_column="fr")
    assert [(p.src, p.tgt, p.line) for p in a] == [(p.src, p.tgt, p.line) for p in b] == \
        [(e, f, i) for i, (e, f) in enumerate(zip(EN, FR), start=1)]
    assert a[3].bucket == 0 and a[5].bucket == 1  # "four hundred": 2 words; "six thousand and six": 4 words
    assert list(iter_text(parquet, batch_size=3)) == [f"{e} = {f}" for e, f in zip(EN, FR)]


def test_a_saved_dataset_dict_keeps_its_splits(files, tmp_path):
    dm = TranslationDataModule(source="hf", path=str(files / "saved"), vocab_size=300, seq_len=16, batch_size=2,
                               hf={"src_lang": "en", "tgt_lang": "fr"}, cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    assert {k: [p.src for p in v] for k, v in dm.splits.items()} == {"train": EN[:6], "val": EN[6:8],
                                                                     "test": EN[8:]}
    assert dm.hparams.hf["src_lang"] == "en" and isinstance(dm.hparams.hf, dict)  # plain, for safe checkpoints


def test_one_file_is_split_by_seed_into_train_val_test(files, tmp_path):
    dm = TranslationDataModule(source="hf", path=str(files / "pairs.jsonl"), vocab_size=300, seq_len=16,
                               val_fraction=0.2, test_fraction=0.2, hf={"src_column": "en", "tgt_column": "fr",
                                                                        "datasets_cache": str(tmp_path / "c")},
                               cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    sizes = {k: len(v) for k, v in dm.splits.items()}
    assert sizes == {"train": 6, "val": 2, "test": 2}
    assert sorted(p.src for v in dm.splits.values() for p in v) == sorted(EN)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"path": "{d}/missing.parquet"}, DataFileNotFoundError, "data.path does not exist"),
    ({"path": "{d}/nowhere/"}, DataFileNotFoundError, "does not exist"),
    ({"path": "{d}/pairs.txt"}, DataError, "cannot read .txt files"),
    ({"path": "{d}/pairs.jsonl", "src_column": "english", "tgt_column": "fr"}, DataError,
     "has no column 'english' for the source (data.hf.src_column); its columns: en, fr"),
    ({"path": "{d}/pairs.parquet"}, ConfigError, "give data.hf.src_lang and data.hf.tgt_lang (column 'translation' "
                                                 "has languages ['en', 'fr'])"),
    ({"path": "{d}/pairs.parquet", "src_lang": "en", "tgt_lang": "de"}, DataError, "not 'en' and 'de'"),
    ({"path": "{d}/pairs.jsonl"}, ConfigError, "give data.hf.src_column and data.hf.tgt_column, or"),
])
def test_bad_input_is_one_line(files, tmp_path, kwargs, error, message):
    path = kwargs.pop("path").format(d=files)
    with pytest.raises(error) as info:
        for split, d in load_hf(path, cache_dir=str(tmp_path)).items():
            hf_pairs(d, **kwargs, where=path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_empty_sentence_names_the_row(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"en": "one", "fr": "un"}\n{"en": "two", "fr": "  "}\n')
    (d,) = load_hf(str(tmp_path / "p.jsonl"), cache_dir=str(tmp_path / "c")).values()
    with pytest.raises(DataError, match=r"p.jsonl row 2: empty target sentence"):
        hf_pairs(d, src_column="en", tgt_column="fr", where=str(tmp_path / "p.jsonl"))


def test_a_model_given_data_it_cannot_read_is_one_line(tmp_path):
    """model=vit data=hf: the model's config reads data.image_size, which text data lacks (train.py prints this
    ConfigError alone and exits 2, as tests/test_bad_inputs.py checks for the other config errors)."""
    cfg = compose_train(["model=vit", "data=hf", "data.path=x"], tmp_path / "run")
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert str(info.value) == ("model.net.image_size reads ${data.image_size}, which data=hf does not have: model=vit "
                               "needs a data option made for it (leave `data` out to get the model's own)")


@pytest.mark.slow  # the suite's 10-minute budget: the in-process tests above read every format
def test_train_py_reads_a_jsonl_and_a_hub_name_offline_fails_in_one_line(files, tmp_path, cache_dir):
    """Through the entry point: a real (tiny) training run on data=hf, and the offline hub error."""
    common = ["model=transformer_mt", "data=hf", "debug=fast", "logger=none", "callbacks=none", "trainer=cpu",
              "test=false", f"data.hf.datasets_cache={tmp_path / 'hf_cache'}"]
    ok = run_cli([*common, f"data.path={files / 'pairs.jsonl'}", "data.hf.src_column=en", "data.hf.tgt_column=fr",
                  "data.val_fraction=0.2", "data.test_fraction=0.2", "data.vocab_size=300",
                  f"hydra.run.dir={tmp_path / 'run'}"], cache_dir=cache_dir)
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "val/loss = " in ok.stdout and "Traceback" not in ok.stdout  # trained, validated on the carved split
    hub = run_cli([*common, "data.path=attnlab-tests/no-such-dataset", f"hydra.run.dir={tmp_path / 'hub'}"],
                  cache_dir=cache_dir, env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert hub.returncode == 2, hub.stdout[-3000:]
    lines = [x for x in hub.stdout.splitlines() if "could not load" in x]
    assert len(lines) == 1 and "Traceback" not in hub.stdout, hub.stdout[-3000:]
    assert "could not load 'attnlab-tests/no-such-dataset' from the Hugging Face hub" in lines[0]
    assert f"looked in {tmp_path / 'hf_cache'} and " in lines[0]


def test_the_lm_reads_a_text_column_as_it_reads_the_same_text_file(files, tmp_path):
    """data=hf for the LM: the train split's text column, one row per line, streamed into the same token shards as a
    text file holding those lines (composed through conf/data/hf.yaml: the factory picks the LM's data module)."""
    cfg = compose_train(["model=causal_lm", "data=hf", f"data.path={files / 'pairs.parquet'}", "data.vocab_size=300",
                         "data.seq_len=8", "data.val_fraction=0.2", "data.test_fraction=0.2", "data.batch_size=2", f"data.hf.datasets_cache={tmp_path / 'hf'}"], tmp_path / "run",
                        str(tmp_path / "cache"))
    hf = hydra.utils.instantiate(cfg.data)
    assert isinstance(hf, LMDataModule) and hf.hparams.source == "hf"
    hf.prepare_data()
    hf.setup("fit")
    (tmp_path / "same.txt").write_text("".join(f"{e} = {f}\n" for e, f in zip(EN, FR)), encoding="utf-8")
    plain = LMDataModule(source="text_file", path=str(tmp_path / "same.txt"), vocab_size=300, seq_len=8,
                         val_fraction=0.2, test_fraction=0.2, batch_size=2, seed=hf.hparams.seed,
                         cache_dir=str(tmp_path / "cache2"))
    plain.prepare_data()
    plain.setup("fit")
    assert hf.tokenizer.encode("six mille six") == plain.tokenizer.encode("six mille six")
    for split in ("train_dataset", "val_dataset", "test_dataset"):
        a, b = getattr(hf, split), getattr(plain, split)
        assert len(a) == len(b) and all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(len(a)))
    (exported,) = (tmp_path / "cache").glob("hf_text/*/train.txt")
    assert not list(exported.parent.glob("*.tmp"))  # written whole, then renamed
    with pytest.raises(DataError, match="has no column 'body' for the text"):
        LMDataModule(source="hf", path=str(files / "pairs.parquet"), vocab_size=300, cache_dir=str(tmp_path / "c3"),
                     hf={"text_column": "body", "datasets_cache": str(tmp_path / "hf")}).prepare_data()


def test_rows_of_the_wrong_type_and_unreadable_files_are_one_line(tmp_path, capfd):
    """A null {language: text} row, a number or a list as a sentence: one line naming the row, no AttributeError
    traceback. A text column of nulls only: one line naming the dataset (not "text file is empty" naming the
    cache's export). A parquet file of no rows: one line naming the file and its cause, with
    no ERROR line of datasets' own before it."""
    from attnlab.data.hf_source import text_column_file

    (tmp_path / "null.jsonl").write_text('{"translation": {"en": "one", "fr": "un"}}\n{"translation": null}\n')
    (tmp_path / "int.jsonl").write_text('{"en": "one", "fr": "un"}\n{"en": 2, "fr": "deux"}\n')
    (tmp_path / "list.jsonl").write_text('{"en": ["one"], "fr": "un"}\n')
    for name, kwargs, message in [("null", {"src_lang": "en", "tgt_lang": "fr"}, "row 2: empty source sentence"),
                                  ("int", {"src_column": "en", "tgt_column": "fr"}, "row 2: the source is int, not text"),
                                  ("list", {"src_column": "en", "tgt_column": "fr"}, "row 1: the source is list")]:
        (d,) = load_hf(str(tmp_path / f"{name}.jsonl"), cache_dir=str(tmp_path / "c")).values()
        with pytest.raises(DataError, match=message):
            hf_pairs(d, **kwargs, where=name)
    (tmp_path / "nulls.jsonl").write_text('{"text": null}\n{"text": "  "}\n')
    with pytest.raises(DataError, match=r"nulls.jsonl \[train\]: column 'text' holds no text \(2 rows, all null"):
        text_column_file(str(tmp_path / "nulls.jsonl"), {"datasets_cache": str(tmp_path / "c")}, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("train.txt"))  # nothing kept for the next run to trip on
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")  # an empty split
    capfd.readouterr()
    with pytest.raises(DataError) as info:
        load_hf(str(tmp_path / "empty.parquet"), cache_dir=str(tmp_path / "c"))
    assert f"Failed to read file '{tmp_path / 'empty.parquet'}'" in str(info.value)
    assert "a parquet file with no rows" in str(info.value) and "\n" not in str(info.value)
    assert "Failed to read" not in capfd.readouterr().err
