"""Tests for protocols.steffle: the ERMI objective, its maximiser, per-sample gradients, clipping and projection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.protocols.models import build_model, parameter_spec
from silofl.protocols.steffle import (
    FAIRNESS_NOTIONS,
    GroupPrior,
    block_weights,
    clipped_psi_theta_sum,
    ermi_objective,
    ermi_value,
    optimal_w,
    project_frobenius,
    psi,
    psi_output_cotangents,
    psi_output_cotangents_checked,
    psi_theta_gradients,
    psi_w_gradients,
    psi_w_sensitive_sum_checked,
    w_shape,
)
from tests.generic_module import NotTabular

SHAPES = [(2, 2), (3, 3), (3, 2), (2, 4)]  # (k groups, l labels)


def _batch(n: int, k: int, l_: int, seed: int = 0, dtype: torch.dtype = torch.float64):
    """Random soft predictions, groups and labels; every (group, label) cell is non-empty."""
    g = torch.Generator().manual_seed(seed)
    F = torch.softmax(2.0 * torch.randn(n, l_, generator=g, dtype=dtype), dim=1)
    cells = torch.arange(k * l_).repeat(n // (k * l_) + 1)[:n]
    cells = cells[torch.randperm(n, generator=g)]
    return F, cells // l_, cells % l_


def _counts(groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> np.ndarray:
    counts = np.zeros((k, l_))
    np.add.at(counts, (groups.numpy(), labels.numpy()), 1)
    return counts


def _prior(notion: str, groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> GroupPrior:
    """The batch's own (conditional) group frequencies."""
    return GroupPrior.from_counts(notion, _counts(groups, labels, k, l_))


def _random_w(prior: GroupPrior, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(prior.w_shape(), generator=torch.Generator().manual_seed(seed), dtype=dtype)


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


# --------------------------------------------------------------------------------------------------------------------
# GroupPrior and shapes


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


# --------------------------------------------------------------------------------------------------------------------
# psi and its W-gradients


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_psi_matches_the_spec_formula(notion: str, k: int, l_: int) -> None:
    F, groups, labels = _batch(23, k, l_, seed=k * 10 + l_)
    prior = _prior(notion, groups, labels, k, l_)
    W = _random_w(prior, seed=1)
    values = psi(F, groups, W, prior, labels)
    torch.testing.assert_close(values, _psi_reference(F, groups, W, prior, labels))
    if notion == "eopp":
        assert torch.all(values[labels != l_ - 1] == 0) and torch.all(values[labels == l_ - 1] != 0)
    a = psi_output_cotangents(groups, W, prior, labels)
    active = (labels == l_ - 1).double() if notion == "eopp" else torch.ones(23, dtype=torch.float64)
    torch.testing.assert_close((a * F).sum(1) - active, values)  # psi_i = <a_i, F_i> - 1


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_psi_w_gradients_match_autograd_per_sample(notion: str, k: int, l_: int) -> None:
    F, groups, labels = _batch(13, k, l_, seed=3)
    prior = _prior(notion, groups, labels, k, l_)
    W = _random_w(prior, seed=2).requires_grad_(True)
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
        F, groups, labels = _batch(256 + seed, k, l_, seed=seed, dtype=dtype)
        prior = _prior(notion, groups, labels, k, l_)
        W = _random_w(prior, seed=seed + 7, dtype=dtype)
        assert torch.equal(
            psi_output_cotangents_checked(groups, W, prior, labels), psi_output_cotangents(groups, W, prior, labels)
        )
        expected = psi_w_gradients(F, groups, torch.zeros_like(W), prior, labels).sum(dim=0)
        assert torch.equal(psi_w_sensitive_sum_checked(F, groups, prior, labels), expected)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
def test_psi_w_gradients_match_finite_differences(notion: str) -> None:
    k, l_ = 3, 3
    F, groups, labels = _batch(10, k, l_, seed=4)
    prior = _prior(notion, groups, labels, k, l_)
    W = _random_w(prior, seed=5)
    grads = psi_w_gradients(F, groups, W, prior, labels)
    h = 1e-6
    flat = W.reshape(-1)
    for j in range(flat.numel()):
        step = torch.zeros_like(flat)
        step[j] = h
        up = psi(F, groups, (flat + step).reshape(W.shape), prior, labels)
        down = psi(F, groups, (flat - step).reshape(W.shape), prior, labels)
        torch.testing.assert_close(grads.reshape(10, -1)[:, j], (up - down) / (2 * h), rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------------------------------------------------
# The inner maximisation: W*, ERMI, equalized odds


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
    F, groups, labels = _batch(n, k, l_, seed=7)
    prior = _prior(notion, groups, labels, k, l_)
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
    F, groups, labels = _batch(30, k, l_, seed=8)
    prior = _prior("dp", groups, labels, k, l_)
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
        prior = _prior(notion, groups, labels, k, l_)
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
        prior = _prior(notion, groups, labels, k, l_)
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
    F, groups, labels = _batch(n, k, l_, seed=12)
    prior = _prior("eo", groups, labels, k, l_)
    weights = block_weights(groups, prior, labels, dtype=torch.float64)
    torch.testing.assert_close(weights, torch.bincount(labels, minlength=l_).double() / n)  # p(y)
    eq5 = _eq5(F.numpy(), groups.numpy(), labels.numpy(), k)
    assert float((weights * ermi_value(F, groups, prior, labels)).sum()) == pytest.approx(eq5, rel=1e-12)
    w_star = optimal_w(F, groups, prior, labels)
    assert float(ermi_objective(F, groups, w_star, prior, labels)) == pytest.approx(eq5, rel=1e-12)
    # For any W, the eo objective averaged over all n is sum_y p(y) * (dp objective of block y on its own samples).
    W = _random_w(prior, seed=13)
    blockwise = 0.0
    for y in range(l_):
        rows = labels == y
        dp_y = GroupPrior("dp", prior.probs[y], num_labels=l_)
        blockwise += float(rows.sum()) / n * float(ermi_objective(F[rows], groups[rows], W[y], dp_y))
    assert float(ermi_objective(F, groups, W, prior, labels)) == pytest.approx(blockwise, rel=1e-12)


def test_equal_opportunity_is_the_positive_block_weighted_by_its_frequency() -> None:
    k, l_, n = 3, 2, 36
    F, groups, labels = _batch(n, k, l_, seed=14)
    eopp = _prior("eopp", groups, labels, k, l_)
    eo = _prior("eo", groups, labels, k, l_)
    W = _random_w(eopp, seed=15)
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


# --------------------------------------------------------------------------------------------------------------------
# theta-gradients


MODELS = [("logreg", 2, 2), ("logreg", 3, 3), ("mlp", 3, 2), ("mlp", 2, 4)]  # (kind, k, l)


def _autograd_theta_rows(model, x, groups, W, prior, labels) -> torch.Tensor:
    """Reference: autograd of the scalar psi_i through the model, one record at a time, flattened (n, P)."""
    params = list(model.parameters())
    rows = []
    for i in range(x.shape[0]):
        F_i = torch.softmax(model(x[i : i + 1]), dim=1)
        lab = None if labels is None else labels[i : i + 1]
        value = psi(F_i, groups[i : i + 1], W, prior, lab)[0]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params, allow_unused=True)]))
    return torch.stack(rows)


