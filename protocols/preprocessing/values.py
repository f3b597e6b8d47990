"""Category values and field checks of the preprocessing record: :data:`Scalar` (a category as JSON keeps it),
:class:`PreprocessingError`, the text form and order of categories (:func:`category_text`, :func:`sorted_categories`)
and the checks every record runs on its fields (a category, a list of categories, a name, a finite number), each
refusing a bad value with a `PreprocessingError` that names the field."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "PreprocessingError",
    "Scalar",
    "category_text",
    "check_finite",
    "check_scalar",
    "check_scalars",
    "check_string",
    "sorted_categories",
]

#: A category value as JSON keeps it: text, an integer, a float or a boolean.
Scalar = str | int | float | bool


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


def check_scalar(value: object, where: str) -> Scalar:
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


def check_scalars(values: Sequence[object], where: str) -> tuple[Scalar, ...]:
    out = tuple(check_scalar(v, where) for v in values)
    if len(out) < 1:
        raise PreprocessingError(f"{where}: no categories")
    if len(set(map(_key, out))) != len(out):
        raise PreprocessingError(f"{where}: duplicate categories in {list(out)}")
    return out


def _key(value: Scalar) -> tuple[str, Scalar]:
    """A hashable identity that keeps True, 1 and 1.0 apart (they hash alike in Python)."""
    return (type(value).__name__ if isinstance(value, bool | str) else "number", value)


def check_string(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise PreprocessingError(f"{where} must be a non-empty string, got {value!r}")
    return value


def check_finite(value: object, where: str) -> float:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PreprocessingError(f"{where} must be a finite number, got {value!r}")
    return float(value)
