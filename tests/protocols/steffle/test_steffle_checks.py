"""Tests for protocols/steffle/checks.py: bad input is refused naming the argument, and the dtype of F is kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.steffle.gradients import psi_output_cotangents, psi_w_gradients
from silofl.protocols.steffle.objective import ermi_value, optimal_w, psi
from tests.steffle_cases import batch, batch_prior, random_w


def test_float32_in_float32_out() -> None:
    F, groups, labels = batch(12, 2, 3, seed=41, dtype=torch.float32)
    prior = batch_prior("eo", groups, labels, 2, 3)
    W = random_w(prior, seed=42, dtype=torch.float32)
    assert psi(F, groups, W, prior, labels).dtype == torch.float32
    assert psi_w_gradients(F, groups, W, prior, labels).dtype == torch.float32
    assert optimal_w(F, groups, prior, labels).dtype == torch.float32
    assert ermi_value(F, groups, prior, labels).dtype == torch.float32
    assert psi_output_cotangents(groups, W, prior, labels).dtype == torch.float32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"F": torch.randn(6, 2)}, "probabilities in"),  # logits instead of softmax
        ({"F": torch.full((6, 2), 0.4)}, "sum to 1"),
        ({"F": torch.full((6, 3), 1 / 3)}, r"num_labels=2"),
        ({"groups": torch.tensor([0, 1, 2, 0, 1, 0])}, r"groups must lie in \[0, 1\]"),
        ({"groups": torch.zeros(6)}, "groups must hold integer indices"),
        ({"groups": torch.zeros(5, dtype=torch.long)}, "one entry per sample"),
        ({"labels": None}, "labels .* are required"),
        ({"labels": torch.tensor([0, 1, 2, 0, 1, 0])}, r"labels must lie in \[0, 1\]"),
        ({"W": torch.zeros(2, 2)}, r"W must have shape \(2, 2, 2\)"),
        ({"W": torch.full((2, 2, 2), float("nan"))}, "W contains NaN"),
    ],
)
def test_bad_input_names_the_argument(change: dict, match: str) -> None:
    args = {
        "F": torch.full((6, 2), 0.5),
        "groups": torch.tensor([0, 1, 1, 0, 1, 0]),
        "W": torch.zeros(2, 2, 2),
        "prior": GroupPrior("eo", np.full((2, 2), 0.5)),
        "labels": torch.tensor([0, 1, 1, 0, 0, 1]),
    }
    args.update(change)
    with pytest.raises(ValueError, match=match):
        psi(**args)