def _model_batch(kind: str, k: int, l_: int, n: int, seed: int, dtype=torch.float32):
    model = build_model(kind, 5, l_, hidden=4, seed=seed)
    if dtype == torch.float64:
        model = model.double()
    gen = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(n, 5, generator=gen, dtype=dtype)
    _, groups, labels = _batch(n, k, l_, seed=seed)
    return model, x, groups, labels


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_psi_theta_gradients_match_autograd_per_sample(notion: str, kind: str, k: int, l_: int) -> None:
    model, x, groups, labels = _model_batch(kind, k, l_, 11, seed=21)
    prior = _prior(notion, groups, labels, k, l_)
    W = _random_w(prior, seed=22, dtype=torch.float32)
    grads = psi_theta_gradients(model, x, groups, W, prior, labels)
    assert list(grads) == [name for name, _ in parameter_spec(model)]
    for (_, shape), g in zip(parameter_spec(model), grads.values(), strict=True):
        assert g.shape == (11, *shape) and g.dtype == torch.float32
    flat = torch.cat([g.reshape(11, -1) for g in grads.values()], dim=1)
    torch.testing.assert_close(flat, _autograd_theta_rows(model, x, groups, W, prior, labels), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_psi_theta_gradients_match_finite_differences(kind: str, k: int, l_: int) -> None:
    n = k * l_  # one record per (group, label) cell
    model, x, groups, labels = _model_batch(kind, k, l_, n, seed=23, dtype=torch.float64)
    prior = _prior("eo", groups, labels, k, l_)
    W = _random_w(prior, seed=24)
    flat = torch.cat([g.reshape(n, -1) for g in psi_theta_gradients(model, x, groups, W, prior, labels).values()], 1)
    h = 1e-6
    for param in model.parameters():
        base = param.detach().clone()
        for j in range(param.numel()):
            with torch.no_grad():
                param.view(-1)[j] = base.view(-1)[j] + h
                up = psi(torch.softmax(model(x), 1), groups, W, prior, labels)
                param.view(-1)[j] = base.view(-1)[j] - h
                down = psi(torch.softmax(model(x), 1), groups, W, prior, labels)
                param.copy_(base)
            column = sum(p.numel() for p in list(model.parameters())[: _index(model, param)]) + j
            torch.testing.assert_close(flat[:, column], (up - down) / (2 * h), rtol=1e-5, atol=1e-8)


def _index(model: torch.nn.Module, param: torch.nn.Parameter) -> int:
    return next(i for i, p in enumerate(model.parameters()) if p is param)


def test_binary_logreg_gradient_is_the_sigmoid_chain_rule() -> None:
    # F = (1 - sigma(z), sigma(z)), so d psi_i / d theta = (a_i1 - a_i0) sigma(z_i) (1 - sigma(z_i)) [x_i, 1].
    model, x, groups, labels = _model_batch("logreg", 2, 2, 9, seed=25, dtype=torch.float64)
    prior = _prior("dp", groups, labels, 2, 2)
    W = _random_w(prior, seed=26)
    z = (x @ model.head.weight.detach().T + model.head.bias.detach())[:, 0]
    sig = torch.sigmoid(z)
    torch.testing.assert_close(torch.softmax(model(x), 1), torch.stack([1 - sig, sig], dim=1))
    a = psi_output_cotangents(groups, W, prior)
    coef = (a[:, 1] - a[:, 0]) * sig * (1 - sig)
    grads = psi_theta_gradients(model, x, groups, W, prior)
    torch.testing.assert_close(grads["head.weight"][:, 0, :], coef[:, None] * x)
    torch.testing.assert_close(grads["head.bias"][:, 0], coef)


# --------------------------------------------------------------------------------------------------------------------
# Clipped sums: the Linear-stack fast path against the torch.func route


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_clipped_sum_fast_path_matches_torch_func_route(notion: str, kind: str, k: int, l_: int) -> None:
    model, x, groups, labels = _model_batch(kind, k, l_, 24, seed=31)
    prior = _prior(notion, groups, labels, k, l_)
    W = _random_w(prior, seed=32, dtype=torch.float32)
    rows = torch.cat([g.reshape(24, -1) for g in psi_theta_gradients(model, x, groups, W, prior, labels).values()], 1)
    norms = torch.linalg.vector_norm(rows, dim=1)
    active = norms > 0
    assert int(active.sum()) >= 4
    positive = norms[active]
    cases = {  # clip -> how many active rows it clips
        "none": (float(positive.max()) * 1.01, 0),
        "some": (float(positive.median()), None),
        "all": (float(positive.min()) * 0.99, int(active.sum())),
    }
    for clip, clipped in cases.values():
        reference = (rows * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)[:, None]).sum(0)
        fast = clipped_psi_theta_sum(model, x, groups, W, prior, clip, labels)
        slow = clipped_psi_theta_sum(NotTabular(model), x, groups, W, prior, clip, labels)
        assert fast.shape == (rows.shape[1],) and fast.dtype == torch.float32
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(slow, reference, rtol=1e-5, atol=1e-6)
        n_clipped = int((norms > clip).sum())
        if clipped is not None:
            assert n_clipped == clipped
        else:
            assert 0 < n_clipped < int(active.sum())


