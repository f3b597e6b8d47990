"""Tests for protocols.fedsc: FedSC's losses (eqs. 1, 4, 5, 80), gradient alignment (eq. 6), the server algebra."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.protocols.fedsc import (
    aggregate,
    alpha_schedule,
    clip_rows,
    correlation,
    cross_trace,
    global_loss,
    local_loss,
    normalize_weights,
    others,
    spectral_contrastive_loss,
)

INPUT, H = 6, 4
COUNTS = (3, 5, 9)  # unequal |D_j|: q_j = n_j / n


def _frobenius_sq(matrix: torch.Tensor) -> torch.Tensor:
    return (matrix * matrix).sum()


def _naive_local_loss(z1: torch.Tensor, z2: torch.Tensor, alpha: float, rbar: torch.Tensor | None) -> torch.Tensor:
    """eq. 5 written out with explicit H x H matrices: the reference for the efficient form."""
    z = torch.cat([z1, z2])
    r = z.T @ z / z.shape[0]
    positive = torch.trace(z1.T @ z2) / z1.shape[0]
    loss = -positive + 0.5 * alpha * _frobenius_sq(r)
    return loss if rbar is None else loss + (1 - alpha) * torch.trace(r @ rbar.T)


@pytest.fixture
def clients() -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], list[float]]:
    """A linear encoder theta (H x INPUT) and three clients' two fixed views (full batch), float64."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(H, INPUT, generator=gen, dtype=torch.float64, requires_grad=True)
    # Label-skew-like: each client's inputs are shifted along its own direction, so the R_j differ.
    inputs = []
    for j, n in enumerate(COUNTS):
        shift = torch.zeros(INPUT, dtype=torch.float64)
        shift[j] = 2.0
        base = torch.randn(n, INPUT, generator=gen, dtype=torch.float64) + shift
        noise = [0.3 * torch.randn(n, INPUT, generator=gen, dtype=torch.float64) for _ in range(2)]
        inputs.append((base + noise[0], base + noise[1]))
    q = [n / sum(COUNTS) for n in COUNTS]
    return theta, inputs, q


def _encode(theta: torch.Tensor, inputs: list[tuple[torch.Tensor, torch.Tensor]]):
    return [(x1 @ theta.T, x2 @ theta.T) for x1, x2 in inputs]


def _correlations(views) -> list[torch.Tensor]:
    return [correlation(torch.cat([z1, z2])) for z1, z2 in views]


def _local_gradient_sum(theta, inputs, q, alphas, use_others: bool) -> torch.Tensor:
    """sum_j q_j grad L_j, with Rbar_-j from the server functions on the exact (detached) R_k."""
    views = _encode(theta, inputs)
    cache = {j: r.detach().numpy() for j, r in enumerate(_correlations(views))}
    total = aggregate(cache, dict(enumerate(COUNTS)))  # raw counts: aggregate normalizes them to q_j
    weights = normalize_weights(dict(enumerate(COUNTS)))
    loss = 0.0
    for j, (z1, z2) in enumerate(views):
        rbar = others(total, cache[j], weights[j]) if use_others else None
        loss = loss + q[j] * local_loss(z1, z2, alphas[j], rbar)
    (grad,) = torch.autograd.grad(loss, theta)
    return grad


def test_eq6_local_gradients_align_with_the_global_gradient(clients) -> None:
    theta, inputs, q = clients
    (global_grad,) = torch.autograd.grad(global_loss(_encode(theta, inputs), list(COUNTS)), theta)
    fedsc = _local_gradient_sum(theta, inputs, q, alphas=q, use_others=True)
    assert torch.allclose(fedsc, global_grad, atol=1e-10, rtol=0)
    assert global_grad.abs().max() > 1e-2  # not trivially zero


def test_fedavg_sc_gradients_do_not_align(clients) -> None:
    """alpha = 1 (FedAvg+SC): the same check fails, by a margin, under this skew."""
    theta, inputs, q = clients
    (global_grad,) = torch.autograd.grad(global_loss(_encode(theta, inputs), list(COUNTS)), theta)
    fedavg = _local_gradient_sum(theta, inputs, q, alphas=[1.0] * 3, use_others=False)
    gap = (fedavg - global_grad).norm() / global_grad.norm()
    assert gap > 0.2  # measured 0.94


