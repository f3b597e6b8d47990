"""Tests for client/data/cifar.py on tiny files in the exact CIFAR-10 python-batch format (no network).

Each fake batch is a dict pickled with protocol 2 like the originals: b"data" a uint8 (n, 3072) array, channel-major,
b"labels" a list of ints. Both layouts of the data dir are covered: the extracted folder and the .tar.gz archive.
"""

from __future__ import annotations

import io
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

import silofl.client.data.cifar as cifar
from silofl.client.data.cifar import CIFAR10_ARCHIVE, CIFAR10_FOLDER, CIFAR10_LABELS, load_cifar10, read_batch
from silofl.client.data.loaders import BUILTIN_DATASETS, load_dataset
from silofl.client.data.partition import partition_dataset
from silofl.client.data.sources import FILES, ChecksumError, DataUnavailableError
from silofl.client.data.tabular import DataError

BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
PER_BATCH = 10  # one image of every class per batch
# A known pixel: image 3 of data_batch_2 has green = 200 at row 2, column 5 (channel-major: 1 * 1024 + 2 * 32 + 5).
KNOWN = ("data_batch_2", 3, 1 * 1024 + 2 * 32 + 5, 200)


def fake_batches(seed: int = 0) -> dict[str, dict[bytes, object]]:
    rng = np.random.default_rng(seed)
    batches = {}
    for b, name in enumerate(BATCHES):
        data = rng.integers(0, 256, size=(PER_BATCH, 3072), dtype=np.uint8)
        data[:, 0] = np.arange(PER_BATCH) + 10 * b  # tags every image with its position in the dataset
        labels = [(i + b) % 10 for i in range(PER_BATCH)]
        batches[name] = {b"batch_label": name.encode(), b"labels": labels, b"data": data}
    name, row, column, value = KNOWN
    batches[name][b"data"][row, column] = value  # type: ignore[index]
    return batches


def pickled(batch: dict[bytes, object]) -> bytes:
    return pickle.dumps(batch, protocol=2)


def write_folder(root: Path, batches: dict[str, dict[bytes, object]]) -> Path:
    folder = root / CIFAR10_FOLDER
    folder.mkdir(parents=True)
    for name, batch in batches.items():
        (folder / name).write_bytes(pickled(batch))
    return folder


