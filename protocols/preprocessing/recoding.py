"""What a built-in dataset's reader does to its file's rows before the encoder sees them, as data: a
:class:`Recoding` (columns dropped, per column a :class:`ValueMap`), applied by the reader (`client.data.loaders`) and
carried by the preprocessing record, so that raw rows of the original file encode as the rows the reader cleaned
(applied to rows already recoded, a recoding changes nothing). A file dataset (CSV/Parquet) has none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from silofl.protocols.preprocessing.table import category_codes
from silofl.protocols.preprocessing.values import (
    PreprocessingError,
    Scalar,
    category_text,
    check_scalar,
    check_scalars,
    check_string,
)

__all__ = ["Recoding", "ValueMap"]


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
        check_string(self.column, "recoded column")
        where = f"recoding of column {self.column!r}"
        try:
            pairs = tuple((check_scalar(raw, where), check_scalar(clean, where)) for raw, clean in self.values)
        except (TypeError, ValueError) as exc:
            raise PreprocessingError(f"{where}: values must be [raw, clean] pairs of scalars ({exc})") from None
        raws = check_scalars([raw for raw, _ in pairs], where)
        for raw, clean in pairs:
            position = category_codes(pd.Series([clean], dtype=object), raws)[0]
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
        codes = category_codes(values, tuple(raw for raw, _ in self.values))
        if self.others == "error":
            unknown = np.flatnonzero((codes < 0) & (category_codes(values, tuple(c for _, c in self.values)) < 0))
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
    package's docstring (`protocols.preprocessing`). Empty (the default) for a file dataset."""

    drop: tuple[str, ...] = ()
    values: tuple[ValueMap, ...] = ()

    def __post_init__(self) -> None:
        drop = tuple(check_string(c, "dropped column") for c in self.drop)
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
