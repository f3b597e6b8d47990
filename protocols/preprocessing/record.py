"""The preprocessing record, :class:`Preprocessing`: its columns, its JSON document (`to_json` / `from_json`, a file
with `save` / `load`; :data:`FORMAT`, :data:`FORMAT_VERSION`) and the encoding of raw rows (`encode`, bit for bit the
training encoding, into an :class:`EncodedFrame`; an unseen feature category as :data:`Unseen` says). The decisions
it takes on new rows are listed in the package's docstring (`protocols.preprocessing`)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from silofl.protocols.preprocessing.columns import (
    CategoricalFeature,
    ContinuousFeature,
    FeatureColumn,
    LabelMapping,
    SensitiveColumn,
    joint_group_names,
)
from silofl.protocols.preprocessing.recoding import Recoding
from silofl.protocols.preprocessing.table import (
    category_codes,
    numeric_values,
    refuse_missing,
    require_columns,
    unseen_values,
)
from silofl.protocols.preprocessing.values import PreprocessingError, category_text, check_string

__all__ = ["FORMAT", "FORMAT_VERSION", "RECODING_FORMAT_VERSION", "EncodedFrame", "Preprocessing", "Unseen"]

FORMAT = "silofl-preprocessing"
#: The version of a record without a recoding (a file dataset's): what silofl wrote before recodings, read by any.
FORMAT_VERSION = 1
#: The version of a record with one (a built-in's): an older silofl, which would ignore the recoding and encode raw
#: rows wrongly, refuses it by its version instead.
RECODING_FORMAT_VERSION = 2

#: What to do with a feature category the training table did not have.
Unseen = Literal["error", "zeros"]


class EncodedFrame(NamedTuple):
    """A table encoded for the model: features float32 ``(n, d)``; labels int64 ``(n,)`` (None without the target
    column); groups int64 ``(n,)``, the joint sensitive group (None without the sensitive columns)."""

    features: np.ndarray
    labels: np.ndarray | None
    groups: np.ndarray | None


@dataclass(frozen=True)
class Preprocessing:
    """Everything needed to encode a raw record exactly as the training data was (see the package's
    docstring).

    dataset: the dataset's name (a built-in's, or a file's stem). features: each feature column in input order.
    target: the label mapping. sensitive: the sensitive columns, in joint-group order. recoding: what a built-in
    dataset's reader did to its file's rows before encoding them (empty for a file dataset).

    The table this applies to is the file as silofl reads it: a CSV/Parquet dataset's as read
    (`client.data.table_files.read_table`), a built-in's original file (its `recoding` applied first: credit's SEX 1/2
    read as Male/Female, ...) or the table its reader cleaned (`client.data.loaders`; recoding it again changes
    nothing). docs/MODEL.md lists what each reader does.
    """

    dataset: str
    features: tuple[FeatureColumn, ...]
    target: LabelMapping
    sensitive: tuple[SensitiveColumn, ...]
    recoding: Recoding = Recoding()  # noqa: RUF009 (a frozen dataclass: one shared empty default is safe)

    def __post_init__(self) -> None:
        check_string(self.dataset, "dataset")
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
        column is there. Extra columns are ignored. `unseen`: see the package's docstring."""
        features = self.encode_features(frame, unseen=unseen)
        labels = self.encode_labels(frame) if self.target.column in frame.columns else None
        has_groups = all(c in frame.columns for c in self.sensitive_columns)
        groups = self.encode_groups(frame) if has_groups else None
        return EncodedFrame(features, labels, groups)

    def encode_features(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> np.ndarray:
        """The model input, float32 ``(n, num_features)``, C-contiguous: the training encoding, bit for bit."""
        if unseen not in ("error", "zeros"):
            raise PreprocessingError(f"unseen must be 'error' or 'zeros', got {unseen!r}")
        require_columns(frame, self.feature_columns, "feature")
        n = len(frame)
        blocks: list[np.ndarray] = []
        for feature in self.features:
            series = self._column(frame, feature.column)
            refuse_missing(series, feature.column, "feature")
            if isinstance(feature, CategoricalFeature):
                blocks.append(self._one_hot(series, feature, n, unseen))
            else:
                x = numeric_values(series, feature.column)
                scale = feature.std if feature.std > 0 else 1.0  # as the encoder: a constant column maps to 0
                blocks.append(((x - feature.mean) / scale).astype(np.float32)[:, None])
        if not blocks:
            return np.zeros((n, 0), dtype=np.float32)
        return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32)

    @staticmethod
    def _one_hot(series: pd.Series, feature: CategoricalFeature, n: int, unseen: Unseen) -> np.ndarray:
        codes = category_codes(series, feature.categories)
        block = np.zeros((n, len(feature.categories)), dtype=np.float32)
        seen = codes >= 0
        if not seen.all():
            values, count = unseen_values(series, codes)
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
        require_columns(frame, [mapping.column], "target")
        series = self._column(frame, mapping.column)
        refuse_missing(series, mapping.column, "target")
        if mapping.kind == "custom":
            raise PreprocessingError(
                f"target column {mapping.column!r} was encoded by a custom label encoder that silofl could not record; "
                "encode the labels yourself (label indices of label_names) and call the model's metrics on them"
            )
        if mapping.kind == "above_threshold":
            assert mapping.threshold is not None
            return (numeric_values(series, mapping.column, role="target") > mapping.threshold).astype(np.int64)
        assert mapping.classes is not None
        codes = category_codes(series, mapping.classes)
        if (codes < 0).any():
            values, count = unseen_values(series, codes)
            raise PreprocessingError(
                f"target column {mapping.column!r} has {count} row(s) with values {values} outside the run's labels "
                f"{[category_text(c) for c in mapping.classes]}; drop those rows or map them to a known label"
            )
        return codes

    def encode_groups(self, frame: pd.DataFrame, sensitive: Sequence[SensitiveColumn] | None = None) -> np.ndarray:
        """The joint sensitive group of each row, int64 ``(n,)`` (index into `group_names`; with `sensitive` given,
        into `joint_group_names(sensitive)`)."""
        columns = tuple(self.sensitive if sensitive is None else sensitive)
        require_columns(frame, [s.column for s in columns], "sensitive")
        codes = np.zeros(len(frame), dtype=np.int64)
        for entry in columns:
            series = self._column(frame, entry.column)
            refuse_missing(series, entry.column, "sensitive")
            col = category_codes(series, entry.categories)
            if (col < 0).any():
                values, count = unseen_values(series, col)
                raise PreprocessingError(
                    f"sensitive column {entry.column!r} has {count} row(s) with values {values} outside the run's "
                    f"groups {[category_text(c) for c in entry.categories]}; drop those rows, or group the rows by "
                    f"the file's own values (silofl evaluate --sensitive {entry.column})"
                )
            codes = codes * len(entry.categories) + col
        return codes
