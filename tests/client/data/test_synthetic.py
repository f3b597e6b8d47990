"""Tests for client/data/synthetic.py: deterministic, learnable, and unfair for an unconstrained classifier."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.client.data.synthetic import make_synthetic, synthetic_frame
from silofl.client.data.tabular import DataError, TabularDataset


def fit_logistic(x: np.ndarray, y: np.ndarray, iters: int = 25, l2: float = 1e-4) -> np.ndarray:
    """Logistic regression (with intercept) by Newton's method; a dozen lines instead of a scikit-learn dependency."""
    xb = np.hstack([x.astype(np.float64), np.ones((x.shape[0], 1))])
    w = np.zeros(xb.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-xb @ w))
        grad = xb.T @ (p - y) / len(y) + l2 * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb / len(y) + l2 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    return w


def predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (np.hstack([x, np.ones((x.shape[0], 1))]) @ w > 0).astype(np.int64)


def dp_violation(pred: np.ndarray, groups: np.ndarray) -> float:
    """max over s1, s2 of |P[yhat=1 | s1] - P[yhat=1 | s2]| (binary labels: the same for yhat=0)."""
    rates = [pred[groups == g].mean() for g in np.unique(groups)]
    return float(max(rates) - min(rates))


def evaluate(ds: TabularDataset, drop: tuple[str, ...] = ()) -> tuple[float, float]:
    keep = [i for i, n in enumerate(ds.info.feature_names) if n not in drop]
    w = fit_logistic(ds.train.nonsensitive.features[:, keep], ds.train.nonsensitive.labels)
    pred = predict(w, ds.test.nonsensitive.features[:, keep])
    return float((pred == ds.test.nonsensitive.labels).mean()), dp_violation(pred, ds.test.sensitive.groups)


def test_shapes_and_metadata() -> None:
    ds = make_synthetic(1000, num_features=6, seed=1)
    assert (len(ds.train), len(ds.test)) == (750, 250)
    assert ds.info.feature_names == ("age", "x1", "x2", "x3", "x4", "x5")
    assert ds.info.sensitive_columns == ("group",)
    assert ds.info.group_names == ("g0", "g1")
    assert ds.info.label_names == ("negative", "positive")
    assert ds.train_sort_key is not None and ds.test_sort_key is not None
    assert ds.train_sort_key.min() >= 18 and ds.train_sort_key.max() <= 90
    assert np.all(ds.train_sort_key == np.round(ds.train_sort_key))  # raw years, not z-scores
    np.testing.assert_allclose(ds.train.nonsensitive.features.mean(axis=0), 0.0, atol=1e-5)


def test_deterministic_by_seed() -> None:
    a, b, c = make_synthetic(500, seed=7), make_synthetic(500, seed=7), make_synthetic(500, seed=8)
    np.testing.assert_array_equal(a.train.nonsensitive.features, b.train.nonsensitive.features)
    np.testing.assert_array_equal(a.test.sensitive.groups, b.test.sensitive.groups)
    assert not np.array_equal(a.train.nonsensitive.features, c.train.nonsensitive.features)


def test_learnable_and_unfair_but_a_fair_classifier_exists() -> None:
    ds = make_synthetic()
    accuracy, violation = evaluate(ds)
    assert accuracy >= 0.80
    assert violation > 0.10
    # Without the group proxy x1, predictions are independent of the group, at a modest cost in accuracy.
    fair_accuracy, fair_violation = evaluate(ds, drop=("x1",))
    assert fair_violation < 0.05
    assert accuracy - 0.08 < fair_accuracy < accuracy


def test_bias_controls_the_unfairness() -> None:
    _, unbiased = evaluate(make_synthetic(bias=0.0))
    _, strong = evaluate(make_synthetic(bias=1.5))
    assert unbiased < 0.05 < 0.2 < strong


def test_more_groups() -> None:
    ds = make_synthetic(num_groups=3)
    assert ds.info.group_names == ("g0", "g1", "g2")
    counts = np.bincount(ds.train.sensitive.groups)
    assert counts.size == 3 and counts[0] > counts[2] > 0  # unequal group sizes
    accuracy, violation = evaluate(ds)
    assert accuracy >= 0.80 and violation > 0.10
    many = synthetic_frame(200, num_groups=12)
    assert sorted(many.group.unique())[:3] == ["g00", "g01", "g02"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 4}, "n must be an integer >= 8"),
        ({"num_groups": 1}, "num_groups must be an integer >= 2"),
        ({"num_features": 2}, "num_features must be an integer >= 3"),
        ({"bias": float("nan")}, "bias must be"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        make_synthetic(**kwargs)