def test_fedavg_sc_objective_is_global_plus_a_wrong_regularizer(clients) -> None:
    """sum_j q_j L_j(alpha = 1) = L + 1/2 sum_j q_j ||R_j - R||_F^2 (spec, "Objective")."""
    theta, inputs, q = clients
    with torch.no_grad():
        views = _encode(theta, inputs)
        local = sum(q[j] * spectral_contrastive_loss(z1, z2) for j, (z1, z2) in enumerate(views))
        rs = _correlations(views)
        r = sum(q[j] * rs[j] for j in range(3))
        regularizer = 0.5 * sum(q[j] * _frobenius_sq(rs[j] - r) for j in range(3))
        total = global_loss(views, q)
    assert float(local) == pytest.approx(float(total + regularizer), abs=1e-12)
    assert float(regularizer) > 1e-2  # the identity is not 0 = 0


def test_global_loss_matches_its_definition(clients) -> None:
    theta, inputs, q = clients
    with torch.no_grad():
        views = _encode(theta, inputs)
        rs = _correlations(views)
        positive = sum(q[j] * torch.trace(z1.T @ z2) / z1.shape[0] for j, (z1, z2) in enumerate(views))
        expected = -positive + 0.5 * _frobenius_sq(sum(q[j] * rs[j] for j in range(3)))
        assert float(global_loss(views, q)) == pytest.approx(float(expected), abs=1e-12)
        # weights are normalized: raw counts give the same loss
        assert float(global_loss(views, list(COUNTS))) == pytest.approx(float(expected), abs=1e-12)


