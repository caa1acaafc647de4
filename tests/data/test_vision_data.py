import pickle
import tarfile

import numpy as np
import pytest
import torch
from vision_helpers import CLASSES, write_tiny_cifar

from attnlab.data.cifar10 import CIFAR10DataModule, download_cifar10, load_cifar10, read_batch
from attnlab.data.digits import DigitsDataModule
from attnlab.data.images import RandomCrop, RandomHorizontalFlip, RepeatedDataset, stratified_split
from attnlab.core.errors import (
    CIFAR10DownloadError,
    CIFAR10FormatError,
    ConfigError,
    DataFileNotFoundError,
    UserError,
)


# --- digits ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    dm = DigitsDataModule(seed=3, augment=False)
    dm.setup()
    return dm


def test_digits_split_is_stratified_disjoint_deterministic(digits):
    from attnlab.data.digits import load_digits_arrays

    _, labels = load_digits_arrays()
    parts = digits.split_indices(labels)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == 1797 and sizes[1] == pytest.approx(0.15 * 1797, abs=10)
    assert len(set(np.concatenate(parts).tolist())) == 1797  # disjoint and complete
    for part in parts:  # every class in the same proportion in every split
        counts = np.bincount(labels.numpy()[part], minlength=10) / len(part)
        assert np.allclose(counts, np.bincount(labels.numpy(), minlength=10) / 1797, atol=0.01)
    again = DigitsDataModule(seed=3).split_indices(labels)
    other = DigitsDataModule(seed=4).split_indices(labels)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not np.array_equal(parts[1], other[1])


def test_digits_items_are_normalized_with_train_stats(digits):
    assert (digits.num_classes, digits.image_size, digits.in_channels) == (10, 8, 1)
    assert digits.class_names == [str(i) for i in range(10)]
    train = torch.stack([digits.train_dataset[i]["image"] for i in range(len(digits.train_dataset))])
    assert train.shape == (len(digits.train_dataset), 1, 8, 8)
    assert abs(train.mean().item()) < 1e-4 and train.std().item() == pytest.approx(1.0, abs=1e-3)
    batch = next(iter(digits.val_dataloader()))
    assert batch["image"].dtype == torch.float32 and batch["label"].dtype == torch.long
    assert batch["image"].shape == (64, 1, 8, 8) and batch["label"].shape == (64,)
    image, label = digits.example_image()
    assert image.shape == (1, 1, 8, 8) and 0 <= label < 10
    assert torch.equal(image, digits.example_image()[0])  # fixed
    shown = digits.denormalize(image)
    assert shown.min() >= 0 and shown.max() <= 1
    torch.testing.assert_close(shown[0], digits.val_dataset.raw(0))


def test_digits_upsampling_and_repeats():
    dm = DigitsDataModule(image_size=16, repeats_per_epoch=3, batch_size=32)
    dm.setup()
    assert dm.train_dataset[0]["image"].shape == (1, 16, 16)
    assert len(dm.train_dataloader().dataset) == 3 * len(dm.train_dataset)
    with pytest.raises(ConfigError, match="num_classes=5"):
        DigitsDataModule(num_classes=5).setup()


def test_stratified_split_small_classes():
    labels = np.array([0] * 7 + [1] * 3 + [2])
    parts = stratified_split(labels, (0.6, 0.2, 0.2), seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(11))
    with pytest.raises(ValueError, match="sum to 1"):
        stratified_split(labels, (0.5, 0.2), seed=0)


def test_augmentations():
    torch.manual_seed(0)
    x = torch.arange(16.0).view(1, 4, 4)
    crops = {tuple(RandomCrop(1)(x).flatten().tolist()) for _ in range(60)}
    assert len(crops) > 3 and all(len(c) == 16 for c in crops)
    assert tuple(x.flatten().tolist()) in crops  # the unshifted window is one of them
    flips = {RandomHorizontalFlip()(x)[0, 0, 0].item() for _ in range(30)}
    assert flips == {0.0, 3.0}
    assert len(RepeatedDataset([1, 2, 3], 2)) == 6 and RepeatedDataset([1, 2, 3], 2)[4] == 2


# --- CIFAR-10 ----------------------------------------------------------------------------------------------------
def test_cifar_reader_on_generated_batches(tmp_path):
    written = write_tiny_cifar(tmp_path / "cifar")
    images, labels = read_batch(tmp_path / "cifar" / "data_batch_2")
    assert images.shape == (20, 3, 32, 32) and images.dtype == np.uint8
    data = written["data_batch_2"][0]
    # row layout: 1024 red, 1024 green, 1024 blue values, each row-major
    assert images[5, 1, 2, 3] == data[5, 1024 + 2 * 32 + 3]
    assert labels.tolist() == written["data_batch_2"][1]
    full = load_cifar10(tmp_path / "cifar")
    assert full["train"][0].shape == (100, 3, 32, 32) and full["test"][0].shape == (20, 3, 32, 32)
    assert full["class_names"] == CLASSES


