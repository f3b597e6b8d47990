"""Tests for protocols/steffle/objective.py: psi against the spec formula, the maximiser W* and the ERMI it reaches
(Definition 3.1, eq. (5) for equalized odds, equal opportunity), empty blocks, and the group-balanced objective."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.protocols.fairness_prior import FAIRNESS_NOTIONS, GroupPrior
from silofl.protocols.steffle.gradients import psi_output_cotangents, psi_w_gradients
from silofl.protocols.steffle.objective import block_weights, ermi_objective, ermi_value, optimal_w, psi
from tests.steffle_cases import SHAPES, balanced_prior, batch, batch_prior, random_w


def _psi_reference(F, groups, W, prior, labels) -> torch.Tensor:
    """psi_i written out from the spec, one sample at a time (loops allowed in tests)."""
    k, l_ = prior.num_groups, prior.num_labels
    out = []
    for i in range(F.shape[0]):
        if prior.notion == "dp":
            Wb, p = W, prior.probs
        elif prior.notion == "eo":
            Wb, p = W[int(labels[i])], prior.probs[int(labels[i])]
        else:
            if int(labels[i]) != l_ - 1:
                out.append(torch.zeros((), dtype=F.dtype))
                continue
            Wb, p = W, prior.probs[l_ - 1]
        s = int(groups[i])
        quad = sum(Wb[r, u] ** 2 * F[i, u] for r in range(k) for u in range(l_))
        lin = sum(Wb[s, u] * F[i, u] for u in range(l_)) * 2.0 / math.sqrt(p[s])
        out.append(-quad + lin - 1.0)
    return torch.stack(out)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_psi_matches_the_spec_formula(notion: str, k: int, l_: int) -> None:
    F, groups, labels = batch(23, k, l_, seed=k * 10 + l_)
    prior = batch_prior(notion, groups, labels, k, l_)
    W = random_w(prior, seed=1)
    values = psi(F, groups, W, prior, labels)
    torch.testing.assert_close(values, _psi_reference(F, groups, W, prior, labels))
    if notion == "eopp":
        assert torch.all(values[labels != l_ - 1] == 0) and torch.all(values[labels == l_ - 1] != 0)
    a = psi_output_cotangents(groups, W, prior, labels)
    active = (labels == l_ - 1).double() if notion == "eopp" else torch.ones(23, dtype=torch.float64)
    torch.testing.assert_close((a * F).sum(1) - active, values)  # psi_i = <a_i, F_i> - 1


def _block_mass(F, groups, labels, prior) -> torch.Tensor:
    """M[b, u] = sum over the samples of block b of F_iu (loop reference)."""
    l_ = prior.num_labels
    M = torch.zeros(prior.blocks(), l_, dtype=F.dtype)
    for i in range(F.shape[0]):
        if prior.notion == "dp":
            M[0] += F[i]
        elif prior.notion == "eo":
            M[int(labels[i])] += F[i]
        elif int(labels[i]) == l_ - 1:
            M[0] += F[i]
    return M


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_optimal_w_is_the_maximiser_and_gives_ermi(notion: str, k: int, l_: int) -> None:
    n = 40
    F, groups, labels = batch(n, k, l_, seed=7)
    prior = batch_prior(notion, groups, labels, k, l_)
    w_star = optimal_w(F, groups, prior, labels).requires_grad_(True)
    best = ermi_objective(F, groups, w_star, prior, labels)
    (gradient,) = torch.autograd.grad(best, w_star)
    assert float(gradient.abs().max()) < 1e-12  # stationary point of a concave quadratic
    value = (block_weights(groups, prior, labels, dtype=torch.float64) * ermi_value(F, groups, prior, labels)).sum()
    torch.testing.assert_close(best.detach(), value)
    # mean psi is exactly quadratic in W: mean psi(W* + D) = mean psi(W*) - (1/n) sum_{b,r,u} D_bru^2 M_bu
    mass = _block_mass(F, groups, labels, prior)
    gen = torch.Generator().manual_seed(11)
    for _ in range(10):
        delta = torch.randn(prior.w_shape(), generator=gen, dtype=torch.float64)
        moved = ermi_objective(F, groups, w_star.detach() + delta, prior, labels)
        drop = (delta.reshape(prior.blocks(), k, l_) ** 2 * mass[:, None, :]).sum() / n
        torch.testing.assert_close(moved, best.detach() - drop)
        assert moved < best


def _ermi_definition(F: np.ndarray, groups: np.ndarray, p_s: np.ndarray) -> float:
    """Definition 3.1 with soft predictions, written out with explicit sums."""
    n, l_ = F.shape
    total = 0.0
    for u in range(l_):
        p_u = F[:, u].sum() / n
        for r in range(p_s.shape[0]):
            p_ur = F[groups == r, u].sum() / n
            total += p_ur**2 / (p_u * p_s[r])
    return total - 1.0


@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_ermi_value_matches_definition_3_1(k: int, l_: int) -> None:
    F, groups, labels = batch(30, k, l_, seed=8)
    prior = batch_prior("dp", groups, labels, k, l_)
    value = ermi_value(F, groups, prior)
    assert value.shape == (1,)
    assert float(value[0]) == pytest.approx(_ermi_definition(F.numpy(), groups.numpy(), prior.probs), rel=1e-12)
    assert float(value[0]) > 1e-3  # random predictions depend on s a little
    w_star = optimal_w(F, groups, prior)
    for r in range(k):
        for u in range(l_):
            p_ur = float(F[groups == r, u].sum()) / 30
            p_u = float(F[:, u].sum()) / 30
            assert float(w_star[r, u]) == pytest.approx(p_ur / (math.sqrt(prior.probs[r]) * p_u), rel=1e-12)


@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_ermi_is_zero_iff_predictions_are_independent_of_s(k: int, l_: int) -> None:
    # Every group (and, for eo, every (label, group) cell) sees the same multiset of prediction rows.
    base = torch.softmax(torch.randn(5, l_, generator=torch.Generator().manual_seed(9), dtype=torch.float64), 1)
    F = base.repeat(k * l_, 1)
    cells = torch.arange(k * l_).repeat_interleave(5)
    groups, labels = cells // l_, cells % l_
    for notion in FAIRNESS_NOTIONS:
        prior = batch_prior(notion, groups, labels, k, l_)
        values = ermi_value(F, groups, prior, labels)
        torch.testing.assert_close(values, torch.zeros_like(values), atol=1e-12, rtol=0)
        w_star = optimal_w(F, groups, prior, labels).reshape(prior.blocks(), k, l_)
        torch.testing.assert_close(  # independent: W*_ru = p(r) / sqrt(p(r)) = sqrt(p_S(r))
            w_star, torch.from_numpy(np.sqrt(prior.block_probs()))[:, :, None].expand_as(w_star)
        )
    # Make group 0's predictions different from the others': ERMI becomes > 0 for every notion.
    F_dep = F.clone()
    F_dep[groups == 0] = torch.softmax(torch.log(F_dep[groups == 0]) + torch.linspace(0, 2, l_, dtype=F.dtype), 1)
    for notion in FAIRNESS_NOTIONS:
        prior = batch_prior(notion, groups, labels, k, l_)
        assert torch.all(ermi_value(F_dep, groups, prior, labels) > 1e-3)


def _eq5(F: np.ndarray, groups: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Eq. (5) of the DP-FERMI paper (Appendix B) with soft predictions and empirical p(y), p(r|y)."""
    n, l_ = F.shape
    total = 0.0
    for y in range(l_):
        rows = labels == y
        n_y = rows.sum()
        for j in range(l_):
            p_j = F[rows, j].sum() / n_y
            for r in range(k):
                p_r = (rows & (groups == r)).sum() / n_y
                p_jr = F[rows & (groups == r), j].sum() / n_y
                total += p_jr**2 / (p_j * p_r) * (n_y / n)
    return total - 1.0