@pytest.mark.parametrize(("batch", "size"), [(16, 5), (3, 20)], ids=["ZtZ-branch", "ZZt-branch"])
def test_efficient_form_equals_naive_form(batch: int, size: int) -> None:
    gen = torch.Generator().manual_seed(1)
    z1 = torch.randn(batch, size, generator=gen, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(batch, size, generator=gen, dtype=torch.float64, requires_grad=True)
    rbar = torch.randn(size, size, generator=gen, dtype=torch.float64)  # not symmetric, as a noised matrix
    for alpha, other in ((0.3, rbar), (1.0, None), (0.0, rbar.numpy())):
        fast = local_loss(z1, z2, alpha, other)
        slow = _naive_local_loss(z1, z2, alpha, None if other is None else rbar)
        assert fast.item() == pytest.approx(slow.item(), abs=1e-12)
        grads_fast = torch.autograd.grad(fast, (z1, z2))
        grads_slow = torch.autograd.grad(slow, (z1, z2))
        for a, b in zip(grads_fast, grads_slow, strict=True):
            assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_others_is_detached() -> None:
    gen = torch.Generator().manual_seed(2)
    z1 = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    rbar = torch.randn(3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    local_loss(z1, z2, 0.5, rbar).backward()
    assert z1.grad is not None
    assert rbar.grad is None  # held constant (stop gradient), as eq. 6 requires


def test_estimators() -> None:
    z1 = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    z2 = torch.tensor([[3.0, 1.0], [2.0, 2.0]])
    assert float(cross_trace(z1, z2)) == pytest.approx((5.0 - 2.0) / 2)
    assert torch.allclose(correlation(z1), torch.tensor([[0.5, 1.0], [1.0, 2.5]]))


def test_clip_rows() -> None:
    mu = 4.0
    z = torch.tensor([[3.0, 4.0], [0.6, 0.8], [0.0, 0.0], [-30.0, 40.0]], requires_grad=True)
    clipped = clip_rows(z, mu)
    norms = clipped.norm(dim=1)
    assert torch.allclose(norms[[0, 3]], torch.full((2,), math.sqrt(mu)))
    assert torch.equal(clipped[1:3], z[1:3])  # inside the ball: untouched, bit for bit
    assert torch.allclose(clipped[0], torch.tensor([1.2, 1.6]))
    clipped.sum().backward()
    assert torch.isfinite(z.grad).all()  # the zero row does not produce NaN
    assert torch.equal(z.grad[1], torch.ones(2))  # rows inside pass the gradient through unchanged
    assert float(z.grad[0] @ z[0].detach()) == pytest.approx(0.0, abs=1e-6)  # radial direction is flat on the sphere


def test_alpha_schedule_eq80() -> None:
    assert alpha_schedule(0, 200) == 1.0
    assert alpha_schedule(100, 200) == pytest.approx(0.6)
    assert alpha_schedule(200, 200) == pytest.approx(0.2)
    for t in (1, 37, 150):
        assert alpha_schedule(t, 200) == pytest.approx(1 - 0.8 * t / 200)
    assert alpha_schedule(5, 10, start=0.5, end=0.5) == 0.5
    with pytest.raises(ValueError, match="t must be"):
        alpha_schedule(201, 200)
    with pytest.raises(ValueError, match="total_rounds"):
        alpha_schedule(0, 0)
    with pytest.raises(ValueError, match="end must be in"):
        alpha_schedule(1, 10, end=-0.1)


def test_own_noise_cancels() -> None:
    """Rbar_-j for silo j does not depend on silo j's noise draw (Algorithm 1, line 20)."""
    rng = np.random.default_rng(3)
    clean = {j: (lambda a: a @ a.T / 5)(rng.normal(size=(6, 5))) for j in range(4)}
    weights = {0: 120.0, 1: 40.0, 2: 300.0, 3: 75.0}
    q = normalize_weights(weights)

    def noised(own_noise: np.ndarray) -> dict[int, np.ndarray]:
        noise = {j: np.random.default_rng(10 + j).normal(scale=0.5, size=(6, 6)) for j in clean}
        noise[2] = own_noise
        return {j: clean[j] + noise[j] for j in clean}

    first = noised(rng.normal(scale=0.5, size=(6, 6)))
    second = noised(rng.normal(scale=0.5, size=(6, 6)))
    bar_first = others(aggregate(first, weights), first[2], q[2])
    bar_second = others(aggregate(second, weights), second[2], q[2])
    assert np.max(np.abs(bar_first - bar_second)) < 1e-12
    expected = sum(q[k] * first[k] for k in (0, 1, 3)) / (1 - q[2])
    assert np.max(np.abs(bar_first - expected)) < 1e-12
    # another silo's view does change with silo 2's noise
    bar_other = others(aggregate(second, weights), second[0], q[0])
    assert np.max(np.abs(others(aggregate(first, weights), first[0], q[0]) - bar_other)) > 1e-3


def test_aggregate_normalizes_over_the_cached_clients() -> None:
    a, b = np.eye(2), 3 * np.eye(2)
    weights = {0: 1.0, 1: 3.0, 7: 100.0}  # client 7 has not shared yet: ignored
    total = aggregate({0: a, 1: torch.tensor(b)}, weights)
    assert total.dtype == np.float64
    assert np.allclose(total, 0.25 * a + 0.75 * b)


def test_bad_input_is_refused() -> None:
    z = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="others"):
        local_loss(z, z, 0.5)
    with pytest.raises(ValueError, match="alpha must be in"):
        local_loss(z, z, 1.5, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="H x H"):
        local_loss(z, z, 0.5, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="same shape"):
        local_loss(z, torch.zeros(4, 2), 1.0)
    with pytest.raises(ValueError, match="mu must be > 0"):
        clip_rows(z, 0.0)
    with pytest.raises(ValueError, match=r"weight \(q_j\) must be < 1"):
        others(np.eye(2), np.eye(2), 1.0)
    with pytest.raises(ValueError, match=r"must be > 0"):
        others(np.eye(2), np.eye(2), 0.0)
    with pytest.raises(ValueError, match="no entry for client"):
        aggregate({0: np.eye(2), 5: np.eye(2)}, {0: 1.0})
    with pytest.raises(ValueError, match="weights must be > 0"):
        aggregate({0: np.eye(2)}, {0: -1.0})
    with pytest.raises(ValueError, match="same H x H shape"):
        aggregate({0: np.eye(2), 1: np.eye(3)}, {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match="one entry per client"):
        global_loss([(z, z)], [0.5, 0.5])


def test_normalize_rows_puts_every_representation_on_the_sphere_of_radius_sqrt_mu() -> None:
    from silofl.protocols.fedsc import normalize_rows

    z = torch.tensor([[3.0, 4.0], [0.01, 0.0], [-2.0, 0.0]], requires_grad=True)
    out = normalize_rows(z, 4.0)
    assert torch.allclose(out.norm(dim=1), torch.full((3,), 2.0))
    assert torch.allclose(out[0], torch.tensor([1.2, 1.6]))
    out.sum().backward()  # differentiable
    assert torch.isfinite(z.grad).all()
    # a collapsed batch (every z the same) is the WORST value of the local loss once normalized, not a stationary
    # point with loss -1/2 as with unnormalized z
    same = normalize_rows(torch.ones(8, 4), 4.0)
    spread = normalize_rows(torch.eye(4).repeat(2, 1), 4.0)
    assert float(local_loss(same, same, 1.0)) > float(local_loss(spread, spread, 1.0))
    with pytest.raises(ValueError, match="mu"):
        normalize_rows(z, 0.0)
