"""Tests for client/data/tabular.py: the data model validates itself and subsets both divisions together."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.client.data.tabular import (
    DataError,
    DatasetInfo,
    NonSensitiveDivision,
    SensitiveDivision,
    SiloData,
    Split,
    TabularDataset,
    make_split,
)

INFO = DatasetInfo(
    name="toy",
    feature_names=("a", "b", "c"),
    label_names=("no", "yes"),
    sensitive_columns=("sex",),
    group_names=("F", "M"),
)


def toy_split(n: int = 6, seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    return make_split(rng.normal(size=(n, 3)), np.arange(n) % 2, (np.arange(n) // 2) % 2)


def test_info_counts() -> None:
    assert (INFO.num_features, INFO.num_labels, INFO.num_groups) == (3, 2, 2)


def test_make_split_converts_dtypes_and_layout() -> None:
    features = np.asfortranarray(np.ones((4, 2), dtype=np.float64))
    split = make_split(features, [0, 1, 1, 0], np.array([1.0, 0.0, 0.0, 1.0]))
    assert split.nonsensitive.features.dtype == np.float32
    assert split.nonsensitive.features.flags.c_contiguous
    assert split.nonsensitive.labels.dtype == np.int64
    assert split.sensitive.groups.dtype == np.int64
    assert len(split) == 4


def test_make_split_rejects_fractional_codes() -> None:
    with pytest.raises(DataError, match="labels must hold integer codes"):
        make_split(np.ones((2, 1)), [0.5, 1.0], [0, 1])


@pytest.mark.parametrize(
    ("features", "labels", "message"),
    [
        (np.ones((3, 2), dtype=np.float64), np.zeros(3, dtype=np.int64), "features must have dtype float32"),
        (np.ones((3, 2), dtype=np.float32), np.zeros(3, dtype=np.int32), "labels must have dtype int64"),
        (np.ones(3, dtype=np.float32), np.zeros(3, dtype=np.int64), "features must be 2-dimensional"),
        (np.ones((3, 2), dtype=np.float32), np.zeros(4, dtype=np.int64), "aligned by record index"),
        (np.asfortranarray(np.ones((3, 2), dtype=np.float32)), np.zeros(3, dtype=np.int64), "C-contiguous"),
        (np.array([[1.0, np.nan]], dtype=np.float32), np.zeros(1, dtype=np.int64), "non-finite"),
        (np.ones((2, 2), dtype=np.float32), np.array([0, -1]), "labels must be >= 0"),
        ([[1.0]], np.zeros(1, dtype=np.int64), "must be a numpy array"),
    ],
)
def test_nonsensitive_division_validation(features: object, labels: np.ndarray, message: str) -> None:
    with pytest.raises(DataError, match=message):
        NonSensitiveDivision(features, labels)  # type: ignore[arg-type]


def test_sensitive_division_validation() -> None:
    with pytest.raises(DataError, match="groups must have dtype int64"):
        SensitiveDivision(np.zeros(3, dtype=np.float32))
    with pytest.raises(DataError, match="groups must be >= 0"):
        SensitiveDivision(np.array([0, -2]))


def test_split_requires_aligned_divisions() -> None:
    ns = NonSensitiveDivision(np.ones((3, 1), dtype=np.float32), np.zeros(3, dtype=np.int64))
    with pytest.raises(DataError, match="aligned by record index"):
        Split(ns, SensitiveDivision(np.zeros(2, dtype=np.int64)))


def test_subset_keeps_records_aligned_and_order() -> None:
    split = toy_split(6)
    sub = split.subset(np.array([4, 0, 5]))
    assert len(sub) == 3
    np.testing.assert_array_equal(sub.nonsensitive.features, split.nonsensitive.features[[4, 0, 5]])
    np.testing.assert_array_equal(sub.nonsensitive.labels, [0, 0, 1])
    np.testing.assert_array_equal(sub.sensitive.groups, split.sensitive.groups[[4, 0, 5]])
    assert sub.nonsensitive.features.flags.c_contiguous
    assert len(split.subset(np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize(
    ("idx", "message"),
    [(np.array([0, 6]), "out of range"), (np.array([0.0]), "integer"), (np.array([[0]]), "1-d integer")],
)
def test_subset_rejects_bad_index(idx: np.ndarray, message: str) -> None:
    with pytest.raises(DataError, match=message):
        toy_split(6).subset(idx)


def test_info_validation() -> None:
    with pytest.raises(DataError, match="label_names must list at least 2"):
        DatasetInfo("x", ("a",), ("only",), ("s",), ("g",))
    with pytest.raises(DataError, match="feature_names has duplicate"):
        DatasetInfo("x", ("a", "a"), ("0", "1"), ("s",), ("g",))
    with pytest.raises(DataError, match="tuple of str"):
        DatasetInfo("x", ["a"], ("0", "1"), ("s",), ("g",))  # type: ignore[arg-type]
    with pytest.raises(DataError, match="sensitive_columns is empty"):
        DatasetInfo("x", ("a",), ("0", "1"), (), ("g",))


def test_dataset_checks_ranges_against_info() -> None:
    split = toy_split(6)
    ds = TabularDataset(INFO, split, split, None, None)
    assert ds.info.num_groups == 2
    wide = make_split(np.ones((2, 4)), [0, 1], [0, 1])
    with pytest.raises(DataError, match="train split: features have 4 columns"):
        TabularDataset(INFO, wide, split, None, None)
    bad_label = make_split(np.ones((2, 3)), [0, 2], [0, 1])
    with pytest.raises(DataError, match="test split: label 2 out of range"):
        TabularDataset(INFO, split, bad_label, None, None)
    bad_group = make_split(np.ones((2, 3)), [0, 1], [0, 5])
    with pytest.raises(DataError, match="group 5 out of range"):
        TabularDataset(INFO, bad_group, split, None, None)


def test_dataset_sort_key_checks() -> None:
    split = toy_split(6)
    key = np.arange(6, dtype=np.float64)
    TabularDataset(INFO, split, split, key, key)
    with pytest.raises(DataError, match="both be arrays or both be None"):
        TabularDataset(INFO, split, split, key, None)
    with pytest.raises(DataError, match="train_sort_key has 5 entries"):
        TabularDataset(INFO, split, split, key[:5].copy(), key)
    with pytest.raises(DataError, match="test_sort_key must have dtype float64"):
        TabularDataset(INFO, split, split, key, key.astype(np.float32))


def test_silo_data_validation() -> None:
    split = toy_split(4)
    silo = SiloData(INFO, silo_id=1, num_silos=2, train=split, test=split)
    assert silo.silo_id == 1
    with pytest.raises(DataError, match=r"silo_id must be an integer in \[0, 2\)"):
        SiloData(INFO, silo_id=2, num_silos=2, train=split, test=split)
    with pytest.raises(DataError, match="num_silos must be a positive integer"):
        SiloData(INFO, silo_id=0, num_silos=0, train=split, test=split)
    with pytest.raises(DataError, match="silo 0 test split: label 3"):
        SiloData(INFO, silo_id=0, num_silos=1, train=split, test=make_split(np.ones((1, 3)), [3], [0]))