def test_clipped_sum_respects_the_bound_per_record() -> None:
    model, x, groups, labels = _model_batch("mlp", 2, 3, 16, seed=33)
    prior = _prior("dp", groups, labels, 2, 3)
    W = 3.0 * _random_w(prior, seed=34, dtype=torch.float32)
    clip = 0.05
    for i in range(16):  # one record's contribution is its clipped gradient: norm <= C, == C when it was clipped
        single = clipped_psi_theta_sum(model, x[i : i + 1], groups[i : i + 1], W, prior, clip)
        assert float(torch.linalg.vector_norm(single)) == pytest.approx(clip, rel=1e-5)
    total = clipped_psi_theta_sum(model, x, groups, W, prior, clip)
    assert float(torch.linalg.vector_norm(total)) <= 16 * clip * (1 + 1e-5)
    empty = clipped_psi_theta_sum(model, x[:0], groups[:0], W, prior, clip)
    assert empty.shape == total.shape and torch.all(empty == 0)
    with pytest.raises(ValueError, match="clip must be a finite number > 0"):
        clipped_psi_theta_sum(model, x, groups, W, prior, 0.0)


# --------------------------------------------------------------------------------------------------------------------
# Projection, dtypes and input validation


def test_project_frobenius() -> None:
    W = torch.tensor([[0.3, -0.4], [0.0, 0.0]])  # norm 0.5
    inside = project_frobenius(W, 1.0)
    assert torch.equal(inside, W) and inside is not W
    assert torch.equal(project_frobenius(W, 0.5), W)  # on the sphere: unchanged
    outside = project_frobenius(W, 0.1)
    assert float(torch.linalg.vector_norm(outside)) == pytest.approx(0.1, rel=1e-6)
    torch.testing.assert_close(outside, W * 0.2)  # same direction
    blocks = torch.randn(3, 2, 3, generator=torch.Generator().manual_seed(40)) * 10  # eo: the whole tensor is projected
    projected = project_frobenius(blocks, 2.0)
    assert float(torch.linalg.vector_norm(projected)) == pytest.approx(2.0, rel=1e-6)
    assert float(projected.abs().max()) <= 2.0
    with pytest.raises(ValueError, match="radius must be a finite number > 0"):
        project_frobenius(W, -1.0)


