"""Tests for client/data/partition.py: sizes, disjoint cover, determinism, Algorithm 3, label skew, validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from silofl.client.data.partition import PARTITIONS, partition_dataset, partition_indices
from silofl.client.data.synthetic import make_synthetic
from silofl.client.data.tabular import DataError


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted, no repeats
    merged = np.concatenate(parts)
    assert merged.size == n
    np.testing.assert_array_equal(np.sort(merged), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), num_silos=st.integers(1, 12), h=st.floats(0, 1), seed=st.integers(0, 2**31))
def test_iid_and_attribute_sizes_and_cover(n: int, num_silos: int, h: float, seed: int) -> None:
    if n < num_silos:
        with pytest.raises(DataError, match="not enough for num_silos"):
            partition_indices(n, num_silos, seed=seed)
        return
    key = np.random.default_rng(seed).integers(18, 90, size=n).astype(np.float64)
    for method, kwargs in (("iid", {}), ("attribute", {"sort_key": key, "heterogeneity": h})):
        parts = partition_indices(n, num_silos, method=method, seed=seed, **kwargs)
        assert len(parts) == num_silos
        assert_disjoint_cover(parts, n)
        sizes = [p.size for p in parts]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("method", PARTITIONS)
def test_deterministic_by_seed(method: str) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=600)
    key = rng.normal(40, 10, size=600)
    kwargs = {
        "labels": labels,
        "sort_key": key,
        "heterogeneity": 0.5 if method == "attribute" else 0.0,
        "classes_per_silo": 2,
    }
    a = partition_indices(600, 4, method=method, seed=5, **kwargs)
    b = partition_indices(600, 4, method=method, seed=5, **kwargs)
    c = partition_indices(600, 4, method=method, seed=6, **kwargs)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    assert_disjoint_cover(a, 600)


def test_algorithm3_h1_gives_sorted_blocks() -> None:
    key = np.random.default_rng(1).permutation(3000).astype(np.float64)  # distinct values: no ties
    parts = partition_indices(3000, 3, method="attribute", sort_key=key, heterogeneity=1.0, seed=0)
    for k, p in enumerate(parts):
        assert np.all((key[p] >= 1000 * k) & (key[p] < 1000 * (k + 1)))  # exactly block k
    # With a remainder, only the n mod K leftover records can leave their block.
    key = np.random.default_rng(2).permutation(3002).astype(np.float64)
    parts = partition_indices(3002, 3, method="attribute", sort_key=key, heterogeneity=1.0, seed=0)
    blocks = np.array_split(np.argsort(key), 3)
    outside = sum(np.setdiff1d(p, b).size for p, b in zip(parts, blocks, strict=True))
    assert outside <= 2


def test_algorithm3_h0_is_homogeneous_and_spread_grows_with_h() -> None:
    key = np.random.default_rng(3).normal(45, 13, size=6000)
    spreads = []
    for h in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts = partition_indices(6000, 3, method="attribute", sort_key=key, heterogeneity=h, seed=0)
        means = [key[p].mean() for p in parts]
        if h == 0.0:
            assert max(means) - min(means) < 1.5  # about a tenth of the std: similar silos
        else:
            assert means == sorted(means)  # silo k holds the k-th age block's records
        spreads.append(max(means) - min(means))
    assert all(a < b for a, b in itertools.pairwise(spreads))
    assert spreads[-1] > 20


def test_algorithm3_takes_floor_h_n_over_k_from_each_block() -> None:
    key = np.arange(900, dtype=np.float64)
    parts = partition_indices(900, 3, method="attribute", sort_key=key, heterogeneity=0.5, seed=4)
    for k, p in enumerate(parts):
        in_block = np.count_nonzero((p >= 300 * k) & (p < 300 * (k + 1)))
        # 150 picked from the block (line 8), then 150 of the 450 left over (150 per block) dealt at random:
        # about 50 more from block k (hypergeometric, sd ~ 5).
        assert 150 + 30 <= in_block <= 150 + 70


def test_classes_label_skew() -> None:
    labels = np.repeat(np.arange(4), 100)
    parts = partition_indices(400, 4, method="classes", labels=labels, classes_per_silo=2, seed=0)
    assert_disjoint_cover(parts, 400)
    for k, p in enumerate(parts):
        held = set(np.unique(labels[p]).tolist())
        assert len(held) == 2 and k % 4 in held  # first-deterministic: silo k gets class k, then one random
    one = partition_indices(400, 4, method="classes", labels=labels, classes_per_silo=1, seed=0)
    assert [np.unique(labels[p]).tolist() for p in one] == [[0], [1], [2], [3]]


def test_classes_that_leave_labels_unassigned_is_an_error() -> None:
    labels = np.repeat(np.arange(3), 20)
    with pytest.raises(DataError, match="classes_per_silo=1 and num_silos=2 leaves 20 records"):
        partition_indices(60, 2, method="classes", labels=labels, classes_per_silo=1)
    with pytest.raises(DataError, match="classes_per_silo=4"):
        partition_indices(60, 2, method="classes", labels=labels, classes_per_silo=4)


def test_dirichlet_skew_depends_on_alpha() -> None:
    labels = np.repeat([0, 1], 1000)

    def mean_imbalance(alpha: float) -> float:
        values = []
        for seed in range(5):
            parts = partition_indices(2000, 4, method="dirichlet", labels=labels, dirichlet_alpha=alpha, seed=seed)
            assert_disjoint_cover(parts, 2000)
            values += [abs(labels[p].mean() - 0.5) for p in parts]
        return float(np.mean(values))

    assert mean_imbalance(0.1) > 0.25 > 0.05 > mean_imbalance(100.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_silos": 0}, "num_silos must be an integer >= 1"),
        ({"method": "random"}, "unknown partition method 'random'"),
        ({"method": "attribute", "heterogeneity": 1.5}, r"heterogeneity must be in \[0, 1\]"),
        ({"method": "iid", "heterogeneity": 0.5}, "only applies to method='attribute'"),
        ({"method": "attribute"}, "needs sort_key"),
        ({"method": "classes"}, "needs labels"),
        (
            {"method": "dirichlet", "labels": np.zeros(50, np.int64), "dirichlet_alpha": 0.0},
            "dirichlet_alpha must be > 0",
        ),
        ({"method": "dirichlet", "labels": np.zeros(50)}, "labels must be integer class indices"),
        ({"method": "attribute", "sort_key": np.zeros(49)}, r"sort_key must have shape \(50,\)"),
        ({"num_silos": 51}, "50 records are not enough for num_silos=51"),
    ],
)
def test_validation_names_the_argument(kwargs: dict, message: str) -> None:
    args = {"num_silos": 3, **kwargs}
    num_silos = args.pop("num_silos")
    with pytest.raises(DataError, match=message):
        partition_indices(50, num_silos, **args)


def test_partition_dataset_train_and_test() -> None:
    ds = make_synthetic(3000, seed=0)
    silos = partition_dataset(ds, 3, method="attribute", heterogeneity=0.75, seed=1)
    assert [s.silo_id for s in silos] == [0, 1, 2] and all(s.num_silos == 3 for s in silos)
    assert sum(len(s.train) for s in silos) == len(ds.train)
    assert sum(len(s.test) for s in silos) == len(ds.test)
    # Each silo's rows are real rows of the dataset, divisions still aligned.
    train_parts = partition_indices(
        len(ds.train), 3, method="attribute", heterogeneity=0.75, seed=1, sort_key=ds.train_sort_key
    )
    for silo, idx in zip(silos, train_parts, strict=True):
        np.testing.assert_array_equal(silo.train.nonsensitive.features, ds.train.nonsensitive.features[idx])
        np.testing.assert_array_equal(silo.train.sensitive.groups, ds.train.sensitive.groups[idx])
    # The test split is partitioned the same way: silo k's local test ages come from the k-th block too.
    age = ds.info.feature_names.index("age")
    train_age = [s.train.nonsensitive.features[:, age].mean() for s in silos]
    test_age = [s.test.nonsensitive.features[:, age].mean() for s in silos]
    assert train_age == sorted(train_age) and test_age == sorted(test_age)
    again = partition_dataset(ds, 3, method="attribute", heterogeneity=0.75, seed=1)
    np.testing.assert_array_equal(again[2].test.nonsensitive.labels, silos[2].test.nonsensitive.labels)


def test_partition_dataset_label_methods_mirror_train_mix_in_test() -> None:
    ds = make_synthetic(4000, seed=0)
    silos = partition_dataset(ds, 3, method="classes", classes_per_silo=1, seed=0)
    for silo in silos:
        assert np.unique(silo.train.nonsensitive.labels).tolist() == np.unique(silo.test.nonsensitive.labels).tolist()
    assert sum(len(s.test) for s in silos) == len(ds.test)
    silos = partition_dataset(ds, 3, method="dirichlet", dirichlet_alpha=0.3, seed=2)
    for silo in silos:
        assert abs(silo.train.nonsensitive.labels.mean() - silo.test.nonsensitive.labels.mean()) < 0.05
    all_test = np.sort(np.concatenate([s.test.sensitive.groups for s in silos]))
    np.testing.assert_array_equal(all_test, np.sort(ds.test.sensitive.groups))


def test_partition_dataset_errors() -> None:
    ds = make_synthetic(40, seed=0)  # 30 train, 10 test records
    with pytest.raises(DataError, match="not enough for num_silos=12"):
        partition_dataset(ds, 12)
    with pytest.raises(DataError, match="needs sort_key"):
        partition_dataset(ds.__class__(ds.info, ds.train, ds.test, None, None), 2, method="attribute")
