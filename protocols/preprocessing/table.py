"""Reading a table's columns as the encoder does: the checks that name a missing column or value
(:func:`require_columns`, :func:`refuse_missing`), the matching of values to recorded categories (by value, then by
text form: :func:`category_codes`, :func:`unseen_values`) and a continuous column read as numbers
(:func:`numeric_values`). Each refusal is a `PreprocessingError` naming the column and the fix."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from silofl.protocols.preprocessing.values import PreprocessingError, Scalar, category_text

__all__ = ["category_codes", "numeric_values", "refuse_missing", "require_columns", "unseen_values"]


def require_columns(frame: pd.DataFrame, columns: Sequence[str], role: str) -> None:
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


def refuse_missing(series: pd.Series, column: str, role: str) -> None:
    missing = series.isna().to_numpy()
    if missing.any():
        rows = np.flatnonzero(missing)
        raise PreprocessingError(
            f"{role} column {column!r} has {rows.size} missing value(s) (first at row {rows[0]}); silofl does not "
            "impute: drop or fill those rows first"
        )


def category_codes(series: pd.Series, categories: tuple[Scalar, ...]) -> np.ndarray:
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


def unseen_values(series: pd.Series, codes: np.ndarray) -> tuple[list[str], int]:
    """The first few distinct unmatched values (as text) and the number of rows holding one."""
    rows = np.flatnonzero(codes < 0)
    values = sorted({category_text(v) for v in series.to_numpy()[rows]})
    return values[:5], int(rows.size)


def numeric_values(series: pd.Series, column: str, *, role: str = "continuous feature") -> np.ndarray:
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
