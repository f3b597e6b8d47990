"""Preprocessing as data: how a raw table row becomes the model's input, its label and its sensitive group.

`client.data.generic.build_dataset` encodes a table (categorical feature columns one-hot over the whole table's
vocabulary, continuous ones z-scored with the TRAINING split's mean and standard deviation, the target mapped to class
indices, the sensitive columns combined into one joint group) and records what it did as a :class:`Preprocessing`
(`client.data.generic.recording_preprocessing`). This module holds that record and applies it to new rows:
:meth:`Preprocessing.encode` reproduces the training encoding bit for bit on the training table (tested), so a model
trained by silofl can be used on raw records (`silofl predict | evaluate`, :mod:`server.trained_model`).

Why plain data and not a pickled encoder: the record is read by the CLI and the server side (a run's model artifact,
`server.model_artifact`) without importing silo code, it is reviewable JSON (`to_json` / `from_json`, never pickle),
and the same file serves simulation (written by `silofl run`) and deployment (written by `silofl data split` next to
the silo folders, for `silofl model pack`).

A built-in dataset's reader recodes its file before the encoder sees it (credit's SEX 1/2 read as Male/Female, its
undocumented EDUCATION codes merged, ...): that is data too, a :class:`Recoding` (columns dropped, per column a value
map) that the reader applies (`client.data.loaders`) and the record carries (`recoding`), so `encode` takes a raw row
of the original file as well as a row the reader cleaned: applied to rows already recoded, a recoding changes
nothing. A file dataset (CSV/Parquet) has none: its record is the one written before recodings existed.

Privacy: the vocabularies and the z-score statistics are computed from the records, with no noise. They are NOT
differentially private and are never sent to the server: whoever holds a preprocessing file learns every category
present in the table (a category held by one record included) and the training split's means and standard deviations.

Decisions when encoding new rows (each refusal is a :class:`PreprocessingError` naming the column and the fix):

* a missing column, a missing value (NaN/None) in a used column, a non-numeric or non-finite value in a continuous
  column: refused (silofl never imputes; the training data had none either);
* an unseen category of a feature column: refused by default (``unseen="error"``): the model never saw the input such
  a row would get, so a silent prediction could be anything. ``unseen="zeros"`` encodes it as an all-zeros one-hot
  block (the row gets no weight from that column) and warns, naming the column, the values and the number of rows;
* an unseen label value or sensitive category: always refused (a metric over a label or a group the run does not know
  is undefined);
* values are matched to the recorded categories by value first (``2 == 2.0``), then by their text form (a category
  ``3`` recorded from an integer column matches a ``"3"`` read as text), so a file whose column pandas reads with
  another type still encodes; the text form is the one used in feature names (``2.0`` reads ``2``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "CategoricalFeature",
    "ContinuousFeature",
    "EncodedFrame",
    "FeatureColumn",
    "LabelMapping",
    "Preprocessing",
    "PreprocessingError",
    "Recoding",
    "SensitiveColumn",
    "ValueMap",
    "category_text",
    "group_vocabulary",
    "joint_group_names",
    "sorted_categories",
]

FORMAT = "silofl-preprocessing"
#: The version of a record without a recoding (a file dataset's): what silofl wrote before recodings, read by any.
FORMAT_VERSION = 1
#: The version of a record with one (a built-in's): an older silofl, which would ignore the recoding and encode raw
#: rows wrongly, refuses it by its version instead.
RECODING_FORMAT_VERSION = 2

#: A category value as JSON keeps it: text, an integer, a float or a boolean.
Scalar = str | int | float | bool

#: What to do with a feature category the training table did not have.
Unseen = Literal["error", "zeros"]


class PreprocessingError(ValueError):
    """A table that cannot be encoded as the training data was, or a malformed preprocessing record; the message
    names the column (or the field) and the fix."""


def category_text(value: object) -> str:
    """A category value as text, as feature and group names show it: integral floats lose their '.0' (2.0 reads 2).

    The same rule as `client.data.generic._fmt`, so names built here equal those of the training data."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def sorted_categories(values: Sequence[object]) -> list[object]:
    """Categories in the order the encoder one-hots them: natural order (numbers numerically), else by text."""
    try:
        return sorted(values)  # type: ignore[type-var]
    except TypeError:
        return sorted(values, key=str)


