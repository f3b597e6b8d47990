"""Turn a table (pandas DataFrame, CSV or Parquet file) into a preprocessed `TabularDataset`.

The preprocessing is the papers' (SteFFLe, Appendix E.2.1):

* a random train/test split by `seed` (3:1 by default; no stratification);
* categorical (non-numeric, or explicitly listed) feature columns one-hot encoded;
* continuous feature columns z-scored with the mean and standard deviation of the TRAINING split only;
* the sensitive columns removed from the features and combined into one joint category (Cartesian product of the
  values present, names joined with "|");
* the label encoded as an integer class index (binary for the built-in datasets).

Decision: the one-hot vocabulary (and the list of sensitive categories) is taken from the whole table, not only
from the training rows. A vocabulary is schema, not a statistic of values: it does not move train features when
test rows change value, and it keeps the feature layout identical for every seed (otherwise a category seen only in
the test rows, e.g. Adult's single "Holand-Netherlands" record, would change the model's input width with the seed).
The authors' code does the same (pandas.get_dummies on the pooled table).

Missing values are an error (naming the column): silently dropping or imputing would change what the papers measure.
Built-in loaders clean their files (e.g. Adult's '?') before calling `build_dataset`.

The table of a file dataset is read by `client.data.table_files` (CSV format detection included);
`client.data.numeric_columns` finds the numeric columns that one stray word turned into text (both reported by the
command line's checks, `client.data.preflight`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.client.data.table_files import read_table
from silofl.client.data.tabular import DataError, DatasetInfo, TabularDataset, make_split
from silofl.protocols.preprocessing import (
    CategoricalFeature,
    ContinuousFeature,
    FeatureColumn,
    LabelMapping,
    Preprocessing,
    PreprocessingError,
    Recoding,
    SensitiveColumn,
)

__all__ = [
    "MAX_LABELS",
    "LabelEncoder",
    "above_train_median",
    "build_dataset",
    "categorical_labels",
    "is_categorical",
    "load_table_dataset",
    "recording_preprocessing",
    "split_indices",
]

#: A target column with more distinct values than this is treated as continuous and rejected (binarize it first).
MAX_LABELS = 100

#: Given the target column and the training row positions, return (labels int64 (n,), label names).
LabelEncoder = Callable[[pd.Series, np.ndarray], tuple[np.ndarray, tuple[str, ...]]]


#: What to do with a missing value in a used column of a file dataset (`build_dataset`).
MISSING_POLICIES = ("error", "drop")


def _sorted_values(values: Sequence[object]) -> list[object]:
    """Sort category values naturally (numbers numerically), falling back to their string form for mixed types."""
    try:
        return sorted(values)  # type: ignore[type-var]
    except TypeError:
        return sorted(values, key=str)


def _fmt(value: object) -> str:
    """A category value as text: integral floats lose their '.0' so 2.0 and 2 read the same."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def categorical_labels(classes: Sequence[object] | None = None, names: Sequence[str] | None = None) -> LabelEncoder:
    """Label encoder mapping each target value to its position in `classes` (default: the sorted distinct values).

    `names` overrides the label names (default: the values as text). Values outside `classes` are an error.
    """

    def encode(target: pd.Series, train_idx: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        del train_idx  # the class list is schema, see the module docstring
        order = list(classes) if classes is not None else _sorted_values(list(pd.unique(target)))
        if len(order) < 2:
            raise DataError(
                f"target column {target.name!r} has a single value {order!r}; a classifier needs at least two classes"
            )
        if len(order) > MAX_LABELS:
            raise DataError(
                f"target column {target.name!r} has {len(order)} distinct values, more than "
                f"{MAX_LABELS}: it looks continuous; binarize it (e.g. value > median) before loading"
            )
        known = target.isin(order).to_numpy()
        if not known.all():
            unknown = sorted({_fmt(v) for v in target[~known]})[:5]
            raise DataError(
                f"target column {target.name!r} has values {unknown} outside the expected classes "
                f"{[_fmt(c) for c in order]}"
            )
        codes = pd.Categorical(target, categories=order).codes.astype(np.int64)
        label_names = tuple(names) if names is not None else tuple(_fmt(v) for v in order)
        if len(label_names) != len(order):
            raise DataError(f"got {len(label_names)} label names for {len(order)} classes")
        return codes, label_names

    # What `recording_preprocessing` records of the mapping: label k is the raw value of position k.
    encode.label_rule = lambda target, train_idx: (  # type: ignore[attr-defined]
        "classes",
        list(classes) if classes is not None else _sorted_values(list(pd.unique(target))),
    )
    return encode


def above_train_median(names: tuple[str, str] = ("<=median", ">median")) -> LabelEncoder:
    """Binary label encoder: 1 where the numeric target exceeds its median over the TRAINING rows, else 0."""

    def encode(target: pd.Series, train_idx: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        if not pd.api.types.is_numeric_dtype(target):
            raise DataError(
                f"target column {target.name!r} must be numeric to threshold at its median, got dtype {target.dtype}"
            )
        values = target.to_numpy(dtype=np.float64)
        median = float(np.median(values[train_idx]))
        return (values > median).astype(np.int64), tuple(names)

    # What `recording_preprocessing` records of the mapping: label 1 iff value > the training rows' median.
    encode.label_rule = lambda target, train_idx: (  # type: ignore[attr-defined]
        "above_threshold",
        float(np.median(target.to_numpy(dtype=np.float64)[train_idx])),
    )
    return encode


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test row positions (each sorted): round(n * test_fraction) test rows, the rest train.

    The errors use the command line's words (the test share is `silofl data split --test-fraction`; `silofl run`
    always uses 0.25) and name the split that would be empty, training or test."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"the test share (--test-fraction) must be in (0, 1), got {test_fraction}")
    n_test = math.floor(n * test_fraction + 0.5)
    if n_test < 1 or n_test > n - 1:
        n_train = n - n_test
        empty = (
            "the training and the test split"
            if n_train < 1 and n_test < 1
            else "the training split"
            if n_train < 1
            else "the test split"
        )
        raise DataError(
            f"{n} record{'' if n == 1 else 's'}, split {1 - test_fraction:.0%} training / {test_fraction:.0%} test, "
            f"leave {empty} empty ({max(n_train, 0)} training and {n_test} test records); each split needs at least "
            "one record: add records (`silofl data split` can also change the test share with --test-fraction)"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _encode_groups(frame: pd.DataFrame, sensitive: Sequence[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Joint category index over the Cartesian product of the sensitive columns (first column varies slowest)."""
    codes = np.zeros(len(frame), dtype=np.int64)
    names: list[str] = [""]
    for column in sensitive:
        values = _sorted_values(list(pd.unique(frame[column])))
        col_codes = pd.Categorical(frame[column], categories=values).codes.astype(np.int64)
        codes = codes * len(values) + col_codes
        names = [f"{prefix}|{_fmt(v)}" if prefix else _fmt(v) for prefix in names for v in values]
    return codes, tuple(names)


def _encode_features(
    frame: pd.DataFrame, columns: Sequence[str], categorical: set[str], train_idx: np.ndarray
) -> tuple[np.ndarray, tuple[str, ...]]:
    """One-hot the categorical columns and z-score the rest with training statistics; keep the column order."""
    blocks: list[np.ndarray] = []
    names: list[str] = []
    n = len(frame)
    for column in columns:
        series = frame[column]
        if column in categorical:
            values = _sorted_values(list(pd.unique(series)))
            codes = pd.Categorical(series, categories=values).codes
            block = np.zeros((n, len(values)), dtype=np.float32)
            block[np.arange(n), codes] = 1.0
            blocks.append(block)
            names.extend(f"{column}={_fmt(v)}" for v in values)
        else:
            x = series.to_numpy(dtype=np.float64)
            mean = x[train_idx].mean()
            std = x[train_idx].std()
            # A column constant on the training rows carries no information; map it to 0 instead of dividing by 0.
            block = ((x - mean) / (std if std > 0 else 1.0)).astype(np.float32)
            blocks.append(block[:, None])
            names.append(column)
    return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32), tuple(names)


def is_categorical(series: pd.Series) -> bool:
    """Whether the encoder one-hot encodes the column by its type: non-numeric and boolean columns."""
    return not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)


#: The arguments of `build_dataset` that the command line sets with a flag of the same name.
_FLAGS = ("target", "sensitive", "features")


def _check_columns(frame: pd.DataFrame, names: Sequence[str], field: str) -> None:
    missing = [c for c in names if c not in frame.columns]
    if missing:
        name = f"--{field}" if field in _FLAGS else field
        raise DataError(f"{name}: column(s) {missing} not in the table; its columns: {list(frame.columns)}")


def build_dataset(
    frame: pd.DataFrame,
    *,
    name: str,
    target: str,
    sensitive: Sequence[str],
    features: Sequence[str] | None = None,
    categorical: Sequence[str] = (),
    sort_key: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.25,
    label_encoder: LabelEncoder | None = None,
    missing: str = "error",
    recoding: Recoding | None = None,
) -> TabularDataset:
    """Preprocess a clean table into a `TabularDataset` (see the module docstring for the steps).

    features: the feature columns (default: every column except the target and the sensitive ones).
    categorical: numeric columns to one-hot anyway (non-numeric and boolean columns are always one-hot).
    sort_key: a numeric column whose raw values become the Algorithm 3 sort key (it may also be a feature).
    label_encoder: how to turn the target column into class indices (default: `categorical_labels()`).
    missing: "error" (default) refuses a table with a missing value in a column it uses, naming the columns and
        counts; "drop" drops those rows first (only the used columns count), and refuses a table left empty.
    recoding: what the dataset's reader did to `frame` before (a built-in's, `client.data.loaders`), not applied here:
        recorded with the preprocessing, so that new raw rows are recoded the same way.
    """
    if isinstance(sensitive, str):
        sensitive = [sensitive]
    sensitive = list(sensitive)
    if not sensitive:
        raise DataError("sensitive: name at least one sensitive column (e.g. sensitive=['sex'])")
    if len(set(sensitive)) != len(sensitive):
        raise DataError(f"sensitive: duplicate columns in {sensitive}")
    _check_columns(frame, [target], "target")
    _check_columns(frame, sensitive, "sensitive")
    if target in sensitive:
        raise DataError(f"target column {target!r} cannot also be a sensitive column")
    if features is None:
        features = [c for c in frame.columns if c != target and c not in sensitive]
    else:
        if isinstance(features, str):
            features = [features]
        features = list(features)
        _check_columns(frame, features, "features")
        clash = [c for c in features if c == target or c in sensitive]
        if clash:
            raise DataError(
                f"features: {clash} are the target or sensitive columns; sensitive attributes live only "
                "in the sensitive division and must not be features"
            )
        if len(set(features)) != len(features):
            raise DataError(f"features: duplicate columns in {features}")
    if not features:
        raise DataError("features: no feature columns left after removing the target and sensitive columns")
    _check_columns(frame, list(categorical), "categorical")
    if sort_key is not None:
        _check_columns(frame, [sort_key], "sort_key")
        if not pd.api.types.is_numeric_dtype(frame[sort_key]) or pd.api.types.is_bool_dtype(frame[sort_key]):
            raise DataError(f"sort_key column {sort_key!r} must be numeric, got dtype {frame[sort_key].dtype}")

    used = list(dict.fromkeys([target, *sensitive, *features, *([sort_key] if sort_key else [])]))
    if missing not in MISSING_POLICIES:
        raise DataError(f"missing must be one of {MISSING_POLICIES}, got {missing!r}")
    missing_counts = frame[used].isna().sum()
    if missing_counts.any():
        bad = {c: int(k) for c, k in missing_counts.items() if k}
        if missing == "error":
            raise DataError(
                f"missing values in columns {bad}; drop or impute those rows before loading, or load with "
                "missing='drop' (--missing drop) to drop the rows with a missing value in a used column"
            )
        frame = frame[used].dropna()
        if frame.empty:
            raise DataError(f"missing='drop' left no rows: every row misses a value in one of the columns {bad}")
    frame = frame[used].reset_index(drop=True)
    if frame.empty:
        raise DataError(
            f"{name}: the table has no records (a header row only?): its training and its test split would be empty; "
            "add records"
        )

    train_idx, test_idx = split_indices(len(frame), test_fraction, seed)
    labels, label_names = (label_encoder or categorical_labels())(frame[target], train_idx)
    groups, group_names = _encode_groups(frame, sensitive)
    cat = set(categorical) | {c for c in features if is_categorical(frame[c])}
    x, feature_names = _encode_features(frame, features, cat, train_idx)
    if _RECORDING.get() is not None:
        encoded = (x, labels, label_names, groups)
        _record_preprocessing(
            frame, name, target, sensitive, features, cat, train_idx, label_encoder, encoded, recoding=recoding
        )

    info = DatasetInfo(
        name=name,
        feature_names=feature_names,
        label_names=label_names,
        sensitive_columns=tuple(sensitive),
        group_names=group_names,
    )
    full = make_split(x, labels, groups)
    key = frame[sort_key].to_numpy(dtype=np.float64) if sort_key is not None else None
    return TabularDataset(
        info=info,
        train=full.subset(train_idx),
        test=full.subset(test_idx),
        train_sort_key=None if key is None else np.ascontiguousarray(key[train_idx]),
        test_sort_key=None if key is None else np.ascontiguousarray(key[test_idx]),
    )


#: The list each `recording_preprocessing` block collects into (None outside one).
_RECORDING: ContextVar[list[Preprocessing | PreprocessingError] | None] = ContextVar(
    "silofl_recording_preprocessing", default=None
)


@contextmanager
def recording_preprocessing() -> Iterator[list[Preprocessing | PreprocessingError]]:
    """Within the block, each `build_dataset` call appends what it applied to the yielded list, in call order: the
    :class:`~protocols.preprocessing.Preprocessing` (vocabularies, training statistics, label mapping, groups) that
    re-encodes raw rows exactly as it encoded them, or the `PreprocessingError` saying why none could be recorded.

    How `silofl run` (simulation) and `silofl data split` learn the encoding of the dataset they load without changing
    what the loaders return; outside such a block `build_dataset` records nothing and costs nothing more.
    """
    recorded: list[Preprocessing | PreprocessingError] = []
    token = _RECORDING.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDING.reset(token)


def _record_preprocessing(
    frame: pd.DataFrame,
    name: str,
    target: str,
    sensitive: Sequence[str],
    features: Sequence[str],
    categorical: set[str],
    train_idx: np.ndarray,
    label_encoder: LabelEncoder | None,
    encoded: tuple[np.ndarray, np.ndarray, tuple[str, ...], np.ndarray],
    *,
    recoding: Recoding | None = None,
) -> None:
    """Append the `Preprocessing` of the encoding `build_dataset` just did (same vocabularies and statistics as
    `_encode_features` / `_encode_groups`, the label encoder's `label_rule`, the reader's `recoding`) to the active
    recording, after checking that it re-encodes `frame` to exactly the `encoded` (features, labels, label names,
    groups), bit for bit: a record that drifted from the encoder is never recorded. `frame` is already recoded, so
    the check also shows that the recoding leaves the rows it made alone."""
    recorded = _RECORDING.get()
    assert recorded is not None
    x, labels, label_names, groups = encoded
    try:
        columns: list[FeatureColumn] = []
        for column in features:
            if column in categorical:
                columns.append(CategoricalFeature(column, tuple(_sorted_values(list(pd.unique(frame[column]))))))
            else:
                values = frame[column].to_numpy(dtype=np.float64)[train_idx]
                columns.append(ContinuousFeature(column, values.mean(), values.std()))
        rule = getattr(label_encoder or categorical_labels(), "label_rule", None)
        if rule is None:
            mapping = LabelMapping(target, label_names, "custom")
        else:
            kind, value = rule(frame[target], train_idx)
            mapping = LabelMapping(
                target,
                label_names,
                kind,
                classes=tuple(value) if kind == "classes" else None,
                threshold=value if kind == "above_threshold" else None,
            )
        vocabularies = tuple(SensitiveColumn(c, tuple(_sorted_values(list(pd.unique(frame[c]))))) for c in sensitive)
        record = Preprocessing(
            dataset=name,
            features=tuple(columns),
            target=mapping,
            sensitive=vocabularies,
            recoding=recoding or Recoding(),
        )
        again = record.encode_features(frame)
        same = again.shape == x.shape and again.tobytes() == x.tobytes()
        same = same and np.array_equal(record.encode_groups(frame), groups)
        same = same and (mapping.kind == "custom" or np.array_equal(record.encode_labels(frame), labels))
    except PreprocessingError as exc:
        recorded.append(PreprocessingError(f"{name}: its preprocessing cannot be recorded: {exc}"))
        return
    if not same:  # a bug, not bad data: the record and the encoder above disagree
        raise DataError(f"{name}: the recorded preprocessing does not reproduce the encoding (report this bug)")
    recorded.append(record)


def _default_sort_key(frame: pd.DataFrame) -> str | None:
    """The column named 'age' (any case) when it is numeric, else None."""
    for column in frame.columns:
        if (
            str(column).lower() == "age"
            and pd.api.types.is_numeric_dtype(frame[column])
            and not pd.api.types.is_bool_dtype(frame[column])
        ):
            return str(column)
    return None


def load_table_dataset(
    path: str | Path,
    *,
    target: str | None,
    sensitive: Sequence[str] | None,
    features: Sequence[str] | None = None,
    seed: int = 0,
    test_fraction: float = 0.25,
    missing: str = "error",
    csv_sep: str = "",
    csv_encoding: str = "",
) -> TabularDataset:
    """The generic loader: any CSV/Parquet table with a categorical target and one or more sensitive columns.

    The Algorithm 3 sort key is the column named 'age' (any case) when there is one. `missing`: see `build_dataset`.
    csv_sep / csv_encoding: how a CSV file is read, "" to detect (:func:`read_table_with_format`); the detection is
    deterministic, so every silo of a run reads the file as the command line's checks did.
    """
    if not target:
        raise DataError(f"{path}: a file dataset needs target=COLUMN (--target) naming the label column")
    if not sensitive:
        raise DataError(
            f"{path}: a file dataset needs sensitive=[COLUMN, ...] (--sensitive) naming the protected attribute(s)"
        )
    frame = read_table(path, csv_sep=csv_sep, csv_encoding=csv_encoding)
    return build_dataset(
        frame,
        name=Path(path).stem,
        target=target,
        sensitive=sensitive,
        features=features,
        sort_key=_default_sort_key(frame),
        seed=seed,
        test_fraction=test_fraction,
        missing=missing,
    )