def test_float32_in_float32_out() -> None:
    F, groups, labels = _batch(12, 2, 3, seed=41, dtype=torch.float32)
    prior = _prior("eo", groups, labels, 2, 3)
    W = _random_w(prior, seed=42, dtype=torch.float32)
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


def test_model_and_prior_must_agree_on_labels() -> None:
    model = build_model("logreg", 4, 3, seed=0)
    prior = GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)
    x, groups = torch.randn(3, 4), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="3 logits per record but the prior has num_labels=2"):
        psi_theta_gradients(model, x, groups, torch.zeros(2, 2), prior)
    with pytest.raises(ValueError, match="3 logits per record"):
        clipped_psi_theta_sum(model, x, groups, torch.zeros(2, 2), prior, 1.0)
    with pytest.raises(ValueError, match="x has 2 rows but groups has 3"):
        clipped_psi_theta_sum(build_model("logreg", 4, 2), x[:2], groups, torch.zeros(2, 2), prior, 1.0)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize("l_", [2, 3])
def test_logreg_clipped_sum_without_backward_pass_gives_autograds_bits(notion: str, l_: int) -> None:
    """Logistic regression's theta-sum from the closed-form logit gradients (`psi_logit_grads`, no backward pass)
    equals the backward pass of sum_i <a_i, F(x_i)> (`linear_stack_clipped_sum`) bit for bit, at a SteFFLe round's
    batch size, with every row clipped, some, and none."""
    from silofl.protocols.models import linear_stack_clipped_sum

    for seed in range(4):
        model = build_model("logreg", 102, l_, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        n = 256 + seed
        x = torch.randn(n, 102, generator=gen) * (1 + seed)
        groups = torch.randint(0, 3, (n,), generator=gen)
        labels = torch.randint(0, l_, (n,), generator=gen)
        prior = _prior(notion, groups, labels, 3, l_)
        W = _random_w(prior, seed=seed, dtype=torch.float32)
        a = psi_output_cotangents(groups, W, prior, labels)

        def total(logits: torch.Tensor, a: torch.Tensor = a) -> torch.Tensor:
            return (a * torch.softmax(logits, -1)).sum()

        for clip in (1e-4, 0.05, 1e6):
            expected = linear_stack_clipped_sum(model, x, total, clip)
            assert torch.equal(clipped_psi_theta_sum(model, x, groups, W, prior, clip, labels), expected)


# --------------------------------------------------------------------------------------------------------------------
# The group-balanced objective (issue 20)


def _balanced(notion: str, groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> GroupPrior:
    """A prior far from uniform (not the batch's frequencies), balanced."""
    counts = _counts(groups, labels, k, l_) * np.linspace(1.0, 6.0, k)[:, None]
    return GroupPrior.from_counts(notion, counts, balanced=True)


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
    F, groups, labels = _batch(30, k, l_, seed=2)
    prior = _balanced(notion, groups, labels, k, l_)
    uniform_probs = np.full(prior.probs.shape, 1 / k)
    uniform = GroupPrior(notion, uniform_probs, num_labels=l_)
    W = _random_w(prior, seed=3)
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


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("k", "l_"), SHAPES)
def test_balanced_optimal_w_is_the_maximiser_and_gives_its_ermi(notion: str, k: int, l_: int) -> None:
    F, groups, labels = _batch(40, k, l_, seed=7)
    prior = _balanced(notion, groups, labels, k, l_)
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
