"""Turn a table (pandas DataFrame, CSV or Parquet file) into a preprocessed `TabularDataset`.

The preprocessing is the papers' (SteFFLe, Appendix E.2.1; spec `steffle.md`, "Experiments"):

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from client.data.tabular import DataError, DatasetInfo, TabularDataset, make_split

__all__ = [
    "MAX_LABELS",
    "LabelEncoder",
    "above_train_median",
    "build_dataset",
    "categorical_labels",
    "load_table_dataset",
    "read_table",
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

    return encode


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/test row positions (each sorted): round(n * test_fraction) test rows, the rest train."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_test = math.floor(n * test_fraction + 0.5)
    if n_test < 1 or n_test > n - 1:
        raise DataError(
            f"test_fraction={test_fraction} with {n} rows leaves an empty train or test split; "
            "use more rows or a test_fraction nearer 0.5"
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


def _is_categorical(series: pd.Series) -> bool:
    return not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)


def _check_columns(frame: pd.DataFrame, names: Sequence[str], field: str) -> None:
    missing = [c for c in names if c not in frame.columns]
    if missing:
        raise DataError(f"{field}: column(s) {missing} not in the table; available columns: {list(frame.columns)}")


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
) -> TabularDataset:
    """Preprocess a clean table into a `TabularDataset` (see the module docstring for the steps).

    features: the feature columns (default: every column except the target and the sensitive ones).
    categorical: numeric columns to one-hot anyway (non-numeric and boolean columns are always one-hot).
    sort_key: a numeric column whose raw values become the Algorithm 3 sort key (it may also be a feature).
    label_encoder: how to turn the target column into class indices (default: `categorical_labels()`).
    missing: "error" (default) refuses a table with a missing value in a column it uses, naming the columns and
        counts; "drop" drops those rows first (only the used columns count), and refuses a table left empty.
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

    train_idx, test_idx = split_indices(len(frame), test_fraction, seed)
    labels, label_names = (label_encoder or categorical_labels())(frame[target], train_idx)
    groups, group_names = _encode_groups(frame, sensitive)
    cat = set(categorical) | {c for c in features if _is_categorical(frame[c])}
    x, feature_names = _encode_features(frame, features, cat, train_idx)

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


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a `.csv` (with a header row) or `.parquet` file; a clear error if it is missing or of another type."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'}; use a .csv (with a header row) or a .parquet file"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the path (relative paths start at {Path.cwd()})")
    try:
        if suffix == ".csv":
            # skipinitialspace: tolerate "a, b" style files such as UCI's.
            return pd.read_csv(path, skipinitialspace=True)
        return pd.read_parquet(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read it as {suffix[1:]}: {exc}") from exc


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
) -> TabularDataset:
    """The generic loader: any CSV/Parquet table with a categorical target and one or more sensitive columns.

    The Algorithm 3 sort key is the column named 'age' (any case) when there is one. `missing`: see `build_dataset`.
    """
    if not target:
        raise DataError(f"{path}: a file dataset needs target=COLUMN (--target) naming the label column")
    if not sensitive:
        raise DataError(
            f"{path}: a file dataset needs sensitive=[COLUMN, ...] (--sensitive) naming the protected attribute(s)"
        )
    frame = read_table(path)
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