def _scalar(value: object, where: str) -> Scalar:
    """A category value as a plain JSON scalar (numpy scalars unwrapped); anything else is refused."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PreprocessingError(f"{where}: category {value!r} is not finite and cannot be recorded as JSON")
        return value
    raise PreprocessingError(
        f"{where}: category {value!r} of type {type(value).__name__} cannot be recorded (text, integers, floats and "
        "booleans can); convert the column to text before loading the table"
    )


def _scalars(values: Sequence[object], where: str) -> tuple[Scalar, ...]:
    out = tuple(_scalar(v, where) for v in values)
    if len(out) < 1:
        raise PreprocessingError(f"{where}: no categories")
    if len(set(map(_key, out))) != len(out):
        raise PreprocessingError(f"{where}: duplicate categories in {list(out)}")
    return out


def _key(value: Scalar) -> tuple[str, Scalar]:
    """A hashable identity that keeps True, 1 and 1.0 apart (they hash alike in Python)."""
    return (type(value).__name__ if isinstance(value, bool | str) else "number", value)


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise PreprocessingError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _finite(value: object, where: str) -> float:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PreprocessingError(f"{where} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CategoricalFeature:
    """A feature column one-hot encoded: one 0/1 input per category, in `categories` order (the whole table's
    distinct values, sorted)."""

    column: str
    categories: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        _string(self.column, "categorical feature column")
        object.__setattr__(self, "categories", _scalars(self.categories, f"feature column {self.column!r}"))

    @property
    def names(self) -> tuple[str, ...]:
        """The model inputs of this column: ``column=value``."""
        return tuple(f"{self.column}={category_text(v)}" for v in self.categories)

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "kind": "categorical", "categories": list(self.categories)}


@dataclass(frozen=True)
class ContinuousFeature:
    """A feature column z-scored: ``(x - mean) / std`` in float64, then float32; `mean` and `std` (population, ddof 0)
    are the training split's. A column constant on the training rows (std 0) is divided by 1 instead."""

    column: str
    mean: float
    std: float

    def __post_init__(self) -> None:
        _string(self.column, "continuous feature column")
        object.__setattr__(self, "mean", _finite(self.mean, f"feature column {self.column!r}: mean"))
        std = _finite(self.std, f"feature column {self.column!r}: std")
        if std < 0:
            raise PreprocessingError(f"feature column {self.column!r}: std must be >= 0, got {std}")
        object.__setattr__(self, "std", std)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.column,)

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "kind": "continuous", "mean": self.mean, "std": self.std}


FeatureColumn = CategoricalFeature | ContinuousFeature


