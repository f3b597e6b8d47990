"""The column records of a preprocessing: a feature column one-hot encoded (:class:`CategoricalFeature`) or z-scored
(:class:`ContinuousFeature`), the target's mapping to class indices (:class:`LabelMapping`) and a sensitive column
with its categories (:class:`SensitiveColumn`); the joint groups' names over sensitive columns
(:func:`joint_group_names`) and the sensitive columns of a table's own values (:func:`group_vocabulary`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from silofl.protocols.preprocessing.table import refuse_missing, require_columns
from silofl.protocols.preprocessing.values import (
    PreprocessingError,
    Scalar,
    category_text,
    check_finite,
    check_scalars,
    check_string,
    sorted_categories,
)

__all__ = [
    "CategoricalFeature",
    "ContinuousFeature",
    "FeatureColumn",
    "LabelMapping",
    "SensitiveColumn",
    "group_vocabulary",
    "joint_group_names",
]


@dataclass(frozen=True)
class CategoricalFeature:
    """A feature column one-hot encoded: one 0/1 input per category, in `categories` order (the whole table's
    distinct values, sorted)."""

    column: str
    categories: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        check_string(self.column, "categorical feature column")
        object.__setattr__(self, "categories", check_scalars(self.categories, f"feature column {self.column!r}"))

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
        check_string(self.column, "continuous feature column")
        object.__setattr__(self, "mean", check_finite(self.mean, f"feature column {self.column!r}: mean"))
        std = check_finite(self.std, f"feature column {self.column!r}: std")
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
        check_string(self.column, "target column")
        names = tuple(self.names)
        if len(names) < 2 or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise PreprocessingError(f"target {self.column!r}: label names must be 2 or more distinct strings: {names}")
        object.__setattr__(self, "names", names)
        if self.kind == "classes":
            if self.classes is None or self.threshold is not None:
                raise PreprocessingError(f"target {self.column!r}: kind 'classes' needs classes and no threshold")
            classes = check_scalars(self.classes, f"target column {self.column!r}")
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
            object.__setattr__(self, "threshold", check_finite(self.threshold, f"target {self.column!r}: threshold"))
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
        check_string(self.column, "sensitive column")
        object.__setattr__(self, "categories", check_scalars(self.categories, f"sensitive column {self.column!r}"))

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "categories": list(self.categories)}


def group_vocabulary(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[SensitiveColumn, ...]:
    """Sensitive columns with the categories found in `frame` (sorted as the training encoder sorts them): for
    grouping a table by columns the run did not treat as sensitive (`silofl evaluate --sensitive COL`)."""
    require_columns(frame, columns, "sensitive")
    out = []
    for column in columns:
        refuse_missing(frame[column], column, "sensitive")
        out.append(SensitiveColumn(column, tuple(sorted_categories(list(pd.unique(frame[column]))))))
    return tuple(out)


def joint_group_names(columns: Sequence[SensitiveColumn]) -> tuple[str, ...]:
    """The joint groups' names over `columns`' categories, ``value1|value2``, the first column varying slowest."""
    names: list[str] = [""]
    for entry in columns:
        names = [f"{p}|{category_text(v)}" if p else category_text(v) for p in names for v in entry.categories]
    return tuple(names)
