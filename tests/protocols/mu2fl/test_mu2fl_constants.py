"""Tests for protocols/mu2fl/constants.py: the paper's Section 5.3 constants, and the Lipschitz and smoothness
bounds of `Mu2Constants.for_logreg` hold and are tight."""

from __future__ import annotations

import math

import numpy as np
import pytest

from silofl.protocols.mu2fl.constants import Mu2Constants
from silofl.protocols.mu2fl.logreg import logreg_dim, logreg_grad

MNIST = Mu2Constants.for_logreg(784, 10, D=0.1)


def test_mnist_constants_are_the_papers() -> None:
    # Section 5.3: G = sqrt(2 * 785) = 39.6, L = 785/2 = 392.5, D = 0.1, S = 118.1, d = 10 * 785 = 7850.
    assert math.sqrt(1570) == MNIST.G == pytest.approx(39.62, abs=5e-3)
    assert MNIST.L == 392.5 and MNIST.D == 0.1 and MNIST.dim == 7850 == logreg_dim(784, 10)
    assert round(MNIST.S, 1) == 118.1 and MNIST.radius == 0.05
    binary = Mu2Constants.for_logreg(10, 2, D=1.0)
    assert (binary.G, binary.L, binary.dim) == (math.sqrt(11), 11 / 4, 11)
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        Mu2Constants.for_logreg(784, 1)
    with pytest.raises(ValueError, match="D must be a positive finite number"):
        Mu2Constants.for_logreg(784, 10, D=0.0)
    with pytest.raises(ValueError, match=r"Mu2Constants.dim must be an integer >= 1"):
        Mu2Constants(G=1.0, L=1.0, D=1.0, dim=0)


def _record_grad(params: np.ndarray, a: np.ndarray, label: int, classes: int) -> np.ndarray:
    return logreg_grad(params, a[None, :], np.array([label]), classes)


def _flat(weight_and_bias: np.ndarray) -> np.ndarray:
    """(rows, n + 1) with the bias last -> silofl's flat layout (head.weight row-major, then head.bias)."""
    return np.concatenate([weight_and_bias[:, :-1].ravel(), weight_and_bias[:, -1]])


@pytest.mark.parametrize("classes", [2, 5])
def test_lipschitz_and_smoothness_bounds_hold_and_are_tight(classes: int) -> None:
    n = 30
    c = Mu2Constants.for_logreg(n, classes)
    rng = np.random.default_rng(0)
    # Valid: per-record gradient norms <= G, gradient differences <= L * distance, at random points and records.
    for _ in range(200):
        a = rng.random(n) * (rng.random() < 0.5 or rng.random(n) < 0.5)
        label = int(rng.integers(classes))
        u, v = rng.normal(scale=3.0, size=(2, c.dim))
        gu, gv = _record_grad(u, a, label, classes), _record_grad(v, a, label, classes)
        assert np.linalg.norm(gu) <= c.G * (1 + 1e-12)
        assert np.linalg.norm(gu - gv) <= c.L * np.linalg.norm(u - v) * (1 + 1e-12)
    # Tight: with a = 1 (||a~||^2 = n + 1) the bounds are approached.
    ones = np.ones(n)
    rows = 1 if classes == 2 else classes
    confident_wrong = np.zeros((rows, n + 1))
    confident_wrong[-1, n] = 40.0  # the bias makes the last class (or z >> 0) near-certain; the label is 0
    g = _record_grad(_flat(confident_wrong), ones, 0, classes)
    assert np.linalg.norm(g) > 0.999 * c.G
    # Second derivative along a worst direction at p = (1/2, 1/2, 0, ...) (binary: z = 0, sigma' = 1/4).
    at = np.zeros((rows, n + 1))
    if classes > 2:
        at[2:, n] = -40.0  # classes 2.. improbable: p ~ (1/2, 1/2, 0, ...)
    direction = np.zeros((rows, n + 1))
    if classes == 2:
        direction[0] = 1.0
    else:
        direction[0], direction[1] = 1.0, -1.0
    direction = _flat(direction) / np.linalg.norm(direction)
    h = 1e-6
    curvature = np.linalg.norm(
        _record_grad(_flat(at) + h * direction, ones, 0, classes) - _record_grad(_flat(at), ones, 0, classes)
    )
    assert curvature / h == pytest.approx(c.L, rel=1e-3)
