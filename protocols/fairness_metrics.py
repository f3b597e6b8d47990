"""Exact accuracy and fairness-violation metrics from confusion counts.

Each silo reports ``counts[s, y, yhat]`` (records with sensitive group ``s``, true label ``y`` and prediction ``yhat``)
for its test split; the server sums the silos' arrays and calls :func:`fairness_from_counts`. Every metric below is a
function of those counts only, so the federated figure is exactly the one a central evaluation on the pooled test sets
would give.

Definitions (SteFFLe paper Appendix E.1, eqs. (11)-(12)), with ``P`` the empirical
probability:

- demographic parity violation, eq. (11): ``max_{y', s1, s2} |P[yhat=y' | s1] - P[yhat=y' | s2]|``;
- equalized odds violation, eq. (12): ``max_{y', s1, s2} max(|P[yhat=y' | s1, y=y'] - P[yhat=y' | s2, y=y']|,
  |P[yhat=y' | s1, y!=y'] - P[yhat=y' | s2, y!=y']|)``;
- equal opportunity violation: for binary labels the ``y = y'`` gap of eq. (12) at the positive label only
  (``y' = num_labels - 1 = 1``, the true-positive-rate gap of Hardt et al. 2016). The papers do not define it for
  more labels; here it is the ``y = y'`` gap maximised over every label ``y'`` (the largest per-class recall gap), which
  reduces to Hardt et al.'s notion when each class is in turn taken as the "advantaged" outcome.

Empty cells: a group, or a group under a conditioning event (``y = y'`` or ``y != y'``), with zero records has an
undefined conditional probability and is left out of that max. A gap needs at least two groups with records; when
there are none, that gap contributes 0.0. With no records at all every field is 0.0 and ``n = 0``.

Small groups (issue 20). Each violation is a max over pairs of groups, so a group with few test records decides it
through its sampling noise alone: a rate estimated from n records has standard error ``sqrt(p (1 - p) / n)`` (about
0.05 for ``p = 0.2``, ``n = 60``), and the max over several such groups is biased upwards. :func:`group_report` gives
each group's test support and rates (with that standard error) and the same violations over the groups with at least
``min_support`` test records (default :data:`MIN_SUPPORT`), next to the ones over all groups. Restricting the counts to
those groups and calling :func:`fairness_from_counts` gives exactly those violations, so the federated figure is still
the central one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MIN_SUPPORT", "FairnessReport", "confusion_counts", "fairness_from_counts", "group_report"]

#: Default smallest test support (records) of a group that enters the ``*_min_support`` violations of
#: :func:`group_report`: at 100 records a rate near 0.2 has a standard error of 0.04.
MIN_SUPPORT = 100


@dataclass(frozen=True)
class FairnessReport:
    """Test-set accuracy, error and fairness violations (all in [0, 1]) over ``n`` records."""

    accuracy: float
    error: float
    dp_violation: float
    eo_violation: float
    eopp_violation: float
    n: int


def _as_index_array(name: str, values: np.ndarray, size: int, n: int | None) -> np.ndarray:
    """Validate a 1-D array of integer indices in ``[0, size)``; returns it as int64."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if n is not None and array.shape[0] != n:
        raise ValueError(f"{name} has {array.shape[0]} entries but groups has {n}; pass one entry per record")
    if array.dtype == np.bool_ or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(f"{name} must hold integer indices, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.size and (array.min() < 0 or array.max() >= size):
        raise ValueError(
            f"{name} must lie in [0, {size - 1}], got values in [{array.min()}, {array.max()}]; "
            "encode categories as 0-based indices"
        )
    return array


def confusion_counts(
    groups: np.ndarray, labels: np.ndarray, predictions: np.ndarray, num_groups: int, num_labels: int
) -> np.ndarray:
    """Counts ``counts[s, y, yhat]`` as int64 ``(num_groups, num_labels, num_labels)``.

    ``groups``, ``labels`` and ``predictions`` are 1-D integer arrays of equal length with 0-based indices.
    """
    for name, value in (("num_groups", num_groups), ("num_labels", num_labels)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    k, l_ = int(num_groups), int(num_labels)
    s = _as_index_array("groups", groups, k, None)
    y = _as_index_array("labels", labels, l_, s.shape[0])
    yhat = _as_index_array("predictions", predictions, l_, s.shape[0])
    flat = (s * l_ + y) * l_ + yhat
    return np.bincount(flat, minlength=k * l_ * l_).astype(np.int64).reshape(k, l_, l_)


def _validate_counts(counts: np.ndarray) -> np.ndarray:
    array = np.asarray(counts)
    if array.ndim != 3:
        raise ValueError(f"counts must be 3-D (num_groups, num_labels, num_labels), got shape {array.shape}")
    if array.shape[1] != array.shape[2]:
        raise ValueError(
            f"counts must be square in its last two axes (true label x predicted label), got shape {array.shape}"
        )
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"counts needs at least one group and one label, got shape {array.shape}")
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(f"counts must hold non-negative integers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array) & (array == np.round(array))):
        raise ValueError("counts must hold non-negative integers; found non-integral or non-finite values")
    if np.any(array < 0):
        raise ValueError("counts must be non-negative; found negative entries")
    return array.astype(np.int64)


def _max_gap(numerators: np.ndarray, denominators: np.ndarray) -> float:
    """``max_{s1,s2} |num[s1]/den[s1] - num[s2]/den[s2]|`` over groups with ``den > 0`` (0.0 if fewer than two)."""
    defined = denominators > 0
    if np.count_nonzero(defined) < 2:
        return 0.0
    rates = numerators[defined] / denominators[defined]
    return float(rates.max() - rates.min())


def fairness_from_counts(counts: np.ndarray) -> FairnessReport:
    """Accuracy, error and the DP, EO and EOPP violations of the module docstring, from ``counts[s, y, yhat]``."""
    c = _validate_counts(counts)
    num_labels = c.shape[1]
    n = int(c.sum())
    if n == 0:
        return FairnessReport(accuracy=0.0, error=0.0, dp_violation=0.0, eo_violation=0.0, eopp_violation=0.0, n=0)

    correct = int(np.trace(c, axis1=1, axis2=2).sum())
    group_sizes = c.sum(axis=(1, 2))  # (k,)
    predicted = c.sum(axis=1)  # (k, yhat): records of group s predicted yhat
    label_sizes = c.sum(axis=2)  # (k, y): records of group s with true label y

    dp = max(_max_gap(predicted[:, u], group_sizes) for u in range(num_labels))

    positive_gaps = []  # gap of P[yhat=u | s, y=u]
    negative_gaps = []  # gap of P[yhat=u | s, y!=u]
    for u in range(num_labels):
        hits = c[:, u, u]
        positive_gaps.append(_max_gap(hits, label_sizes[:, u]))
        negative_gaps.append(_max_gap(predicted[:, u] - hits, group_sizes - label_sizes[:, u]))
    eo = max(max(positive_gaps), max(negative_gaps))
    eopp = positive_gaps[1] if num_labels == 2 else max(positive_gaps)

    return FairnessReport(
        accuracy=correct / n,
        error=(n - correct) / n,
        dp_violation=dp,
        eo_violation=eo,
        eopp_violation=eopp,
        n=n,
    )


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator > 0 else None


def group_report(
    counts: np.ndarray, *, min_support: int = MIN_SUPPORT, group_names: list[str] | tuple[str, ...] | None = None
) -> dict[str, object]:
    """Per-group test support and rates, and the violations over all groups and over the well-supported ones.

    From the summed ``counts[s, y, yhat]`` (so exact for a federated evaluation), a JSON-ready dict:

    - ``min_support``: the threshold; ``groups_kept``: the names of the groups with at least that many test records
      (and at least one);
    - ``dp_violation``, ``eo_violation``, ``eopp_violation``: :func:`fairness_from_counts` over all groups (the same
      values as ``final``), and the ``*_min_support`` ones over the kept groups only (0.0 with fewer than two kept);
    - ``groups``: one entry per group with ``name``, ``support`` (test records), ``label_support`` (per true label),
      ``prediction_rate`` (``P[yhat=u | s]`` per label ``u``), ``prediction_rate_se`` (its binomial standard error
      ``sqrt(p (1 - p) / n)``), ``hit_rate`` (``P[yhat=u | s, y=u]``: the TPR of label 1 for binary labels) and
      ``false_rate`` (``P[yhat=u | s, y!=u]``: the FPR of label 1); an undefined rate is ``None``; and ``counts``,
      the group's ``(y, yhat)`` table.
    """
    c = _validate_counts(counts)
    if isinstance(min_support, bool) or not isinstance(min_support, (int, np.integer)) or min_support < 0:
        raise ValueError(f"min_support must be an integer >= 0, got {min_support!r}")
    k, num_labels = c.shape[0], c.shape[1]
    names = [str(i) for i in range(k)] if group_names is None else [str(g) for g in group_names]
    if len(names) != k:
        raise ValueError(f"group_names has {len(names)} names for {k} groups")
    groups = []
    for r in range(k):
        table = c[r]
        n = int(table.sum())
        predicted = table.sum(axis=0)
        label_sizes = table.sum(axis=1)
        rates = [_rate(int(predicted[u]), n) for u in range(num_labels)]
        groups.append(
            {
                "name": names[r],
                "support": n,
                "label_support": [int(v) for v in label_sizes],
                "prediction_rate": rates,
                "prediction_rate_se": [None if p is None else float(np.sqrt(p * (1 - p) / n)) for p in rates],
                "hit_rate": [_rate(int(table[u, u]), int(label_sizes[u])) for u in range(num_labels)],
                "false_rate": [
                    _rate(int(predicted[u] - table[u, u]), n - int(label_sizes[u])) for u in range(num_labels)
                ],
                "counts": table.tolist(),
            }
        )
    kept = [r for r in range(k) if groups[r]["support"] >= max(min_support, 1)]
    every = fairness_from_counts(c)
    if kept:
        some = fairness_from_counts(c[kept])
        dp_k, eo_k, eopp_k = some.dp_violation, some.eo_violation, some.eopp_violation
    else:
        dp_k = eo_k = eopp_k = 0.0
    return {
        "min_support": int(min_support),
        "groups_kept": [names[r] for r in kept],
        "dp_violation": every.dp_violation,
        "eo_violation": every.eo_violation,
        "eopp_violation": every.eopp_violation,
        "dp_violation_min_support": dp_k,
        "eo_violation_min_support": eo_k,
        "eopp_violation_min_support": eopp_k,
        "groups": groups,
    }
