"""Hugging Face ``datasets`` as a data source (``data=hf``): where users already keep their corpora.

``path`` is, in this order:

* a dataset saved with ``save_to_disk`` (a folder holding ``dataset_dict.json`` or ``state.json``);
* a data file (``.parquet``, ``.json``/``.jsonl``, ``.arrow``, ``.csv``), a glob of them, or a folder of them
  (splits are then inferred from the file names, ``train.parquet`` / ``validation.parquet`` / ``test.parquet``, as
  ``datasets`` does);
* a hub name (``wmt/wmt14``, ``Salesforce/wikitext``) with an optional config ``name``: this needs the network or a
  copy in the Hugging Face cache; offline it fails in one line naming the caches it looked in.

Splits map onto ours: ``train``; ``validation`` / ``valid`` / ``val`` / ``dev`` -> val; ``test``. A dataset with one
split only (one file, or ``split=train[:10%]``) is the train split, and the data module carves val and test from it.

The library is imported lazily (``pip install -e ".[hf]"``; the dev extra has it), so the other sources never pay its
import time. Arrow tables are memory-mapped: iterating a text column (``iter_text``) holds one batch at a time.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..files.atomic import reported
from ..core.errors import ConfigError, DataError, DataFileNotFoundError
from .parallel import DEFAULT_BUCKET_EDGES, Pair, length_bucket

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

# file suffix -> the `datasets` packaged builder that reads it
BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow", ".csv": "csv"}
SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "dev": "val", "test": "test"}
# the data kinds (attnlab.families.DATA_KINDS) a Hugging Face dataset can give, and the data module that reads each:
# named, not imported: train.py's preflight picks the reader's checks without torch (data/hf_datamodule.py imports
# the classes)
HF_DATA_MODULES = {"lm_text": "attnlab.data.lm_datamodule.LMDataModule",
                   "translation": "attnlab.data.translation_datamodule.TranslationDataModule"}
HUB_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
# data.hf options and their defaults (conf/data/hf.yaml documents them)
HF_OPTIONS: dict[str, str | None] = {
    "name": None,  # the dataset's config name (hub datasets with several)
    "split": None,  # e.g. "train[:10%]": that slice alone, as the train split
    "text_column": "text",  # the LM's text
    "src_column": None, "tgt_column": None,  # translation: two columns ...
    "translation_column": "translation", "src_lang": None, "tgt_lang": None,  # ... or one {lang: text} column
    "datasets_cache": None,  # where `datasets` keeps its Arrow copies (None: its own, ~/.cache/huggingface)
}


def hf_options(source: str, path: str | None, hf: dict | None) -> dict | None:
    """A data module's ``hf`` argument checked and completed: every option, plain types (checkpoints load with
    ``weights_only=True``); None for another source. A missing path or an unknown option is a one-line error."""
    unknown = set(hf or {}) - set(HF_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown data.hf option(s) {', '.join(sorted(unknown))}; valid: {', '.join(HF_OPTIONS)}")
    if source != "hf":
        return None
    if not path:
        raise ConfigError("data=hf needs data.path=<a parquet/json/jsonl/arrow/csv file or glob, a saved dataset "
                          "folder, or a hub name>")
    return {**HF_OPTIONS, **{str(k): v for k, v in (hf or {}).items()}}


def _datasets():
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise ConfigError('data=hf needs the `datasets` library: pip install -e ".[hf]"') from e
    datasets.disable_progress_bars()  # one line per split in our log is enough
    return datasets


def _builder(pattern: str) -> str:
    suffix = Path(pattern).suffix.lower()
    if suffix not in BUILDERS:
        raise DataError(f"data=hf cannot read {suffix or 'suffix-less'} files ({pattern}); "
                        f"give one of {', '.join(sorted(BUILDERS))}, a saved dataset folder or a hub name")
    return BUILDERS[suffix]


def _hub_caches(cache_dir: str | None) -> str:
    import datasets.config as dc
    import huggingface_hub.constants as hc

    return f"{cache_dir or dc.HF_DATASETS_CACHE} and {hc.HF_HUB_CACHE}"


def load_hf(path: str, name: str | None = None, split: str | None = None,
            cache_dir: str | None = None) -> dict[str, datasets.Dataset]:
    """``{our split name: Dataset}`` for ``path`` (see the module doc). ``cache_dir``: where ``datasets`` keeps
    its Arrow copies and downloads (None: its own cache, ``~/.cache/huggingface/datasets``)."""
    ds = _datasets()
    p = Path(os.path.expanduser(str(path)))
    said = _DatasetsErrors()
    try:
        with said:
            loaded = _load(ds, p, path, name, split, cache_dir)
    except (DataError, ConfigError):
        raise
    except Exception as e:  # a corrupt or mismatched file: one line naming it and the first cause datasets gives
        why = said.last or _innermost(e)
        if "BatchSize must be greater than 0" in why:  # pyarrow's words for a parquet file of no rows
            why += " (a parquet file with no rows, which datasets cannot read: remove it)"
        raise DataError(f"datasets could not read {path}: {why}") from e
    return _our_splits(ds, loaded, path)


class _DatasetsErrors(logging.Handler):
    """While active, the ERROR lines of `datasets`' own loggers are kept (they name the file that failed, which the
    exception does not) instead of printed: the user gets our one line with it. Other records go where they went."""

    def __init__(self):
        super().__init__()
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            text = record.getMessage().strip()
            self.last = text.splitlines()[0] if text else self.last
            return
        handlers = self._before[1] + (logging.getLogger().handlers if self._before[0] else [])
        for h in handlers:
            if record.levelno >= h.level:
                h.handle(record)

    def __enter__(self):
        self._logger = logging.getLogger("datasets")
        self._before = self._logger.propagate, list(self._logger.handlers)
        self._logger.handlers, self._logger.propagate = [self], False
        return self

    def __exit__(self, *exc):
        self._logger.propagate, self._logger.handlers = self._before[0], self._before[1]


def _innermost(error: BaseException) -> str:
    """``Type: message`` of the deepest cause (``DatasetGenerationError`` says only that something failed)."""
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _load(ds, p: Path, path: str, name: str | None, split: str | None, cache_dir: str | None):
    if True:
        if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "state.json").exists()):
            loaded = ds.load_from_disk(str(p))
            if split is not None:
                loaded = loaded[split] if isinstance(loaded, ds.DatasetDict) else loaded
        elif p.is_dir():
            files = [f for f in p.rglob("*") if f.suffix.lower() in BUILDERS]
            if not files:
                raise DataFileNotFoundError(f"no data files ({', '.join(sorted(BUILDERS))}) and no saved dataset "
                                            f"in folder: {p.resolve()}")
            loaded = ds.load_dataset(_builder(str(files[0])), data_dir=str(p), split=split, cache_dir=cache_dir)
        elif p.is_file() or glob.has_magic(str(path)):
            if not p.is_file() and not glob.glob(os.path.expanduser(str(path))):
                raise DataFileNotFoundError(f"no file matches {path}")
            loaded = ds.load_dataset(_builder(str(path)), data_files=os.path.expanduser(str(path)),
                                     split=split, cache_dir=cache_dir)
        elif HUB_NAME.match(str(path)) and not str(path).startswith((".", "~")):
            try:
                loaded = ds.load_dataset(str(path), name, split=split, cache_dir=cache_dir)
            except (ConnectionError, OSError, ValueError, ds.exceptions.DatasetNotFoundError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise DataError(f"could not load {path!r} from the Hugging Face hub ({first}); without network "
                                f"it must be in the cache: looked in {_hub_caches(cache_dir)}") from e
        else:
            raise DataFileNotFoundError(f"data.path does not exist: {p.resolve()}")
    return loaded


def _our_splits(ds, loaded, path: str) -> dict[str, datasets.Dataset]:
    if isinstance(loaded, ds.Dataset):
        return {"train": loaded}
    out: dict[str, datasets.Dataset] = {}
    for split_name, d in loaded.items():
        ours = SPLIT_NAMES.get(split_name)
        if ours is None or ours in out:
            log.warning(f"data=hf: ignoring split {split_name!r} of {path}")
            continue
        out[ours] = d
    if "train" not in out:
        if len(loaded) != 1:
            raise DataError(f"{path} has no train split (splits: {', '.join(loaded)})")
        out = {"train": next(iter(loaded.values()))}
    return out


def _check_column(d: datasets.Dataset, column: str, what: str, where: str) -> None:
    if column not in d.column_names:
        raise DataError(f"{where} has no column {column!r} for {what}; its columns: {', '.join(d.column_names)}")


def iter_text(d: datasets.Dataset, column: str = "text", where: str = "dataset",
              batch_size: int = 1000) -> Iterator[str]:
    """The strings of a text column, one Arrow batch in memory at a time; None rows are skipped."""
    _check_column(d, column, "the text (data.hf.text_column)", where)
    for batch in d.select_columns([column]).iter(batch_size=batch_size):
        for text in batch[column]:
            if text is not None:
                if not isinstance(text, str):
                    raise DataError(f"{where}: column {column!r} holds {type(text).__name__}, not text")
                yield text


def hf_pairs(d: datasets.Dataset, *, src_column: str | None = None, tgt_column: str | None = None,
             translation_column: str = "translation", src_lang: str | None = None, tgt_lang: str | None = None,
             edges: Sequence[int] = DEFAULT_BUCKET_EDGES, where: str = "dataset") -> list[Pair]:
    """Sentence pairs from two text columns (``src_column``, ``tgt_column``) or from one column of
    ``{language: text}`` dicts (``translation_column`` with ``src_lang``/``tgt_lang``, the WMT / OPUS layout).
    ``Pair.line`` is the 1-based row. An empty side is an error naming the row."""
    if src_column or tgt_column:
        if not (src_column and tgt_column):
            raise ConfigError("give both data.hf.src_column and data.hf.tgt_column")
        _check_column(d, src_column, "the source (data.hf.src_column)", where)
        _check_column(d, tgt_column, "the target (data.hf.tgt_column)", where)
        rows = zip(d[src_column], d[tgt_column])
    elif translation_column in d.column_names:
        if not (src_lang and tgt_lang):
            langs = sorted(d[0][translation_column]) if len(d) else []
            raise ConfigError(f"{where}: give data.hf.src_lang and data.hf.tgt_lang (column "
                              f"{translation_column!r} has languages {langs})")
        column = d[translation_column]
        if len(d) and not {src_lang, tgt_lang} <= set(column[0]):
            raise DataError(f"{where}: column {translation_column!r} has languages {sorted(column[0])}, "
                            f"not {src_lang!r} and {tgt_lang!r}")
        rows = ((t.get(src_lang), t.get(tgt_lang)) if isinstance(t, dict) else (None, None) for t in column)
    else:
        raise ConfigError(f"{where} has columns {', '.join(d.column_names)}: give data.hf.src_column and "
                          f"data.hf.tgt_column, or data.hf.translation_column with src_lang and tgt_lang")
    pairs = []
    for row, (src, tgt) in enumerate(rows, start=1):
        for side, text in (("source", src), ("target", tgt)):
            if text is not None and not isinstance(text, str):
                raise DataError(f"{where} row {row}: the {side} is {type(text).__name__}, not text")
        src, tgt = (src or "").strip(), (tgt or "").strip()
        if not src or not tgt:
            raise DataError(f"{where} row {row}: empty {'source' if not src else 'target'} sentence")
        pairs.append(Pair(src, tgt, bucket=length_bucket(src, edges), line=row))
    if not pairs:
        raise DataError(f"{where} has no sentence pairs")
    return pairs


def text_column_file(path: str, options: dict, cache_dir: str | os.PathLike) -> Path:
    """The LM's view of a dataset: its train split's text column (``options`` as ``data.hf``) written once, one row
    per line, to ``<cache_dir>/hf_text/<key>/train.txt``, which the LM then reads like any text file (streamed,
    sharded). The key is the dataset's fingerprint and the column; the file is written under a temporary name and
    renamed when complete, so an interrupted export is never read."""
    import hashlib
    import json
    import tempfile

    opts = {**HF_OPTIONS, **options}
    d = load_hf(path, opts["name"], opts["split"], opts["datasets_cache"])["train"]
    column = opts["text_column"]
    _check_column(d, column, "the text (data.hf.text_column)", f"{path} [train]")
    ident = {"fingerprint": getattr(d, "_fingerprint", None), "column": column, "rows": len(d),
             "files": [(f["filename"], os.path.getsize(f["filename"])) for f in d.cache_files]}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(cache_dir) / "hf_text" / key / "train.txt"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".train.", suffix=".tmp")
    try:
        blank = True
        with reported(out), os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for text in iter_text(d, column, where=f"{path} [train]"):
                blank = blank and not text.strip()
                f.write(text)
                f.write("\n")
        if blank:  # named here: past this point the error would name the cache's train.txt
            raise DataError(f"{path} [train]: column {column!r} holds no text ({len(d):,} rows, all null or blank)")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info(f"data=hf: {len(d):,} rows of column {column!r} of {path} -> {out}")
    return out