@dataclass(frozen=True)
class LabelMapping:
    """How the target column became class indices.

    kind ``classes``: label ``k`` is the raw value ``classes[k]``. kind ``above_threshold``: two labels, 1 where the
    numeric value is ``> threshold`` (e.g. Parkinsons' training median), else 0. kind ``custom``: a label encoder
    silofl cannot describe (a caller's own function); such labels cannot be re-encoded, so `evaluate` refuses.
    `names`: the label names, in index order.
    """

    column: str
    names: tuple[str, ...]
    kind: Literal["classes", "above_threshold", "custom"]
    classes: tuple[Scalar, ...] | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        _string(self.column, "target column")
        names = tuple(self.names)
        if len(names) < 2 or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise PreprocessingError(f"target {self.column!r}: label names must be 2 or more distinct strings: {names}")
        object.__setattr__(self, "names", names)
        if self.kind == "classes":
            if self.classes is None or self.threshold is not None:
                raise PreprocessingError(f"target {self.column!r}: kind 'classes' needs classes and no threshold")
            classes = _scalars(self.classes, f"target column {self.column!r}")
            if len(classes) != len(names):
                raise PreprocessingError(
                    f"target {self.column!r}: {len(classes)} classes for {len(names)} label names {list(names)}"
                )
            object.__setattr__(self, "classes", classes)
        elif self.kind == "above_threshold":
            if self.threshold is None or self.classes is not None or len(names) != 2:
                raise PreprocessingError(
                    f"target {self.column!r}: kind 'above_threshold' needs a threshold, two label names and no classes"
                )
            object.__setattr__(self, "threshold", _finite(self.threshold, f"target {self.column!r}: threshold"))
        elif self.kind == "custom":
            if self.classes is not None or self.threshold is not None:
                raise PreprocessingError(f"target {self.column!r}: kind 'custom' records no classes or threshold")
        else:
            raise PreprocessingError(
                f"target {self.column!r}: kind must be classes, above_threshold or custom, got {self.kind!r}"
            )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"column": self.column, "kind": self.kind, "names": list(self.names)}
        if self.classes is not None:
            out["classes"] = list(self.classes)
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class SensitiveColumn:
    """A sensitive column and its categories (sorted distinct values of the whole table); several columns form one
    joint group over the Cartesian product, the first column varying slowest."""

    column: str
    categories: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        _string(self.column, "sensitive column")
        object.__setattr__(self, "categories", _scalars(self.categories, f"sensitive column {self.column!r}"))

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "categories": list(self.categories)}


class EncodedFrame(NamedTuple):
    """A table encoded for the model: features float32 ``(n, d)``; labels int64 ``(n,)`` (None without the target
    column); groups int64 ``(n,)``, the joint sensitive group (None without the sensitive columns)."""

    features: np.ndarray
    labels: np.ndarray | None
    groups: np.ndarray | None


