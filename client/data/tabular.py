"""The in-memory data model of a silo: two divisions aligned by record index.

Follows SteFFLe's data model (Gupta et al. 2024, Section 2): a record is (x, s, y); each silo splits its records
into a *non-sensitive division* (features x and labels y, the only thing the model side sees) and a *sensitive
division* (the joint protected category s, the only place s is read). Several sensitive columns form one categorical
variable over their Cartesian product, so `SensitiveDivision.groups` is a single index in [0, num_groups).

Every class validates itself in ``__post_init__`` (dtypes, shapes, alignment, ranges, finite features), so a
`Split` or `SiloData` that exists is one the training code can use without re-checking. The checks are cheap
(one pass over the feature matrix) because a deployed silo rebuilds these objects on every message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DataError",
    "DatasetInfo",
    "NonSensitiveDivision",
    "SensitiveDivision",
    "SiloData",
    "Split",
    "TabularDataset",
    "make_split",
]


class DataError(ValueError):
    """Bad data or bad data-loading arguments; the message names the field and the fix."""


def _check_array(value: object, field: str, dtype: type[np.generic], ndim: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise DataError(f"{field} must be a numpy array, got {type(value).__name__}")
    if value.dtype != dtype:
        raise DataError(
            f"{field} must have dtype {np.dtype(dtype).name}, got {value.dtype}; convert it with "
            f".astype(np.{np.dtype(dtype).name}) or build the split with make_split()"
        )
    if value.ndim != ndim:
        raise DataError(f"{field} must be {ndim}-dimensional, got shape {value.shape}")
    if not value.flags.c_contiguous:
        raise DataError(f"{field} must be C-contiguous; pass np.ascontiguousarray({field.split('.')[-1]})")
    return value


@dataclass(frozen=True)
class NonSensitiveDivision:
    """What the model side of a silo sees: features and labels, never the protected attributes.

    features: float32 (n, d), C-contiguous, finite. labels: int64 (n,), values >= 0 (the upper bound
    num_labels is checked by the container that knows the `DatasetInfo`).
    """

    features: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        features = _check_array(self.features, "features", np.float32, 2)
        labels = _check_array(self.labels, "labels", np.int64, 1)
        if features.shape[0] != labels.shape[0]:
            raise DataError(
                f"features has {features.shape[0]} rows but labels has {labels.shape[0]}; "
                "they must be aligned by record index"
            )
        if features.size and not np.isfinite(features).all():
            bad_rows, bad_cols = np.nonzero(~np.isfinite(features))
            raise DataError(
                f"features contains {bad_rows.size} non-finite values (first at row {bad_rows[0]}, "
                f"column {bad_cols[0]}); impute or drop them before building the split"
            )
        if labels.size and labels.min() < 0:
            raise DataError(f"labels must be >= 0, found {labels.min()}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class SensitiveDivision:
    """The only holder of protected attributes: one joint category index per record, aligned by record index."""

    groups: np.ndarray

    def __post_init__(self) -> None:
        groups = _check_array(self.groups, "groups", np.int64, 1)
        if groups.size and groups.min() < 0:
            raise DataError(f"groups must be >= 0, found {groups.min()}")

    def __len__(self) -> int:
        return int(self.groups.shape[0])


@dataclass(frozen=True)
class DatasetInfo:
    """Public metadata of a dataset, identical for all silos of one dataset (it reveals no record)."""

    name: str
    feature_names: tuple[str, ...]
    label_names: tuple[str, ...]
    sensitive_columns: tuple[str, ...]
    group_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DataError("DatasetInfo.name must be a non-empty string")
        for field in ("feature_names", "label_names", "sensitive_columns", "group_names"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise DataError(f"DatasetInfo.{field} must be a tuple of str, got {value!r}")
            if len(set(value)) != len(value):
                dupes = sorted({v for v in value if value.count(v) > 1})
                raise DataError(f"DatasetInfo.{field} has duplicate entries {dupes}")
        if not self.feature_names:
            raise DataError("DatasetInfo.feature_names is empty: a dataset needs at least one feature")
        if len(self.label_names) < 2:
            raise DataError(f"DatasetInfo.label_names must list at least 2 labels, got {self.label_names}")
        if not self.sensitive_columns:
            raise DataError("DatasetInfo.sensitive_columns is empty: name at least one protected attribute")
        if not self.group_names:
            raise DataError("DatasetInfo.group_names is empty: the sensitive attribute needs at least one category")

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def num_groups(self) -> int:
        return len(self.group_names)


@dataclass(frozen=True)
class Split:
    """One split (train or test) of one silo or of a whole dataset: the two divisions, same length."""

    nonsensitive: NonSensitiveDivision
    sensitive: SensitiveDivision

    def __post_init__(self) -> None:
        if not isinstance(self.nonsensitive, NonSensitiveDivision):
            raise DataError(
                f"Split.nonsensitive must be a NonSensitiveDivision, got {type(self.nonsensitive).__name__}"
            )
        if not isinstance(self.sensitive, SensitiveDivision):
            raise DataError(f"Split.sensitive must be a SensitiveDivision, got {type(self.sensitive).__name__}")
        if len(self.nonsensitive) != len(self.sensitive):
            raise DataError(
                f"non-sensitive division has {len(self.nonsensitive)} records but sensitive division has "
                f"{len(self.sensitive)}; the divisions must be aligned by record index"
            )

    def __len__(self) -> int:
        return len(self.nonsensitive)

    def subset(self, idx: np.ndarray) -> Split:
        """The records at integer positions `idx` (in that order), in both divisions."""
        idx = np.asarray(idx)
        if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
            raise DataError(f"subset index must be a 1-d integer array, got dtype {idx.dtype} shape {idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise DataError(f"subset index out of range [0, {len(self)}): min {idx.min()}, max {idx.max()}")
        idx = idx.astype(np.int64, copy=False)
        ns = self.nonsensitive
        return Split(
            NonSensitiveDivision(np.ascontiguousarray(ns.features[idx]), np.ascontiguousarray(ns.labels[idx])),
            SensitiveDivision(np.ascontiguousarray(self.sensitive.groups[idx])),
        )

    def check_against(self, info: DatasetInfo, where: str) -> None:
        """Check feature width and label/group ranges against the dataset metadata (`where` names the split)."""
        features, labels = self.nonsensitive.features, self.nonsensitive.labels
        if features.shape[1] != info.num_features:
            raise DataError(
                f"{where}: features have {features.shape[1]} columns but info lists {info.num_features} feature names"
            )
        if labels.size and labels.max() >= info.num_labels:
            raise DataError(f"{where}: label {labels.max()} out of range; info has {info.num_labels} labels")
        groups = self.sensitive.groups
        if groups.size and groups.max() >= info.num_groups:
            raise DataError(f"{where}: group {groups.max()} out of range; info has {info.num_groups} groups")


def make_split(features: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> Split:
    """Build a `Split` from array-likes, converting to the required dtypes and layout (float32/int64, C order)."""
    labels_arr = np.asarray(labels)
    groups_arr = np.asarray(groups)
    for field, arr in (("labels", labels_arr), ("groups", groups_arr)):
        if (
            arr.size
            and not np.issubdtype(arr.dtype, np.integer)
            and (not np.issubdtype(arr.dtype, np.number) or not np.all(np.mod(arr, 1) == 0))
        ):
            raise DataError(f"{field} must hold integer codes, got dtype {arr.dtype}")
    return Split(
        NonSensitiveDivision(
            np.ascontiguousarray(features, dtype=np.float32), np.ascontiguousarray(labels_arr, dtype=np.int64)
        ),
        SensitiveDivision(np.ascontiguousarray(groups_arr, dtype=np.int64)),
    )


def _check_sort_key(key: np.ndarray | None, split: Split, field: str) -> None:
    if key is None:
        return
    _check_array(key, field, np.float64, 1)
    if key.shape[0] != len(split):
        raise DataError(f"{field} has {key.shape[0]} entries but the split has {len(split)} records")
    if not np.isfinite(key).all():
        raise DataError(f"{field} contains non-finite values")


@dataclass(frozen=True)
class TabularDataset:
    """A whole dataset after preprocessing, before partitioning.

    train_sort_key / test_sort_key: the raw (un-normalized) attribute that Algorithm 3 of the SteFFLe paper sorts on
    to model silo heterogeneity (age in all of the paper's experiments), float64 aligned with the split, or None
    when the dataset has no such attribute.
    """

    info: DatasetInfo
    train: Split
    test: Split
    train_sort_key: np.ndarray | None
    test_sort_key: np.ndarray | None

    def __post_init__(self) -> None:
        self.train.check_against(self.info, "train split")
        self.test.check_against(self.info, "test split")
        if (self.train_sort_key is None) != (self.test_sort_key is None):
            raise DataError("train_sort_key and test_sort_key must both be arrays or both be None")
        _check_sort_key(self.train_sort_key, self.train, "train_sort_key")
        _check_sort_key(self.test_sort_key, self.test, "test_sort_key")


@dataclass(frozen=True)
class SiloData:
    """What one silo holds: its local train and test splits plus the shared dataset metadata."""

    info: DatasetInfo
    silo_id: int
    num_silos: int
    train: Split
    test: Split

    def __post_init__(self) -> None:
        if isinstance(self.num_silos, bool) or not isinstance(self.num_silos, int | np.integer) or self.num_silos < 1:
            raise DataError(f"num_silos must be a positive integer, got {self.num_silos!r}")
        if (
            isinstance(self.silo_id, bool)
            or not isinstance(self.silo_id, int | np.integer)
            or not 0 <= self.silo_id < self.num_silos
        ):
            raise DataError(f"silo_id must be an integer in [0, {self.num_silos}), got {self.silo_id!r}")
        self.train.check_against(self.info, f"silo {self.silo_id} train split")
        self.test.check_against(self.info, f"silo {self.silo_id} test split")
