"""Tests for client/data/images.py on the real idx files of shared/data (no network is used).

Label counts are the ones `shared/data/README.md` lists for the canonical files.
"""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from silofl.client.data.images import (
    FASHION_MNIST_LABELS,
    NO_SENSITIVE_COLUMN,
    SINGLE_GROUP,
    idx_files,
    load_digits,
    load_mnist,
    read_idx,
)
from silofl.client.data.partition import partition_dataset
from silofl.client.data.sources import FILES, ChecksumError, DataUnavailableError, ensure_file, sha256_file
from silofl.client.data.tabular import DataError, TabularDataset

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def mnist(data_dir: Path) -> TabularDataset:
    return load_mnist("mnist", data_dir=data_dir, download=False)


@pytest.mark.slow
def test_mnist_official_split_and_label_counts(mnist: TabularDataset) -> None:
    train, test = mnist.train.nonsensitive, mnist.test.nonsensitive
    assert train.features.shape == (60_000, 784) and test.features.shape == (10_000, 784)
    assert train.features.dtype == np.float32 and train.labels.dtype == np.int64
    assert np.bincount(train.labels).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(test.labels).tolist() == MNIST_TEST_COUNTS
    info = mnist.info
    assert info.name == "mnist" and info.num_features == 784 and info.label_names == tuple("0123456789")
    assert info.feature_names[0] == "pixel_0_0" and info.feature_names[29] == "pixel_1_1"
    assert info.sensitive_columns == (NO_SENSITIVE_COLUMN,) and info.group_names == (SINGLE_GROUP,)
    assert not mnist.train.sensitive.groups.any() and not mnist.test.sensitive.groups.any()
    assert mnist.train_sort_key is None and mnist.test_sort_key is None


def test_mnist_pixels_in_unit_interval_not_standardized(mnist: TabularDataset, data_dir: Path) -> None:
    features = mnist.train.nonsensitive.features
    assert features.min() == 0.0 and features.max() == 1.0
    # Raw pixels / 255, not z-scored: MNIST's well-known mean pixel intensity is 0.1307.
    assert abs(float(features.mean(dtype=np.float64)) - 0.1307) < 1e-3
    raw = read_idx(data_dir / "mnist" / "train-images-idx3-ubyte.gz")
    np.testing.assert_array_equal(np.rint(features[:100] * 255).astype(np.uint8), raw[:100])
    assert (features[:100] == raw[:100].astype(np.float32) / np.float32(255)).all()
    # The first training image is a 5 (the canonical file's first label).
    assert mnist.train.nonsensitive.labels[0] == 5


def test_fashion_mnist(data_dir: Path) -> None:
    ds = load_mnist("fashion-mnist", data_dir=data_dir, download=False)
    assert (len(ds.train), len(ds.test)) == (60_000, 10_000)
    assert np.bincount(ds.train.nonsensitive.labels).tolist() == [6_000] * 10
    assert np.bincount(ds.test.nonsensitive.labels).tolist() == [1_000] * 10
    assert ds.info.name == "fashion-mnist" and ds.info.label_names == FASHION_MNIST_LABELS
    features = ds.test.nonsensitive.features
    assert features.min() == 0.0 and features.max() == 1.0


def test_logreg_on_mnist_has_the_papers_dimension(mnist: TabularDataset) -> None:
    from silofl.protocols.models import build_model, parameter_spec

    spec = parameter_spec(build_model("logreg", mnist.info.num_features, mnist.info.num_labels))
    assert spec == [("head.weight", (10, 784)), ("head.bias", (10,))]
    assert sum(int(np.prod(shape)) for _, shape in spec) == 7_850  # the paper's d = 10 * 785


def test_decoded_arrays_are_cached_and_read_only(data_dir: Path, tmp_path: Path) -> None:
    path = data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz"
    first = read_idx(path)
    assert read_idx(path) is first
    assert not first.flags.writeable
    # Each load owns its float arrays: changing one does not change the next.
    a = load_mnist("mnist", data_dir=data_dir, download=False)
    a.test.nonsensitive.features[0, 0] = 7.0
    b = load_mnist("mnist", data_dir=data_dir, download=False)
    assert b.test.nonsensitive.features[0, 0] == 0.0
    # A file that changes on disk is decoded again.
    copy = tmp_path / "labels.gz"
    shutil.copyfile(path, copy)
    assert read_idx(copy).shape == (10_000,)
    _write_gz(copy, (2049).to_bytes(4, "big") + (5).to_bytes(4, "big") + bytes([3, 1, 4, 1, 5]))
    assert read_idx(copy).tolist() == [3, 1, 4, 1, 5]


def _write_gz(path: Path, payload: bytes) -> Path:
    path.write_bytes(gzip.compress(payload))
    return path