def group_vocabulary(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[SensitiveColumn, ...]:
    """Sensitive columns with the categories found in `frame` (sorted as the training encoder sorts them): for
    grouping a table by columns the run did not treat as sensitive (`silofl evaluate --sensitive COL`)."""
    _require(frame, columns, "sensitive")
    out = []
    for column in columns:
        _refuse_missing(frame[column], column, "sensitive")
        out.append(SensitiveColumn(column, tuple(sorted_categories(list(pd.unique(frame[column]))))))
    return tuple(out)


def _require(frame: pd.DataFrame, columns: Sequence[str], role: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise PreprocessingError(f"expected a pandas DataFrame of raw records, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        fix = (
            "the rows are grouped by them: add them, or group by other columns (silofl evaluate --sensitive COL)"
            if role == "sensitive"
            else "the model was trained with them: add them to the file, with the same names"
        )
        raise PreprocessingError(
            f"{role} column(s) {missing} missing from the table (it has {list(frame.columns)}); {fix}"
        )


def _refuse_missing(series: pd.Series, column: str, role: str) -> None:
    missing = series.isna().to_numpy()
    if missing.any():
        rows = np.flatnonzero(missing)
        raise PreprocessingError(
            f"{role} column {column!r} has {rows.size} missing value(s) (first at row {rows[0]}); silofl does not "
            "impute: drop or fill those rows first"
        )


def _codes(series: pd.Series, categories: tuple[Scalar, ...]) -> np.ndarray:
    """Index of each value in `categories` (-1: unseen), by value, then by text form for what remains."""
    # An object index matches by Python equality and hash (2 == 2.0 == np.int64(2)), each value to its position: the
    # codes of the encoder's pd.Categorical for the values it knows, -1 for the others.
    known = pd.Index(list(categories), dtype=object)
    codes = known.get_indexer(pd.Index(series.to_numpy(dtype=object), dtype=object)).astype(np.int64)
    unseen = codes < 0
    if unseen.any():
        by_text: dict[str, int] = {}
        for position, category in enumerate(categories):
            by_text.setdefault(category_text(category), position)
        if len(by_text) == len(categories):  # only when the text forms are unambiguous
            values = series.to_numpy()
            for row in np.flatnonzero(unseen):
                codes[row] = by_text.get(category_text(values[row]), -1)
    return codes


def _unseen_values(series: pd.Series, codes: np.ndarray) -> tuple[list[str], int]:
    """The first few distinct unmatched values (as text) and the number of rows holding one."""
    rows = np.flatnonzero(codes < 0)
    values = sorted({category_text(v) for v in series.to_numpy()[rows]})
    return values[:5], int(rows.size)


@dataclass(frozen=True)
class ValueMap:
    """A column's values recoded by a dataset's reader: each ``(raw, clean)`` pair of `values` reads `raw` as
    `clean`; `others` says what becomes of a value that is no `raw`: ``keep`` it (credit's EDUCATION 1..4 stay) or
    ``error`` (credit's SEX must be 1 or 2). A value that is already a `clean` one is kept either way, and a `clean`
    value may not be the `raw` of another pair, so applying the map twice is applying it once. Values match as the
    encoder matches categories: by value, then by text (``"1"`` is 1); a missing value stays missing."""

    column: str
    values: tuple[tuple[Scalar, Scalar], ...]
    others: Literal["keep", "error"] = "keep"

    def __post_init__(self) -> None:
        _string(self.column, "recoded column")
        where = f"recoding of column {self.column!r}"
        try:
            pairs = tuple((_scalar(raw, where), _scalar(clean, where)) for raw, clean in self.values)
        except (TypeError, ValueError) as exc:
            raise PreprocessingError(f"{where}: values must be [raw, clean] pairs of scalars ({exc})") from None
        raws = _scalars([raw for raw, _ in pairs], where)
        for raw, clean in pairs:
            position = _codes(pd.Series([clean], dtype=object), raws)[0]
            if position >= 0 and pairs[position][1] != clean:
                raise PreprocessingError(
                    f"{where}: {raw!r} becomes {clean!r}, which the map itself reads as {pairs[position][1]!r}; a "
                    "recoding applied twice must give what it gives once"
                )
        if self.others not in ("keep", "error"):
            raise PreprocessingError(f"{where}: others must be 'keep' or 'error', got {self.others!r}")
        object.__setattr__(self, "values", pairs)

    def apply(self, series: pd.Series) -> pd.Series:
        """The column recoded (the same object when no value changes). Raises PreprocessingError for a value the map
        does not know when `others` is ``error``, naming the column, the values and the map.

        Matched once per distinct value (a reader's column holds a few codes over many rows), and rebuilt from the
        distinct values, so the column gets the type pandas gives those values (int64 codes stay int64, names text)."""
        inverse, distinct = pd.factorize(series, use_na_sentinel=True)  # a missing value: -1, and stays missing
        values = pd.Series(np.asarray(distinct, dtype=object), dtype=object)
        codes = _codes(values, tuple(raw for raw, _ in self.values))
        if self.others == "error":
            unknown = np.flatnonzero((codes < 0) & (_codes(values, tuple(c for _, c in self.values)) < 0))
            if unknown.size:
                reads = ", ".join(f"{category_text(r)} as {c!r}" for r, c in self.values)
                raise PreprocessingError(
                    f"column {self.column!r} has {int(np.isin(inverse, unknown).sum())} row(s) with values "
                    f"{sorted(category_text(v) for v in values[unknown])[:5]} that the dataset's reader does not know: "
                    f"it reads {reads}; fix or drop those rows"
                )
        if not (codes >= 0).any():
            return series
        cleans = [clean for _, clean in self.values]
        recoded = pd.Index([cleans[k] if k >= 0 else v for k, v in zip(codes, values, strict=True)])
        out = recoded.take(inverse, allow_fill=True, fill_value=np.nan)
        return pd.Series(out, index=series.index, name=series.name)

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "values": [list(pair) for pair in self.values], "others": self.others}


@dataclass(frozen=True)
class Recoding:
    """What a built-in dataset's reader does to its file's rows before the encoder sees them, as data: the columns it
    `drop`s and the `values` it recodes, column by column (:class:`ValueMap`). The reader applies it
    (`client.data.loaders`) and the preprocessing record carries it, so new raw rows are recoded the same way; see the
    module docstring. Empty (the default) for a file dataset."""

    drop: tuple[str, ...] = ()
    values: tuple[ValueMap, ...] = ()

    def __post_init__(self) -> None:
        drop = tuple(_string(c, "dropped column") for c in self.drop)
        values = tuple(self.values)
        if not all(isinstance(v, ValueMap) for v in values):
            raise PreprocessingError("recoding: values must be ValueMap records")
        columns = [v.column for v in values]
        clash = sorted({c for c in columns if columns.count(c) > 1 or c in drop})
        if clash:
            raise PreprocessingError(f"recoding: columns {clash} are recoded twice, or recoded and dropped")
        object.__setattr__(self, "drop", drop)
        object.__setattr__(self, "values", values)

    def __bool__(self) -> bool:
        return bool(self.drop or self.values)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns it drops or recodes."""
        return (*self.drop, *(v.column for v in self.values))

    def apply(self, frame: pd.DataFrame, *, drop: bool = True) -> pd.DataFrame:
        """A new frame: `frame` with each mapped column recoded and, with `drop` (the reader's way), the dropped
        columns removed (`frame` itself when the recoding is empty). A column the frame lacks is left to the encoder's
        own check, which names the columns a model needs."""
        if not self:
            return frame
        out = frame.drop(columns=[c for c in self.drop if drop and c in frame.columns])
        for value_map in self.values:
            if value_map.column in out.columns:
                out[value_map.column] = value_map.apply(out[value_map.column])
        return out

    def to_json(self) -> dict[str, Any]:
        return {"drop": list(self.drop), "values": [v.to_json() for v in self.values]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recoding:
        """Read a `to_json` document (a PreprocessingError names a malformed field)."""
        try:
            values = tuple(
                ValueMap(v["column"], tuple(tuple(pair) for pair in v["values"]), v.get("others", "keep"))
                for v in data["values"]
            )
            return cls(drop=tuple(data["drop"]), values=values)
        except (KeyError, TypeError, AttributeError) as exc:
            raise PreprocessingError(f"malformed recoding: missing or wrong field ({exc!r})") from exc


@dataclass(frozen=True)
class Preprocessing:
    """Everything needed to encode a raw record exactly as the training data was (see the module docstring).

    dataset: the dataset's name (a built-in's, or a file's stem). features: each feature column in input order.
    target: the label mapping. sensitive: the sensitive columns, in joint-group order. recoding: what a built-in
    dataset's reader did to its file's rows before encoding them (empty for a file dataset).

    The table this applies to is the file as silofl reads it: a CSV/Parquet dataset's as read
    (`client.data.generic.read_table`), a built-in's original file (its `recoding` applied first: credit's SEX 1/2
    read as Male/Female, ...) or the table its reader cleaned (`client.data.loaders`; recoding it again changes
    nothing). docs/MODEL.md lists what each reader does.
    """

    dataset: str
    features: tuple[FeatureColumn, ...]
    target: LabelMapping
    sensitive: tuple[SensitiveColumn, ...]
    recoding: Recoding = Recoding()

    def __post_init__(self) -> None:
        _string(self.dataset, "dataset")
        features = tuple(self.features)
        if not features or not all(isinstance(f, CategoricalFeature | ContinuousFeature) for f in features):
            raise PreprocessingError("features must be one or more CategoricalFeature / ContinuousFeature records")
        sensitive = tuple(self.sensitive)
        if not sensitive or not all(isinstance(s, SensitiveColumn) for s in sensitive):
            raise PreprocessingError("sensitive must be one or more SensitiveColumn records")
        if not isinstance(self.target, LabelMapping):
            raise PreprocessingError(f"target must be a LabelMapping, got {type(self.target).__name__}")
        columns = [f.column for f in features] + [self.target.column] + [s.column for s in sensitive]
        if len(set(columns)) != len(columns):
            dupes = sorted({c for c in columns if columns.count(c) > 1})
            raise PreprocessingError(f"columns {dupes} appear twice among the features, the target and sensitive")
        if not isinstance(self.recoding, Recoding):
            raise PreprocessingError(f"recoding must be a Recoding, got {type(self.recoding).__name__}")
        dropped = sorted(set(self.recoding.drop) & set(columns))
        if dropped:
            raise PreprocessingError(f"recoding: columns {dropped} are dropped by the reader but used by the model")
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "sensitive", sensitive)

    # --- names -------------------------------------------------------------------------------------------------

    @property
    def feature_columns(self) -> tuple[str, ...]:
        """The raw columns the features are made from, in order."""
        return tuple(f.column for f in self.features)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """One name per model input (``column=value`` for a one-hot input): the dataset's `feature_names`."""
        return tuple(name for f in self.features for name in f.names)

    @property
    def num_features(self) -> int:
        return sum(len(f.names) for f in self.features)

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.target.names

    @property
    def sensitive_columns(self) -> tuple[str, ...]:
        return tuple(s.column for s in self.sensitive)

    @property
    def group_names(self) -> tuple[str, ...]:
        """The joint groups' names, ``value1|value2`` (first column slowest): the dataset's `group_names`."""
        return joint_group_names(self.sensitive)

    # --- JSON ----------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON document (`json.dumps` takes it as is; `from_json` reads it back equal)."""
        recoding = {"recoding": self.recoding.to_json()} if self.recoding else {}
        return {
            "format": FORMAT,
            "format_version": RECODING_FORMAT_VERSION if self.recoding else FORMAT_VERSION,
            "dataset": self.dataset,
            **recoding,
            "features": [f.to_json() for f in self.features],
            "target": self.target.to_json(),
            "sensitive": [s.to_json() for s in self.sensitive],
            "feature_names": list(self.feature_names),
            "group_names": list(self.group_names),
            "privacy": "not differentially private: the categories and z-score statistics are computed from the "
            "records without noise; keep this file with the data and share it only with those who may see them",
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preprocessing:
        """Read a `to_json` document, checking every field (a `PreprocessingError` names the first bad one)."""
        if not isinstance(data, Mapping):
            raise PreprocessingError(f"a preprocessing record must be a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise PreprocessingError(
                f"not a silofl preprocessing record (format {data.get('format')!r}, want {FORMAT!r})"
            )
        if data.get("format_version") not in (FORMAT_VERSION, RECODING_FORMAT_VERSION):
            raise PreprocessingError(
                f"preprocessing format_version {data.get('format_version')!r} is not {FORMAT_VERSION} or "
                f"{RECODING_FORMAT_VERSION}; it was written by another silofl version: write it again with this one"
            )
        try:
            features: list[FeatureColumn] = []
            for entry in data["features"]:
                if entry.get("kind") == "categorical":
                    features.append(CategoricalFeature(entry["column"], tuple(entry["categories"])))
                elif entry.get("kind") == "continuous":
                    features.append(ContinuousFeature(entry["column"], entry["mean"], entry["std"]))
                else:
                    raise PreprocessingError(f"feature {entry.get('column')!r}: unknown kind {entry.get('kind')!r}")
            target = data["target"]
            mapping = LabelMapping(
                column=target["column"],
                names=tuple(target["names"]),
                kind=target["kind"],
                classes=tuple(target["classes"]) if "classes" in target else None,
                threshold=target.get("threshold"),
            )
            sensitive = tuple(SensitiveColumn(s["column"], tuple(s["categories"])) for s in data["sensitive"])
            recoding = Recoding.from_json(data["recoding"]) if "recoding" in data else Recoding()
            out = cls(
                dataset=data["dataset"],
                features=tuple(features),
                target=mapping,
                sensitive=sensitive,
                recoding=recoding,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise PreprocessingError(f"malformed preprocessing record: missing or wrong field ({exc!r})") from exc
        for field in ("feature_names", "group_names"):
            if field in data and list(data[field]) != list(getattr(out, field)):
                raise PreprocessingError(f"preprocessing record: {field} does not follow from its columns")
        return out

    def save(self, path: str | Path) -> Path:
        """Write the JSON document to `path` (atomically: a temporary file renamed)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Preprocessing:
        """Read a file written by :meth:`save` (a clear error for a missing or malformed file)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no such preprocessing file; `silofl data split` writes it as DIR/preprocessing.json"
            )
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PreprocessingError(f"{path}: not a JSON file ({exc})") from exc
        try:
            return cls.from_json(data)
        except PreprocessingError as exc:
            raise PreprocessingError(f"{path}: {exc}") from exc

    # --- encoding ------------------------------------------------------------------------------------------------

    def recode(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame`'s values as the dataset's reader would have passed them to the encoder: the `recoding`'s value
        maps applied (a no-op for rows the reader already recoded, and for a file dataset); the columns it drops are
        kept (the model ignores them; `silofl evaluate --sensitive ID` may still group by one). The encoding methods
        recode each column they read themselves; this is for reading other columns as the reader would."""
        return self.recoding.apply(frame, drop=False)

    def _column(self, frame: pd.DataFrame, column: str) -> pd.Series:
        """A column of raw rows as the encoder reads it: recoded by the reader's map of that column, if any."""
        value_map = next((v for v in self.recoding.values if v.column == column), None)
        return frame[column] if value_map is None else value_map.apply(frame[column])

    def encode(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> EncodedFrame:
        """Encode raw rows: features always; labels when the target column is there; groups when every sensitive
        column is there. Extra columns are ignored. `unseen`: see the module docstring."""
        features = self.encode_features(frame, unseen=unseen)
        labels = self.encode_labels(frame) if self.target.column in frame.columns else None
        has_groups = all(c in frame.columns for c in self.sensitive_columns)
        groups = self.encode_groups(frame) if has_groups else None
        return EncodedFrame(features, labels, groups)

    def encode_features(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> np.ndarray:
        """The model input, float32 ``(n, num_features)``, C-contiguous: the training encoding, bit for bit."""
        if unseen not in ("error", "zeros"):
            raise PreprocessingError(f"unseen must be 'error' or 'zeros', got {unseen!r}")
        _require(frame, self.feature_columns, "feature")
        n = len(frame)
        blocks: list[np.ndarray] = []
        for feature in self.features:
            series = self._column(frame, feature.column)
            _refuse_missing(series, feature.column, "feature")
            if isinstance(feature, CategoricalFeature):
                blocks.append(self._one_hot(series, feature, n, unseen))
            else:
                x = _numeric(series, feature.column)
                scale = feature.std if feature.std > 0 else 1.0  # as the encoder: a constant column maps to 0
                blocks.append(((x - feature.mean) / scale).astype(np.float32)[:, None])
        if not blocks:
            return np.zeros((n, 0), dtype=np.float32)
        return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32)

    @staticmethod
    def _one_hot(series: pd.Series, feature: CategoricalFeature, n: int, unseen: Unseen) -> np.ndarray:
        codes = _codes(series, feature.categories)
        block = np.zeros((n, len(feature.categories)), dtype=np.float32)
        seen = codes >= 0
        if not seen.all():
            values, count = _unseen_values(series, codes)
            known = [category_text(c) for c in feature.categories]
            if unseen == "error":
                raise PreprocessingError(
                    f"feature column {feature.column!r} has {count} row(s) with categories the training data did not "
                    f"have: {values} (known: {known[:20]}{' ...' if len(known) > 20 else ''}); map them to a known "
                    "category, drop those rows, or encode them as all-zeros with unseen='zeros' (--unseen zeros)"
                )
            warnings.warn(
                f"feature column {feature.column!r}: {count} row(s) with unseen categories {values} encoded as "
                "all-zeros one-hot (the model never saw such an input; their predictions are extrapolations)",
                stacklevel=4,
            )
        rows = np.flatnonzero(seen)
        block[rows, codes[rows]] = 1.0
        return block

    def encode_labels(self, frame: pd.DataFrame) -> np.ndarray:
        """The target column as class indices, int64 ``(n,)``."""
        mapping = self.target
        _require(frame, [mapping.column], "target")
        series = self._column(frame, mapping.column)
        _refuse_missing(series, mapping.column, "target")
        if mapping.kind == "custom":
            raise PreprocessingError(
                f"target column {mapping.column!r} was encoded by a custom label encoder that silofl could not record; "
                "encode the labels yourself (label indices of label_names) and call the model's metrics on them"
            )
        if mapping.kind == "above_threshold":
            assert mapping.threshold is not None
            return (_numeric(series, mapping.column, role="target") > mapping.threshold).astype(np.int64)
        assert mapping.classes is not None
        codes = _codes(series, mapping.classes)
        if (codes < 0).any():
            values, count = _unseen_values(series, codes)
            raise PreprocessingError(
                f"target column {mapping.column!r} has {count} row(s) with values {values} outside the run's labels "
                f"{[category_text(c) for c in mapping.classes]}; drop those rows or map them to a known label"
            )
        return codes

    def encode_groups(self, frame: pd.DataFrame, sensitive: Sequence[SensitiveColumn] | None = None) -> np.ndarray:
        """The joint sensitive group of each row, int64 ``(n,)`` (index into `group_names`; with `sensitive` given,
        into `joint_group_names(sensitive)`)."""
        columns = tuple(self.sensitive if sensitive is None else sensitive)
        _require(frame, [s.column for s in columns], "sensitive")
        codes = np.zeros(len(frame), dtype=np.int64)
        for entry in columns:
            series = self._column(frame, entry.column)
            _refuse_missing(series, entry.column, "sensitive")
            col = _codes(series, entry.categories)
            if (col < 0).any():
                values, count = _unseen_values(series, col)
                raise PreprocessingError(
                    f"sensitive column {entry.column!r} has {count} row(s) with values {values} outside the run's "
                    f"groups {[category_text(c) for c in entry.categories]}; drop those rows, or group the rows by "
                    f"the file's own values (silofl evaluate --sensitive {entry.column})"
                )
            codes = codes * len(entry.categories) + col
        return codes


def joint_group_names(columns: Sequence[SensitiveColumn]) -> tuple[str, ...]:
    """The joint groups' names over `columns`' categories, ``value1|value2``, the first column varying slowest."""
    names: list[str] = [""]
    for entry in columns:
        names = [f"{p}|{category_text(v)}" if p else category_text(v) for p in names for v in entry.categories]
    return tuple(names)


def _numeric(series: pd.Series, column: str, *, role: str = "continuous feature") -> np.ndarray:
    """A column as float64; refuses text that is not a number and non-finite values, naming rows."""
    if pd.api.types.is_bool_dtype(series):
        raise PreprocessingError(
            f"{role} column {column!r} holds booleans but the model reads it as a number; write it as numbers"
        )
    if pd.api.types.is_numeric_dtype(series):
        values = series.to_numpy(dtype=np.float64)
    else:
        converted = pd.to_numeric(series, errors="coerce")
        bad = converted.isna().to_numpy() & series.notna().to_numpy()
        if bad.any():
            rows = np.flatnonzero(bad)
            examples = sorted({str(v) for v in series.to_numpy()[rows]})[:5]
            raise PreprocessingError(
                f"{role} column {column!r} has {rows.size} non-numeric value(s) {examples} (first at row {rows[0]}); "
                "the model z-scores it as a number: fix or drop those rows"
            )
        values = converted.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        rows = np.flatnonzero(~np.isfinite(values))
        raise PreprocessingError(
            f"{role} column {column!r} has {rows.size} infinite value(s) (first at row {rows[0]}); fix or drop them"
        )
    return values
