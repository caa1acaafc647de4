"""A user's sentence pairs, as the translation data reads them: a TSV (``data=tsv``: ``path``, and ``val_path`` /
``test_path`` when given) or a Hugging Face dataset (``data=hf``), split into train / val / test.

Torch-free: train.py reads the pairs through these very functions before it imports Lightning
(:mod:`attnlab.runs.data_check`), the data module (:mod:`attnlab.data.translation_datamodule`) after.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import ConfigError, DataError
from .hf_source import hf_pairs, load_hf
from .parallel import Pair, read_parallel_tsv, split_pairs

HF_COLUMNS = ("src_column", "tgt_column", "translation_column", "src_lang", "tgt_lang")


def tsv_files(path: str | None, val_path: str | None = None, test_path: str | None = None) -> dict[str, str]:
    """``{split: file}`` of a TSV corpus: ``path`` (train, or all three splits), ``val_path`` and ``test_path`` where
    given; one line when ``path`` is not."""
    if not path:
        raise ConfigError("source='tsv' needs path=<a tab-separated file: source<TAB>target per line>")
    named = {"train": path, "val": val_path, "test": test_path}
    return {split: file for split, file in named.items() if file}


def read_user_pairs(source: str, path: str | None, val_path: str | None, test_path: str | None, hf: dict | None,
                    edges: Sequence[int]) -> dict[str, list[Pair]]:
    """The pairs of each split the user's data has: train, and val / test where it has them. ``hf``: the options
    :func:`~attnlab.data.hf_source.hf_options` completed (``source="hf"``)."""
    if source == "hf":
        loaded = load_hf(path, hf["name"], hf["split"], hf["datasets_cache"])
        columns = {k: hf[k] for k in HF_COLUMNS}
        return {split: hf_pairs(d, **columns, edges=edges, where=f"{path} [{split}]") for split, d in loaded.items()}
    return {split: read_parallel_tsv(file, edges) for split, file in tsv_files(path, val_path, test_path).items()}


def user_splits(given: dict[str, list[Pair]], path: str | None, val_fraction: float, test_fraction: float,
                seed: int) -> dict[str, list[Pair]]:
    """train / val / test from the splits the data has (:func:`read_user_pairs`): a split it lacks is carved from
    train by ``seed``, grouped by source sentence (:func:`~attnlab.data.parallel.split_pairs`)."""
    given = dict(given)
    val_fraction = 0.0 if "val" in given else val_fraction
    test_fraction = 0.0 if "test" in given else test_fraction
    splits = split_pairs(given.pop("train"), val_fraction, test_fraction, seed)
    splits.update(given)
    for name in ("val", "test"):
        if not splits[name]:
            raise DataError(f"the {name} split of {path} is empty: give {name}_fraction > 0 or {name}_path")
    return splits