def test_damaged_idx_files_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "a.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="not a readable gzip file"):
        read_idx(tmp_path / "a.gz")
    with pytest.raises(DataError, match="magic number 1234"):
        read_idx(_write_gz(tmp_path / "b.gz", (1234).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x00"))
    truncated = (2051).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (2, 28, 28)) + bytes(784)
    with pytest.raises(DataError, match=r"dimensions \[2, 28, 28\] \(1584 bytes\) but the file holds 800"):
        read_idx(_write_gz(tmp_path / "c.gz", truncated))
    with pytest.raises(DataError, match="no such file"):
        read_idx(tmp_path / "missing.gz")


def test_mismatched_image_and_label_files(data_dir: Path, tmp_path: Path) -> None:
    for split in idx_files("mnist").values():
        for rel in split:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data_dir / rel, tmp_path / rel)
    labels = (2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([1, 2, 3])
    _write_gz(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz", labels)
    with pytest.raises(
        DataError, match=re.escape("holds 3 labels but mnist/t10k-images-idx3-ubyte.gz holds 10000 images")
    ):
        load_mnist("mnist", data_dir=tmp_path, download=False)


def test_missing_files_and_checksum_failure(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(
        DataUnavailableError, match=re.escape("ossci-datasets.s3.amazonaws.com/mnist/train-images")
    ) as info:
        load_mnist("mnist", data_dir=tmp_path, download=False)
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in str(info.value)
    with pytest.raises(DataError, match="unknown image dataset kind 'cifar10'"):
        load_mnist("cifar10", data_dir=tmp_path)

    rel = "fashion_mnist/t10k-labels-idx1-ubyte.gz"
    mirror = tmp_path / "mirror"
    (mirror / "fashion_mnist").mkdir(parents=True)
    genuine = (data_dir / rel).read_bytes()
    (mirror / rel).write_bytes(genuine[:100] + bytes([genuine[100] ^ 1]) + genuine[101:])  # one bit flipped
    target = tmp_path / "data"
    with pytest.raises(ChecksumError, match=f"expected {FILES[rel].sha256[:16]}"):
        ensure_file(rel, target, mirror=mirror.as_uri())
    assert not (target / rel).exists() and not list(target.rglob("*.part"))
    # The genuine bytes pass the check and are moved into place.
    shutil.copyfile(data_dir / rel, mirror / rel)
    assert sha256_file(ensure_file(rel, target, mirror=mirror.as_uri())) == FILES[rel].sha256


def test_image_files_are_registered_with_the_shared_checksums(data_dir: Path) -> None:
    sums = dict(reversed(line.split()) for line in (data_dir / "SHA256SUMS").read_text().splitlines() if line.strip())
    for kind in ("mnist", "fashion-mnist"):
        for rels in idx_files(kind).values():
            for rel in rels:
                assert FILES[rel].sha256 == sums[rel]
                assert FILES[rel].url is not None and FILES[rel].url.endswith(rel.split("/")[1])


def test_digits() -> None:
    ds = load_digits(seed=0)
    assert (len(ds.train), len(ds.test)) == (1_348, 449)  # 1,797 images, 3:1
    assert ds.info.name == "digits" and ds.info.num_features == 64 and ds.info.num_labels == 10
    features = np.concatenate([ds.train.nonsensitive.features, ds.test.nonsensitive.features])
    assert features.min() == 0.0 and features.max() == 1.0
    np.testing.assert_array_equal(features * 16, np.rint(features * 16))  # pixels 0..16, scaled by 1/16
    labels = np.concatenate([ds.train.nonsensitive.labels, ds.test.nonsensitive.labels])
    assert np.bincount(labels).min() >= 170  # every digit about 180 times
    assert ds.info.group_names == (SINGLE_GROUP,)
    again, other = load_digits(seed=0), load_digits(seed=1)
    np.testing.assert_array_equal(again.test.nonsensitive.labels, ds.test.nonsensitive.labels)
    assert not np.array_equal(other.test.nonsensitive.features, ds.test.nonsensitive.features)


@pytest.mark.slow
def test_mnist_label_skew_partition_into_ten_silos(mnist: TabularDataset) -> None:
    silos = partition_dataset(mnist, 10, method="classes", classes_per_silo=2, seed=0)
    assert sum(len(s.train) for s in silos) == 60_000 and sum(len(s.test) for s in silos) == 10_000
    seen = np.zeros(10, dtype=np.int64)
    for silo in silos:
        labels = np.unique(silo.train.nonsensitive.labels)
        assert labels.size == 2
        np.testing.assert_array_equal(np.unique(silo.test.nonsensitive.labels), labels)
        seen[labels] += 1
        assert silo.info.num_groups == 1 and not silo.train.sensitive.groups.any()
    # "first-deterministic": silo k holds digit k plus one more, so every digit is held by some silo.
    assert all(k in np.unique(s.train.nonsensitive.labels) for k, s in enumerate(silos))
    assert seen.sum() == 20 and seen.min() >= 1