@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_equalized_odds_blocks_add_up_to_eq_5(k: int, l_: int) -> None:
    n = 48
    F, groups, labels = batch(n, k, l_, seed=12)
    prior = batch_prior("eo", groups, labels, k, l_)
    weights = block_weights(groups, prior, labels, dtype=torch.float64)
    torch.testing.assert_close(weights, torch.bincount(labels, minlength=l_).double() / n)  # p(y)
    eq5 = _eq5(F.numpy(), groups.numpy(), labels.numpy(), k)
    assert float((weights * ermi_value(F, groups, prior, labels)).sum()) == pytest.approx(eq5, rel=1e-12)
    w_star = optimal_w(F, groups, prior, labels)
    assert float(ermi_objective(F, groups, w_star, prior, labels)) == pytest.approx(eq5, rel=1e-12)
    # For any W, the eo objective averaged over all n is sum_y p(y) * (dp objective of block y on its own samples).
    W = random_w(prior, seed=13)
    blockwise = 0.0
    for y in range(l_):
        rows = labels == y
        dp_y = GroupPrior("dp", prior.probs[y], num_labels=l_)
        blockwise += float(rows.sum()) / n * float(ermi_objective(F[rows], groups[rows], W[y], dp_y))
    assert float(ermi_objective(F, groups, W, prior, labels)) == pytest.approx(blockwise, rel=1e-12)