def test_cifar_datamodule(tmp_path):
    write_tiny_cifar(tmp_path / "cifar")
    dm = CIFAR10DataModule(path=str(tmp_path / "cifar"), batch_size=8, num_workers=0, val_fraction=0.2)
    dm.prepare_data()  # download=False: nothing to do
    dm.setup()
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (80, 20, 20)
    assert np.bincount(dm.val_dataset.labels.numpy(), minlength=10).tolist() == [2] * 10  # stratified
    assert dm.class_names == CLASSES and (dm.num_classes, dm.image_size, dm.in_channels) == (10, 32, 3)
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (8, 3, 32, 32) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (8,) and batch["label"].dtype == torch.long
    assert dm.example_image()[0].shape == (1, 3, 32, 32)
    assert dm.val_dataset.transform is None and dm.train_dataset.transform is not None  # augment train only


def test_cifar_missing_folder_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10 folder not found: .*nowhere.*data\.download=true"):
        CIFAR10DataModule(path=str(tmp_path / "nowhere")).setup()
    write_tiny_cifar(tmp_path / "cifar")
    (tmp_path / "cifar" / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10 file missing: .*data_batch_4.*data\.download=true"):
        load_cifar10(tmp_path / "cifar")
    (tmp_path / "cifar" / "data_batch_4").mkdir()
    with pytest.raises(DataFileNotFoundError, match=r"CIFAR-10 file is a folder, not a file: .*data_batch_4"):
        load_cifar10(tmp_path / "cifar")
    with pytest.raises(DataFileNotFoundError, match=r"CIFAR-10 folder is a file, not a folder: .*batches\.meta"):
        load_cifar10(tmp_path / "cifar" / "batches.meta")  # data.path one level too deep


def test_cifar_download_from_a_url(tmp_path):
    """data.download=true: the archive's cifar-10-batches-py becomes data.path (a file:// URL stands in for the
    official one); a URL that cannot be read or a corrupt archive is a one-line UserError, not urllib's traceback."""
    write_tiny_cifar(tmp_path / "src" / "cifar-10-batches-py")
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    url = (tmp_path / "cifar-10-python.tar.gz").as_uri()
    assert load_cifar10(download_cifar10(tmp_path / "data" / "cifar", url=url, md5=None))["train"][0].shape[0] == 100
    missing = (tmp_path / "nowhere.tar.gz").as_uri()
    with pytest.raises(CIFAR10DownloadError, match=r"download from file://.*nowhere\.tar\.gz failed .*by hand"):
        download_cifar10(tmp_path / "other", url=missing)
    with pytest.raises(CIFAR10DownloadError, match=r"is corrupt: MD5 [0-9a-f]{32}, expected 0{32}"):
        download_cifar10(tmp_path / "other", url=url, md5="0" * 32)
    assert issubclass(CIFAR10DownloadError, UserError) and not (tmp_path / "other").exists()


def test_cifar_errors_are_user_errors():
    # train.py prints a UserError's message as one line and exits with status 2 (tests/test_bad_inputs.py)
    assert issubclass(CIFAR10FormatError, UserError) and issubclass(DataFileNotFoundError, UserError)
    with pytest.raises(ConfigError, match=r"val_fraction must be in \(0, 1\)"):
        CIFAR10DataModule(path="x", val_fraction=1.0)


@pytest.mark.parametrize("corrupt, message", [
    (b"this is not a pickle", "not a readable pickle"),
    (pickle.dumps([1, 2, 3]), "expected a pickled dict"),
    (pickle.dumps({b"labels": [0]}), "no 'data' entry"),
    (pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}), r"uint8 \(N, 3072\)"),
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "2 images but 1 labels"),
    (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [12]}), "labels outside 0..9"),
])
def test_cifar_malformed_batch(tmp_path, corrupt, message):
    write_tiny_cifar(tmp_path / "cifar")
    (tmp_path / "cifar" / "test_batch").write_bytes(corrupt)
    with pytest.raises(CIFAR10FormatError, match=f"malformed CIFAR-10 file .*test_batch.*{message}"):
        load_cifar10(tmp_path / "cifar")


def test_cifar_unpickler_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    write_tiny_cifar(tmp_path / "cifar")
    (tmp_path / "cifar" / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(CIFAR10FormatError, match="refusing to load builtins.print"):
        read_batch(tmp_path / "cifar" / "data_batch_1")