def write_archive(path: Path, batches: dict[str, dict[bytes, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        members = {name: pickled(batch) for name, batch in batches.items()}
        members["batches.meta"] = pickle.dumps({b"label_names": [n.encode() for n in CIFAR10_LABELS]}, protocol=2)
        for name, raw in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def check_dataset(ds: object, batches: dict[str, dict[bytes, object]]) -> None:
    from silofl.client.data.tabular import TabularDataset

    assert isinstance(ds, TabularDataset)
    train, test = ds.train.nonsensitive, ds.test.nonsensitive
    assert train.features.shape == (5 * PER_BATCH, 3072) and test.features.shape == (PER_BATCH, 3072)
    assert train.features.dtype == np.float32 and train.labels.dtype == np.int64
    pixels = np.concatenate([batches[n][b"data"] for n in BATCHES[:5]])  # type: ignore[misc]
    assert (train.features == pixels.astype(np.float32) / np.float32(255)).all()
    assert train.features.min() >= 0.0 and train.features.max() <= 1.0
    np.testing.assert_array_equal(train.labels, np.concatenate([batches[n][b"labels"] for n in BATCHES[:5]]))
    np.testing.assert_array_equal(test.labels, batches["test_batch"][b"labels"])
    # Official order: batch 1..5 then test; the first column tags each image with its position.
    np.testing.assert_array_equal(np.rint(train.features[:, 0] * 255), np.arange(50))
    # Channel-major records: reshape(n, 3, 32, 32) is (N, C, H, W); the known green pixel lands at [1, 2, 5].
    name, row, _, value = KNOWN
    image = train.features[BATCHES.index(name) * PER_BATCH + row].reshape(3, 32, 32)
    assert image[1, 2, 5] == np.float32(value) / np.float32(255)
    info = ds.info
    assert info.name == "cifar10" and info.label_names == CIFAR10_LABELS and info.num_features == 3072
    assert info.feature_names[0] == "red_0_0" and info.feature_names[1024 + 2 * 32 + 5] == "green_2_5"
    assert info.feature_names[-1] == "blue_31_31"
    assert info.group_names == ("all",) and not ds.train.sensitive.groups.any()


def test_folder_layout_through_load_dataset(tmp_path: Path) -> None:
    batches = fake_batches()
    write_folder(tmp_path, batches)
    assert "cifar10" in BUILTIN_DATASETS
    check_dataset(load_dataset("cifar10", data_dir=tmp_path, download=False), batches)
    with pytest.raises(DataError, match=re.escape("keeps its official 50,000 / 10,000 train/test split")):
        load_dataset("cifar10", data_dir=tmp_path, test_fraction=0.5, download=False)
    with pytest.raises(DataError, match="no sensitive attribute"):
        load_dataset("cifar10", data_dir=tmp_path, sensitive=["sex"], download=False)


def test_archive_layout_is_extracted_on_first_use(tmp_path: Path) -> None:
    batches = fake_batches(1)
    archive = write_archive(tmp_path / CIFAR10_ARCHIVE, batches)
    check_dataset(load_dataset("CIFAR10", data_dir=tmp_path, download=False), batches)
    folder = tmp_path / CIFAR10_FOLDER
    assert sorted(p.name for p in folder.iterdir()) == sorted(BATCHES)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    archive.unlink()  # the second load reads the extracted folder
    check_dataset(load_cifar10(data_dir=tmp_path, download=False), batches)


def test_incomplete_folder_is_completed_from_the_archive(tmp_path: Path) -> None:
    batches = fake_batches(2)
    folder = write_folder(tmp_path, batches)
    (folder / "test_batch").unlink()
    with pytest.raises(DataUnavailableError, match=r"lacks \['test_batch'\].*cifar-10-python\.tar\.gz"):
        load_cifar10(data_dir=tmp_path, download=False)
    write_archive(tmp_path / CIFAR10_ARCHIVE, batches)
    check_dataset(load_cifar10(data_dir=tmp_path, download=False), batches)
    assert (folder / "test_batch").is_file()


def test_read_only_data_dir_reads_the_archive_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = fake_batches(3)
    write_archive(tmp_path / CIFAR10_ARCHIVE, batches)

    def read_only(files: dict[str, bytes], folder: Path) -> None:
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(cifar, "_extract", read_only)
    check_dataset(load_cifar10(data_dir=tmp_path, download=False), batches)
    assert not (tmp_path / CIFAR10_FOLDER).exists()


def test_numpy1_era_pickles_are_accepted() -> None:
    # The original batches name numpy.core.multiarray (numpy 1); numpy 2 writes numpy._core.multiarray.
    batch = fake_batches()["test_batch"]
    raw = pickled(batch).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray\n_reconstruct" in raw
    data, labels = read_batch(raw, "test_batch")
    np.testing.assert_array_equal(data, batch[b"data"])
    assert labels.tolist() == batch[b"labels"]


def test_missing_files_name_the_download(tmp_path: Path) -> None:
    with pytest.raises(
        DataUnavailableError, match=re.escape("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
    ):
        load_dataset("cifar10", data_dir=tmp_path, download=False)
    spec = FILES[CIFAR10_ARCHIVE]
    assert spec.url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert spec.sha256 == "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"


def test_download_is_checksum_verified(tmp_path: Path) -> None:
    # A file:// mirror serving a (fake) archive: the sha256 differs from the official one, so it is rejected.
    mirror = tmp_path / "mirror"
    write_archive(mirror / CIFAR10_ARCHIVE, fake_batches())
    target = tmp_path / "data"
    with pytest.raises(ChecksumError, match=f"expected {FILES[CIFAR10_ARCHIVE].sha256[:16]}"):
        cifar.ensure_file(CIFAR10_ARCHIVE, target, mirror=mirror.as_uri())
    assert not (target / CIFAR10_ARCHIVE).exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[: len(raw) // 2], "not a readable CIFAR-10 python batch"),
        (lambda raw: b"not a pickle", "not a readable CIFAR-10 python batch"),
        (lambda raw: pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, 2), r"uint8 array"),
        (lambda raw: pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, 2), "labels for 2 images"),
        (lambda raw: pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}, 2), "out of range 0..9"),
        (lambda raw: pickle.dumps({b"pixels": 1}, 2), "expected a dict with keys"),
        (lambda raw: b"cos\nsystem\n(S'echo pwned'\ntR.", "global os.system is not allowed"),
    ],
)
def test_corrupt_batches_are_clear_errors(tmp_path: Path, damage: object, message: str) -> None:
    folder = write_folder(tmp_path, fake_batches())
    raw = (folder / "data_batch_3").read_bytes()
    (folder / "data_batch_3").write_bytes(damage(raw))  # type: ignore[operator]
    with pytest.raises(DataError, match=message) as info:
        load_cifar10(data_dir=tmp_path, download=False)
    assert "data_batch_3" in str(info.value)


def test_corrupt_archive_is_a_clear_error(tmp_path: Path) -> None:
    archive = tmp_path / CIFAR10_ARCHIVE
    write_archive(archive, fake_batches())
    raw = archive.read_bytes()
    archive.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"not a readable \.tar\.gz"):
        load_cifar10(data_dir=tmp_path, download=False)
    partial = {name: batch for name, batch in fake_batches().items() if name != "data_batch_5"}
    write_archive(archive, partial)
    with pytest.raises(DataError, match=r"the archive lacks.*data_batch_5"):
        load_cifar10(data_dir=tmp_path, download=False)


def test_one_class_per_silo_partition(tmp_path: Path) -> None:
    # The paper's CIFAR-10 setting: 10 clients holding one class each.
    write_folder(tmp_path, fake_batches())
    silos = partition_dataset(load_cifar10(data_dir=tmp_path, download=False), 10, method="classes", classes_per_silo=1)
    assert sorted(int(np.unique(s.train.nonsensitive.labels)[0]) for s in silos) == list(range(10))
    assert all(np.unique(s.train.nonsensitive.labels).size == 1 for s in silos)
