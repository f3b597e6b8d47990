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

A CSV file is read with the separator and encoding given (`--csv-sep`, `--csv-encoding`), else detected
(:func:`csv_format`): the separator among , ; tab | from the file's first lines, the encoding utf-8, or latin-1 when
the file is not valid UTF-8. :meth:`CsvFormat.note` says what was detected when it is not the default, and
:func:`mostly_numeric_columns` finds the numeric columns that one stray word turned into text (both reported by the
command line's checks, `client.data.preflight`).
"""

from __future__ import annotations

import codecs
import csv
import math
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

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
    "CSV_SEPARATORS",
    "MAX_LABELS",
    "MOSTLY_NUMERIC",
    "CsvFormat",
    "LabelEncoder",
    "MostlyNumeric",
    "above_train_median",
    "build_dataset",
    "categorical_labels",
    "csv_format",
    "load_table_dataset",
    "mostly_numeric_columns",
    "read_table",
    "read_table_with_format",
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


def _is_categorical(series: pd.Series) -> bool:
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
    cat = set(categorical) | {c for c in features if _is_categorical(frame[c])}
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


#: The separators detected in a CSV file when none is given (`--csv-sep`); the first wins a tie.
CSV_SEPARATORS = (",", ";", "\t", "|")
#: The encoding tried first when none is given (`--csv-encoding`), and the one read when the file is not valid in
#: it: latin-1 decodes every byte, so a file in another 8-bit encoding (cp1252, ...) reads with at most a few wrong
#: letters instead of failing.
DEFAULT_ENCODING = "utf-8"
FALLBACK_ENCODING = "latin-1"
#: What is read of a CSV file to detect its separator: its first bytes, at most its first lines.
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 50


def separator_name(sep: str) -> str:
    """A separator as `--csv-sep` takes it: 'tab' for a tab, else the character quoted for a shell (';' -> "';'")."""
    return "tab" if sep == "\t" else shlex.quote(sep)


@dataclass(frozen=True)
class CsvFormat:
    """How a CSV file is read: its separator and its encoding, each given (`--csv-sep`, `--csv-encoding`) or
    detected (:func:`csv_format`)."""

    sep: str
    encoding: str
    sep_detected: bool
    encoding_detected: bool

    def note(self, path: str | Path) -> str | None:
        """One line saying what was detected where it is not the default (',' and utf-8), and the flags that set it;
        None when the file reads as a comma-separated UTF-8 file or as the flags said."""
        found, flags = [], []
        if self.sep_detected and self.sep != ",":
            found.append(f"separator {separator_name(self.sep)}")
            flags.append(f"--csv-sep {separator_name(self.sep)}")
        if self.encoding_detected and self.encoding != DEFAULT_ENCODING:
            found.append(f"encoding {self.encoding} (the file is not valid UTF-8)")
            flags.append(f"--csv-encoding {self.encoding}")
        if not found:
            return None
        return f"{path}: read with the detected {' and '.join(found)}; {' '.join(flags)} sets it explicitly"


def _decodes(path: Path, encoding: str) -> bool:
    """Whether the whole file is valid text in `encoding` (read in 1 MiB chunks; nothing is kept)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def sniff_separator(text: str) -> str | None:
    """The separator of the CSV text `text` (its first lines) among :data:`CSV_SEPARATORS`, or None when none splits
    its header (a one-column table).

    A candidate that splits every sampled line into as many fields as the header (quotes respected) beats one that
    does not, then more fields win, then the earlier candidate: a comma-separated file whose text holds semicolons
    reads as commas, a semicolon-separated one with decimal commas ('1,5') as semicolons (its header has no comma).
    """
    lines = [line for line in text.splitlines() if line.strip()][:_SNIFF_LINES]
    best: tuple[tuple[bool, int], str] | None = None
    for sep in CSV_SEPARATORS if lines else ():
        rows = list(csv.reader(lines, delimiter=sep))
        width = len(rows[0])
        if width < 2:
            continue
        score = (all(len(row) == width for row in rows), width)
        if best is None or score > best[0]:
            best = (score, sep)
    return None if best is None else best[1]


def csv_format(path: str | Path, *, sep: str = "", encoding: str = "") -> CsvFormat:
    """How to read the CSV file `path`: `sep` and `encoding` where given, else detected. The encoding: utf-8 when
    the whole file is valid UTF-8 (a byte-order mark included), else latin-1. The separator: :func:`sniff_separator`
    on the file's first 64 KiB, ',' when it finds none. Raises DataError for an encoding Python does not know and
    OSError when the file cannot be read."""
    path = Path(path)
    if encoding:
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise DataError(
                f"--csv-encoding {encoding!r} is not an encoding Python knows; give e.g. utf-8, latin-1 or cp1252, "
                "or leave it empty to detect it"
            ) from None
    chosen = encoding or (DEFAULT_ENCODING if _decodes(path, DEFAULT_ENCODING) else FALLBACK_ENCODING)
    detected = ""
    if not sep:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
        if len(head) == _SNIFF_BYTES and b"\n" in head:  # the file goes on: drop its last, maybe cut, line
            head = head[: head.rindex(b"\n") + 1]
        detected = sniff_separator(head.decode(chosen, errors="replace")) or ","
    return CsvFormat(sep=sep or detected, encoding=chosen, sep_detected=not sep, encoding_detected=not encoding)


def read_table_with_format(
    path: str | Path, *, csv_sep: str = "", csv_encoding: str = ""
) -> tuple[pd.DataFrame, CsvFormat | None]:
    """Read a `.csv` (with a header row) or `.parquet` file, and say how a CSV file was read (None for Parquet).

    csv_sep / csv_encoding: the CSV file's separator and encoding (`--csv-sep`, `--csv-encoding`); "" detects them
    (:func:`csv_format`). Errors name the file and the flag that fixes them: FileNotFoundError when it is missing,
    DataError for another file type, an undecodable or unparsable file, or CSV options given for a Parquet file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'}; use a .csv (with a header row) or a .parquet file"
        )
    if suffix != ".csv" and (csv_sep or csv_encoding):
        raise DataError(f"{path}: --csv-sep and --csv-encoding apply to a .csv file, not to {suffix}: drop them")
    if path.is_dir():
        raise DataError(f"{path} is a folder; give a .csv or .parquet file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the path (relative paths start at {Path.cwd()})")
    if suffix == ".parquet":
        try:
            return pd.read_parquet(path), None
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: cannot read it as parquet: {exc}") from exc
    try:
        fmt = csv_format(path, sep=csv_sep, encoding=csv_encoding)
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    try:
        # skipinitialspace: tolerate "a, b" style files such as UCI's.
        frame = pd.read_csv(path, sep=fmt.sep, encoding=fmt.encoding, skipinitialspace=True)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not valid {exc.encoding} text ({exc.reason}); give the file's encoding with --csv-encoding "
            "(e.g. latin-1 or cp1252), or leave it empty to detect it"
        ) from exc
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"{path} is empty: it has no header row and no records") from exc
    except (pd.errors.ParserError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot read it as CSV with separator {separator_name(fmt.sep)} and encoding {fmt.encoding}: "
            f"{exc}; --csv-sep and --csv-encoding set them"
        ) from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    return frame, fmt


def read_table(path: str | Path, *, csv_sep: str = "", csv_encoding: str = "") -> pd.DataFrame:
    """Read a `.csv` (with a header row) or `.parquet` file: :func:`read_table_with_format` without the format."""
    return read_table_with_format(path, csv_sep=csv_sep, csv_encoding=csv_encoding)[0]


#: A text column whose non-missing values are numbers at least this often is reported as numeric-looking.
MOSTLY_NUMERIC = 0.9
#: A decimal number as a CSV file writes one, and one written with a decimal comma ('1,5').
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_DECIMAL_COMMA_NUMBER = r"[+-]?\d+(?:,\d+)?"


@dataclass(frozen=True)
class MostlyNumeric:
    """A column read as text (so one-hot encoded, one feature per distinct value) whose values are mostly numbers:
    `numbers` of its `values` non-missing values parse as numbers (`share`); of the `not_numbers` distinct values
    that do not, the most frequent first in `offending` (at most 5); `distinct` values in all; `decimal_comma` when
    they parse only with ',' read as the decimal point."""

    column: str
    values: int
    numbers: int
    offending: tuple[str, ...]
    not_numbers: int
    distinct: int
    decimal_comma: bool = False

    @property
    def share(self) -> float:
        return self.numbers / self.values

    @property
    def records(self) -> int:
        """Records whose value is not a number."""
        return self.values - self.numbers


def mostly_numeric_columns(
    frame: pd.DataFrame, columns: Sequence[str], threshold: float = MOSTLY_NUMERIC
) -> list[MostlyNumeric]:
    """The text columns among `columns` whose values are numbers in at least `threshold` of the records: one stray
    word ('?', 'unknown') in a numeric column makes pandas read the whole column as text, and the preprocessing then
    one-hot encodes it (a feature per distinct value) instead of z-scoring it, silently.

    A number is a decimal literal (sign, digits, a point, an exponent), matched on each distinct value once, so a
    column costs one count of its values (Adult's 45,222 records: ~10 ms a column)."""
    out: list[MostlyNumeric] = []
    for column in columns:
        series = frame[column]
        if not _is_categorical(series) or pd.api.types.is_bool_dtype(series):
            continue
        counts = series.dropna().astype(str).str.strip().value_counts()
        total = int(counts.sum())
        if not total:
            continue
        distinct = counts.index.to_series().astype(str)
        comma = False
        numeric = distinct.str.fullmatch(_NUMBER).to_numpy(dtype=bool)
        if counts[numeric].sum() < threshold * total:
            numeric = distinct.str.fullmatch(_DECIMAL_COMMA_NUMBER).to_numpy(dtype=bool)
            comma = True
        numbers = int(counts[numeric].sum())
        if numbers < threshold * total:
            continue
        bad = counts[~numeric]
        out.append(
            MostlyNumeric(
                column=str(column),
                values=total,
                numbers=numbers,
                offending=tuple(str(v) for v in bad.index[:5]),
                not_numbers=len(bad),
                distinct=int(series.nunique()),
                decimal_comma=comma,
            )
        )
    return out


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
