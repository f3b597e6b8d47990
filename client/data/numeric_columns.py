"""Numeric columns read as text: :func:`mostly_numeric_columns` finds the text columns whose values are mostly
numbers (one stray word, '?' or 'unknown', makes pandas read a whole numeric column as text, and the preprocessing then
one-hot encodes it instead of z-scoring it), each described by a :class:`MostlyNumeric` (reported by the command
line's checks, `client.data.preflight`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from silofl.client.data.generic import is_categorical

__all__ = ["MOSTLY_NUMERIC", "MostlyNumeric", "mostly_numeric_columns"]

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
        if not is_categorical(series) or pd.api.types.is_bool_dtype(series):
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
