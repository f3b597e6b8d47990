"""Tests for protocols/steffle/gradients.py: the per-sample W-gradients against autograd and finite differences,
the checked-input kernels against the public functions (bit for bit), and the group-balanced gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from silofl.protocols.fairness_prior import FAIRNESS_NOTIONS, GroupPrior
from silofl.protocols.steffle.gradients import (
    psi_output_cotangents,
    psi_output_cotangents_checked,
    psi_w_gradients,
    psi_w_sensitive_sum_checked,
)
from silofl.protocols.steffle.objective import psi
from tests.steffle_cases import SHAPES, balanced_prior, batch, batch_prior, random_w


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_psi_w_gradients_match_autograd_per_sample(notion: str, k: int, l_: int) -> None:
    F, groups, labels = batch(13, k, l_, seed=3)
    prior = batch_prior(notion, groups, labels, k, l_)
    W = random_w(prior, seed=2).requires_grad_(True)
    grads = psi_w_gradients(F, groups, W.detach(), prior, labels)
    assert grads.shape == (13, *prior.w_shape())
    values = psi(F, groups, W, prior, labels)
    for i in range(13):
        (expected,) = torch.autograd.grad(values[i], W, retain_graph=True)
        torch.testing.assert_close(grads[i], expected)
    if notion == "eo":  # each sample touches only its own label's block
        for i in range(13):
            others = [y for y in range(l_) if y != int(labels[i])]
            assert torch.all(grads[i, others] == 0) and torch.any(grads[i, int(labels[i])] != 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_checked_kernels_give_the_public_functions_bits(notion: str, k: int, l_: int, dtype: torch.dtype) -> None:
    """The silo's checked-input kernels: the same bits as the public (re-checking) functions, batch of 256 as a
    SteFFLe round's, several batches (torch.equal, not a tolerance: results must not depend on the route)."""
    for seed in range(4):
        F, groups, labels = batch(256 + seed, k, l_, seed=seed, dtype=dtype)
        prior = batch_prior(notion, groups, labels, k, l_)
        W = random_w(prior, seed=seed + 7, dtype=dtype)
        assert torch.equal(
            psi_output_cotangents_checked(groups, W, prior, labels), psi_output_cotangents(groups, W, prior, labels)
        )
        expected = psi_w_gradients(F, groups, torch.zeros_like(W), prior, labels).sum(dim=0)
        assert torch.equal(psi_w_sensitive_sum_checked(F, groups, prior, labels), expected)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
def test_psi_w_gradients_match_finite_differences(notion: str) -> None:
    k, l_ = 3, 3
    F, groups, labels = batch(10, k, l_, seed=4)
    prior = batch_prior(notion, groups, labels, k, l_)
    W = random_w(prior, seed=5)
    grads = psi_w_gradients(F, groups, W, prior, labels)
    h = 1e-6
    flat = W.reshape(-1)
    for j in range(flat.numel()):
        step = torch.zeros_like(flat)
        step[j] = h
        up = psi(F, groups, (flat + step).reshape(W.shape), prior, labels)
        down = psi(F, groups, (flat - step).reshape(W.shape), prior, labels)
        torch.testing.assert_close(grads.reshape(10, -1)[:, j], (up - down) / (2 * h), rtol=1e-6, atol=1e-8)


def _omega(prior: GroupPrior, groups: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """omega_i = (1/k) / p_b(s_i) per sample, 0 for inactive eopp samples (loop reference)."""
    k, l_ = prior.num_groups, prior.num_labels
    out = []
    for s, y in zip(groups.tolist(), labels.tolist(), strict=True):
        if prior.notion == "dp":
            out.append((1 / k) / prior.probs[s])
        elif prior.notion == "eo":
            out.append((1 / k) / prior.probs[y, s])
        else:
            out.append((1 / k) / prior.probs[l_ - 1, s] if y == l_ - 1 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_balanced_psi_is_the_weighted_psi_of_the_uniform_prior(notion: str, k: int, l_: int) -> None:
    F, groups, labels = batch(30, k, l_, seed=2)
    prior = balanced_prior(notion, groups, labels, k, l_)
    uniform_probs = np.full(prior.probs.shape, 1 / k)
    uniform = GroupPrior(notion, uniform_probs, num_labels=l_)
    W = random_w(prior, seed=3)
    omega = _omega(prior, groups, labels)
    torch.testing.assert_close(psi(F, groups, W, prior, labels), omega * psi(F, groups, W, uniform, labels))
    torch.testing.assert_close(
        psi_w_gradients(F, groups, W, prior, labels),
        omega.reshape(-1, *([1] * W.ndim)) * psi_w_gradients(F, groups, W, uniform, labels),
    )
    torch.testing.assert_close(
        psi_output_cotangents(groups, W, prior, labels),
        omega[:, None] * psi_output_cotangents(groups, W, uniform, labels),
    )
    assert torch.equal(
        psi_output_cotangents_checked(groups, W, prior, labels), psi_output_cotangents(groups, W, prior, labels)
    )
    expected = psi_w_gradients(F, groups, torch.zeros_like(W), prior, labels).sum(dim=0)
    torch.testing.assert_close(psi_w_sensitive_sum_checked(F, groups, prior, labels), expected)
