"""CIFAR-10's python batches on disk (``cifar-10-batches-py/``): finding, reading and downloading them.

Torch-free, so that ``train.py`` reads the files before it imports Lightning (:mod:`attnlab.runs.data_check`), through
the very functions the data module (:mod:`attnlab.data.cifar10`) reads them with.

The folder holds ``data_batch_1`` … ``data_batch_5`` (50,000 training images), ``test_batch`` (10,000) and
``batches.meta``; each batch is a pickled dict with ``b"data"``: uint8 (N, 3072) — per row the 1,024 red, then green,
then blue values of a 32×32 image, row-major — and ``b"labels"``: N ints in 0..9; the meta file's
``b"label_names"`` names the classes. The files are unpickled with an unpickler that only accepts numpy arrays and
plain containers, so a tampered file cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from ..core.errors import CIFAR10DownloadError, CIFAR10FormatError, DataFileNotFoundError

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
IMAGE_SHAPE = (3, 32, 32)

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _hint(folder: Path) -> str:
    return (f"set data.path to the extracted 'cifar-10-batches-py' folder, or add data.download=true to fetch "
            f"{CIFAR10_URL} into {folder}")


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(io.BytesIO(f.read()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError) as e:
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: not a readable pickle ({e})") from None
    except OSError as e:  # e.g. no read permission
        raise CIFAR10FormatError(f"cannot read CIFAR-10 file {path}: {e.strerror or e}") from e
    if not isinstance(obj, dict):
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _get(d: dict, key: str, path: Path):
    for k in (key.encode(), key):  # the official files (pickled by Python 2) have bytes keys
        if k in d:
            return d[k]
    raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: no {key!r} entry (keys: {sorted(map(str, d))})")


def _require_file(folder: Path, name: str) -> Path:
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DataFileNotFoundError(f"CIFAR-10 folder is a file, not a folder: {folder}; {_hint(folder)}")
    if not folder.is_dir():
        raise DataFileNotFoundError(f"CIFAR-10 folder not found: {folder}; {_hint(folder)}")
    path = folder / name
    if path.is_dir():
        raise DataFileNotFoundError(f"CIFAR-10 file is a folder, not a file: {path}; {_hint(folder)}")
    if not path.is_file():
        raise DataFileNotFoundError(f"CIFAR-10 file missing: {path}; the folder is incomplete, {_hint(folder)}")
    return path


def read_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 (N, 3, 32, 32), labels int64 (N,)."""
    path = Path(path)
    d = _unpickle(path)
    data, labels = _get(d, "data", path), _get(d, "labels", path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: 'data' must be uint8 (N, 3072), got {desc}")
    try:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: 'labels' must be a list of ints") from None
    if len(labels) != len(data):
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: {len(data)} images but {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: labels outside 0..9 "
                                 f"(min {labels.min()}, max {labels.max()})")
    return data.reshape(-1, *IMAGE_SHAPE), labels


def read_meta(path: str | Path) -> list[str]:
    path = Path(path)
    names = _get(_unpickle(path), "label_names", path)
    if not isinstance(names, (list, tuple)) or len(names) != 10:
        raise CIFAR10FormatError(f"malformed CIFAR-10 file {path}: 'label_names' must list 10 names")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def load_cifar10(folder: str | Path) -> dict:
    """``{"train": (images, labels), "test": (images, labels), "class_names": [...]}`` from the batch folder."""
    folder = Path(folder).expanduser()
    paths = [_require_file(folder, n) for n in (*TRAIN_FILES, TEST_FILE, META_FILE)]  # all missing-file errors first
    train = [read_batch(p) for p in paths[: len(TRAIN_FILES)]]
    return {
        "train": (np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train])),
        "test": read_batch(paths[len(TRAIN_FILES)]),
        "class_names": read_meta(paths[-1]),
    }


def download_cifar10(folder: str | Path, url: str = CIFAR10_URL, md5: str | None = CIFAR10_MD5) -> Path:
    """Fetch the official archive and extract its ``cifar-10-batches-py`` as ``folder``. A complete folder is kept."""
    folder = Path(folder).expanduser().absolute()
    if all((folder / n).is_file() for n in (*TRAIN_FILES, TEST_FILE, META_FILE)):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        archive = Path(tmp) / "cifar-10-python.tar.gz"
        by_hand = "download it by hand, extract it and set data.path to its cifar-10-batches-py folder"
        try:  # a timeout, so that a network that drops packets fails instead of hanging
            with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as f:
                shutil.copyfileobj(response, f)
        except OSError as e:  # urllib.error.URLError (no network, no such file) is an OSError
            reason = e.reason if isinstance(e, urllib.error.URLError) else (e.strerror or e)
            raise CIFAR10DownloadError(f"CIFAR-10 download from {url} failed ({reason}); {by_hand}") from None
        if md5 is not None:
            digest = hashlib.md5(archive.read_bytes()).hexdigest()
            if digest != md5:
                raise CIFAR10DownloadError(f"CIFAR-10 download from {url} is corrupt: MD5 {digest}, expected {md5}; "
                                           f"{by_hand}")
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: no paths outside tmp, no devices
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover
                tar.extractall(tmp)
        extracted = Path(tmp) / "cifar-10-batches-py"
        if not extracted.is_dir():
            raise CIFAR10DownloadError(f"the archive from {url} has no cifar-10-batches-py folder")
        if folder.exists():
            shutil.rmtree(folder)
        shutil.move(str(extracted), folder)
    return folder