def test_equal_opportunity_is_the_positive_block_weighted_by_its_frequency() -> None:
    k, l_, n = 3, 2, 36
    F, groups, labels = batch(n, k, l_, seed=14)
    eopp = batch_prior("eopp", groups, labels, k, l_)
    eo = batch_prior("eo", groups, labels, k, l_)
    W = random_w(eopp, seed=15)
    W_eo = torch.stack([torch.zeros_like(W), W])  # only the positive label's block
    # eopp = the eo objective restricted to the positive block, with the other samples' psi (and -1) dropped
    eo_psi = psi(F, groups, W_eo, eo, labels)
    torch.testing.assert_close(psi(F, groups, W, eopp, labels), torch.where(labels == 1, eo_psi, 0.0))
    p_pos = float((labels == 1).double().mean())
    torch.testing.assert_close(block_weights(groups, eopp, labels, dtype=torch.float64), torch.tensor([p_pos]).double())
    assert float(ermi_value(F, groups, eopp, labels)[0]) == pytest.approx(float(ermi_value(F, groups, eo, labels)[1]))
    grads = psi_w_gradients(F, groups, W, eopp, labels)
    assert torch.all(grads[labels == 0] == 0)


def test_empty_blocks_and_empty_columns_give_zero() -> None:
    F = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [0.9, 0.1, 0.0]], dtype=torch.float64)
    groups = torch.tensor([0, 1, 1])
    labels = torch.tensor([0, 0, 1])  # label 2 has no sample in the batch
    prior = GroupPrior("eo", np.full((3, 2), 0.5))
    w_star = optimal_w(F, groups, prior, labels)
    assert torch.all(w_star[2] == 0)  # empty block
    assert torch.all(w_star[:, :, 2] == 0)  # no prediction mass on label 2
    values = ermi_value(F, groups, prior, labels)
    assert float(values[2]) == 0.0 and torch.isfinite(values).all()
    assert ermi_value(F[:0], groups[:0], prior, labels[:0]).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="empty batch"):
        ermi_objective(F[:0], groups[:0], w_star, prior, labels[:0])


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_balanced_optimal_w_is_the_maximiser_and_gives_its_ermi(notion: str, k: int, l_: int) -> None:
    F, groups, labels = batch(40, k, l_, seed=7)
    prior = balanced_prior(notion, groups, labels, k, l_)
    w_star = optimal_w(F, groups, prior, labels).requires_grad_(True)
    best = ermi_objective(F, groups, w_star, prior, labels)
    (gradient,) = torch.autograd.grad(best, w_star)
    assert float(gradient.abs().max()) < 1e-12
    value = (block_weights(groups, prior, labels, dtype=torch.float64) * ermi_value(F, groups, prior, labels)).sum()
    torch.testing.assert_close(best.detach(), value)


def test_balanced_ermi_weighs_every_group_alike() -> None:
    """Hard predictions, prior = the data's frequencies: the balanced maximum is sum_{u,r} (1/k) p(u|r)^2 / q(u) - 1
    with q(u) = mean_r p(u|r), and a gap in a small group counts as much as one in a large group."""
    k = 3
    sizes, rates = [600, 30, 30], [0.2, 0.5, 0.2]  # the small group 1 predicts positive more often
    groups = torch.tensor([r for r in range(k) for _ in range(sizes[r])])
    positive = torch.cat([torch.arange(sizes[r]) < round(rates[r] * sizes[r]) for r in range(k)])
    F = torch.stack([1.0 - positive.double(), positive.double()], dim=1)
    counts = np.array([[s / 2, s / 2] for s in sizes], dtype=np.float64)  # dp uses the row sums only
    prior = GroupPrior.from_counts("dp", counts)
    balanced = GroupPrior.from_counts("dp", counts, balanced=True)
    q1 = float(np.mean(rates))
    expected = sum((1 / k) * (r**2 / q1 + (1 - r) ** 2 / (1 - q1)) for r in rates) - 1
    assert float(ermi_value(F, groups, balanced)[0]) == pytest.approx(expected, rel=1e-9)
    p1 = float(np.dot(sizes, rates) / sum(sizes))
    papers = (
        sum((s / sum(sizes)) * (r**2 / p1 + (1 - r) ** 2 / (1 - p1)) for s, r in zip(sizes, rates, strict=True)) - 1
    )
    assert float(ermi_value(F, groups, prior)[0]) == pytest.approx(papers, rel=1e-6)
    assert expected > 4 * papers  # the small group's gap hardly registers in the papers' ERMI
