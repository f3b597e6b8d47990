"""Tests for protocols/fairness_prior.py: the group prior (from counts, floored, validated, balanced), its equality
and hash, and W's shape per fairness notion."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.protocols.fairness_prior import GroupPrior, w_shape
from silofl.protocols.steffle.gradients import psi_w_gradients


def test_from_counts_builds_marginal_and_conditional_priors() -> None:
    counts = np.array([[10.0, 30.0], [30.0, 30.0]])  # (k=2 groups, l=2 labels)
    dp = GroupPrior.from_counts("dp", counts)
    np.testing.assert_allclose(dp.probs, [0.4, 0.6])
    assert (dp.num_groups, dp.num_labels, dp.blocks(), dp.w_shape()) == (2, 2, 1, (2, 2))
    eo = GroupPrior.from_counts("eo", counts)
    np.testing.assert_allclose(eo.probs, [[0.25, 0.75], [0.5, 0.5]])  # row y = P_{S|Y=y}
    assert (eo.blocks(), eo.w_shape(), eo.rho) == (2, (2, 2, 2), 0.25)
    eopp = GroupPrior.from_counts("eopp", counts)
    assert (eopp.blocks(), eopp.w_shape(), eopp.rho) == (1, (2, 2), 0.5)  # rho from the positive row only
    assert not eopp.probs.flags.writeable


def test_from_counts_floor_clips_noised_counts_and_renormalises() -> None:
    noised = np.array([[-3.0, 40.0], [0.5, 60.0], [99.5, 0.0]])  # k = 3; DP noise made entries <= 0
    with pytest.raises(ValueError, match="floor"):
        GroupPrior.from_counts("dp", np.array([[0.0, 0.0], [5.0, 5.0]]))
    prior = GroupPrior.from_counts("eo", noised, floor=0.05)
    assert np.all(prior.probs >= 0.05 - 1e-15)
    np.testing.assert_allclose(prior.probs.sum(axis=1), 1.0)
    # label 0: raw (0, 0.5, 99.5)/100 -> group 0 and group 1 floored, group 2 keeps the rest
    np.testing.assert_allclose(prior.probs[0], [0.05, 0.05, 0.9])
    # label 1: raw (0.4, 0.6, 0) -> group 2 floored, the others keep their 2:3 ratio in the remaining 0.95
    np.testing.assert_allclose(prior.probs[1], [0.38, 0.57, 0.05])
    assert prior.rho == pytest.approx(0.05)
    with pytest.raises(ValueError, match=r"floor must lie in \[0, 1/num_groups\]"):
        GroupPrior.from_counts("dp", noised, floor=0.4)
    with pytest.raises(ValueError, match=r"label\(s\) \[1\]"):
        GroupPrior.from_counts("eo", np.array([[3.0, -1.0], [2.0, 0.0]]), floor=0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"notion": "parity", "probs": [0.5, 0.5], "num_labels": 2}, "notion must be one of"),
        ({"notion": "dp", "probs": [0.5, 0.5]}, "num_labels is required for 'dp'"),
        ({"notion": "dp", "probs": [[0.5, 0.5]], "num_labels": 2}, "must be 1-D"),
        ({"notion": "eo", "probs": [0.5, 0.5]}, "must be 2-D"),
        ({"notion": "dp", "probs": [1.0, 0.0], "num_labels": 2}, "must be > 0"),
        ({"notion": "dp", "probs": [0.5, 0.6], "num_labels": 2}, "sum to 1"),
        ({"notion": "eo", "probs": [[0.5, 0.5], [0.2, 0.7]]}, "sum to 1"),
        ({"notion": "eo", "probs": [[0.5, 0.5], [0.5, 0.5]], "num_labels": 3}, "does not match"),
        ({"notion": "dp", "probs": [np.nan, 1.0], "num_labels": 2}, "NaN"),
    ],
)
def test_group_prior_rejects_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GroupPrior(**kwargs)


def test_group_prior_equality_and_hash() -> None:
    a = GroupPrior("dp", np.array([0.25, 0.75]), num_labels=2)
    b = GroupPrior.from_counts("dp", np.array([[1.0, 0.0], [1.0, 2.0]]))
    assert a == b and hash(a) == hash(b)
    assert a != GroupPrior("dp", np.array([0.25, 0.75]), num_labels=3)
    assert a != GroupPrior("eopp", np.array([[0.25, 0.75], [0.25, 0.75]]))


def test_w_shape_per_notion() -> None:
    assert w_shape("dp", 3, 4) == (3, 4)
    assert w_shape("eo", 3, 4) == (4, 3, 4)
    assert w_shape("eopp", 3, 4) == (3, 4)
    with pytest.raises(ValueError, match="num_labels must be an integer >= 2"):
        w_shape("dp", 3, 1)


def test_balanced_prior_bound_equality_and_validation() -> None:
    probs = np.array([0.05, 0.15, 0.8])
    prior = GroupPrior("dp", probs, num_labels=2)
    balanced = GroupPrior("dp", probs, num_labels=2, balanced=True)
    assert prior != balanced and hash(prior) != hash(balanced)
    assert balanced == GroupPrior("dp", probs, num_labels=2, balanced=True)
    assert prior.w_gradient_bound() == 2.0 / math.sqrt(0.05)
    assert balanced.w_gradient_bound() == pytest.approx(2.0 / (math.sqrt(3) * 0.05))
    assert prior.sample_weights() is None
    np.testing.assert_allclose(balanced.sample_weights(), (1 / 3) / probs[None, :])
    np.testing.assert_allclose(balanced.objective_probs(), np.full((1, 3), 1 / 3))
    # a record's s-dependent W-gradient 2 omega_i sqrt(k) e_s F_i^T lies within the bound (reached at rho, F a vertex)
    F = torch.tensor([[0.0, 1.0], [0.3, 0.7]], dtype=torch.float64)
    groups = torch.tensor([0, 0])
    rows = psi_w_gradients(F, groups, torch.zeros(3, 2, dtype=torch.float64), balanced)
    norms = torch.linalg.vector_norm(rows.reshape(2, -1), dim=1)
    assert float(norms[0]) == pytest.approx(balanced.w_gradient_bound()) and float(norms[1]) < norms[0]
    with pytest.raises(ValueError, match="balanced must be a bool"):
        GroupPrior("dp", probs, num_labels=2, balanced="yes")  # type: ignore[arg-type]
