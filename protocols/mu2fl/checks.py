"""Argument checks shared by the mu2fl maths (`constants`, `accounting`, `calibration`, `iteration`, `logreg`,
`reference`): counts, positive numbers, delta and vectors, each refused with a ValueError that names the argument and
its allowed range, so that a bad value is refused where it enters the maths."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["delta", "positive", "positive_int", "vector"]


def positive_int(name: str, value: object) -> int:
    """`value` as an int if it is an integer >= 1 (a count: rounds, silos, batch size, dimension); bools refused."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """`value` as a float if it is a number > 0, finite unless `allow_inf` (rho = math.inf: the run without noise)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    number = float(value)
    if not (number > 0) or (math.isinf(number) and not allow_inf) or math.isnan(number):
        extra = " (or math.inf for no noise)" if allow_inf else ""
        raise ValueError(f"{name} must be a positive finite number{extra}, got {value!r}")
    return number


def delta(delta: object) -> float:
    """`delta` as a float if it is in (0, 1): the delta of (epsilon, delta)-DP."""
    value = float(delta) if isinstance(delta, int | float | np.floating) and not isinstance(delta, bool) else math.nan
    if not 0.0 < value < 1.0:
        raise ValueError(f"delta must be in (0, 1), e.g. 1e-5, got {delta!r}")
    return value


def vector(name: str, value: object, dim: int | None = None) -> np.ndarray:
    """`value` as a 1-d float64 array, of `dim` entries when given (the length of the vectors it is combined with)."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-d vector, got shape {array.shape}")
    if dim is not None and array.shape[0] != dim:
        raise ValueError(f"{name} has {array.shape[0]} entries, expected {dim} (the other vectors' length)")
    return array
