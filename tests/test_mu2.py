"""Tests for protocols/mu2.py: constants, privacy units, calibration, the iteration and the reference run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from silofl.protocols.mu2 import (
    Mu2Constants,
    accountant_epsilon,
    calibrate,
    epsilon_to_rho,
    eta,
    logreg_accuracy,
    logreg_dim,
    logreg_grad,
    logreg_loss,
    noise_multiplier,
    noise_seed,
    project_ball,
    rho_to_epsilon,
    run_mu2_reference,
    sensitivity,
    server_step,
    sigma_trusted,
    sigma_untrusted,
    silo_step,
)

MNIST = Mu2Constants.for_logreg(784, 10, D=0.1)


# ---------------------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------------------


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


def test_closed_form_gradient_matches_silofl_torch_model() -> None:
    import torch

    from silofl.protocols.models import build_model, get_parameters, loss_fn

    rng = np.random.default_rng(1)
    for classes in (2, 4):
        model = build_model("logreg", 6, classes, seed=3)
        params = np.concatenate([v.ravel() for v in get_parameters(model).values()]).astype(np.float64)
        assert params.shape == (logreg_dim(6, classes),)
        a = rng.random((5, 6)).astype(np.float32)
        y = rng.integers(classes, size=5)
        logits = model(torch.from_numpy(a))
        loss = loss_fn(logits, torch.from_numpy(y))
        model.zero_grad()
        loss.backward()
        expected = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
        np.testing.assert_allclose(logreg_grad(params, a, y, classes), expected, atol=1e-6)
        assert logreg_loss(params, a, y, classes) == pytest.approx(loss.item(), abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Privacy units and accounting
# ---------------------------------------------------------------------------------------------------------------------


def test_rho_epsilon_conversion() -> None:
    # The spec: rho in {4, 8, 16} is eps of about 27, 70, 205 at delta = 1e-5.
    assert [round(rho_to_epsilon(r, 1e-5), 1) for r in (4, 8, 16)] == [27.2, 70.4, 204.8]
    assert rho_to_epsilon(1.0, 1e-5) == pytest.approx(0.5 + math.sqrt(2 * math.log(1e5)))
    for rho in (1e-6, 0.3, 4.0, 16.0, 1e3):
        for delta in (1e-9, 1e-5, 0.1):
            assert epsilon_to_rho(rho_to_epsilon(rho, delta), delta) == pytest.approx(rho, rel=1e-12)
    assert epsilon_to_rho(27.19, 1e-5) == pytest.approx(
        math.sqrt(2 * math.log(1e5) + 2 * 27.19) - math.sqrt(2 * math.log(1e5))
    )
    assert rho_to_epsilon(math.inf, 1e-5) == math.inf and epsilon_to_rho(math.inf, 1e-5) == math.inf
    with pytest.raises(ValueError, match="delta must be in"):
        rho_to_epsilon(4.0, 1.0)
    with pytest.raises(ValueError, match="rho must be a positive"):
        rho_to_epsilon(-1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon must be a positive"):
        epsilon_to_rho(0.0, 1e-5)


@pytest.mark.parametrize(("rho", "rounds"), [(4.0, 60_000), (8.0, 6_000), (16.0, 600), (0.5, 100)])
def test_dp_accounting_is_at_most_the_closed_form(rho: float, rounds: int) -> None:
    closed = rho_to_epsilon(rho, 1e-5)
    accounted = accountant_epsilon(noise_multiplier(rho, rounds), rounds, 1e-5)
    assert accounted <= closed
    assert accounted >= 0.85 * closed  # the same RDP curve; only the RDP -> DP conversion is tighter
    # T Gaussian releases with multiplier z are one release with multiplier z / sqrt(T) (RDP adds up).
    assert accounted == pytest.approx(accountant_epsilon(1.0 / rho, 1, 1e-5), rel=1e-9)


def test_noise_and_step_size_follow_theorems_5_2_and_6_2() -> None:
    S, d = MNIST.S, MNIST.dim
    assert sigma_untrusted(S, 60_000, 4.0) == pytest.approx(2 * S * math.sqrt(60_000) / 4)
    assert sigma_trusted(S, 600, 4.0, 100) == pytest.approx(2 * S * math.sqrt(600) / (4 * 100))
    assert sigma_untrusted(S, 600, 4.0, batch_size=8) == pytest.approx(sigma_untrusted(S, 600, 4.0) / 8)
    assert sigma_untrusted(S, 600, math.inf) == 0.0
    # M = 1, T = 60000, rho = 4: the privacy term is the smaller one.
    e = eta(MNIST, num_rounds=60_000, num_silos=1, rho=4.0, trusted=False)
    assert e == pytest.approx(4.0 * 0.1 / (2 * S * 60_000 * math.sqrt(d)), rel=1e-12)
    assert e < 1 / (4 * MNIST.L * 60_000)
    # M = 1: trusted and untrusted coincide (the paper's remark under Table 2).
    assert eta(MNIST, num_rounds=60_000, num_silos=1, rho=4.0, trusted=True) == pytest.approx(e, rel=1e-12)
    # M = 10, T = 6000, rho = 8, untrusted: rho D sqrt(M) / (2 S T sqrt(d)).
    assert eta(MNIST, num_rounds=6_000, num_silos=10, rho=8.0, trusted=False) == pytest.approx(
        8.0 * 0.1 * math.sqrt(10) / (2 * S * 6_000 * math.sqrt(d)), rel=1e-12
    )
    # M = 100, T = 600, rho = 16: the smoothness cap 1/(4 L T) binds (untrusted and trusted).
    for trusted in (False, True):
        assert eta(MNIST, num_rounds=600, num_silos=100, rho=16.0, trusted=trusted) == 1 / (4 * 392.5 * 600)
    # M = 100, T = 600, rho = 4 untrusted: still the privacy term, which the trusted rule multiplies by sqrt(M).
    untrusted = eta(MNIST, num_rounds=600, num_silos=100, rho=4.0, trusted=False)
    assert untrusted == pytest.approx(4.0 * 0.1 * 10 / (2 * S * 600 * math.sqrt(d)), rel=1e-12)
    assert eta(MNIST, num_rounds=60, num_silos=1, rho=math.inf, trusted=False) == 1 / (4 * 392.5 * 60)
    # Minibatch: the noise on qbar shrinks by b, so the privacy term grows by b.
    small = Mu2Constants(G=1.0, L=1e-9, D=1.0, dim=100)
    assert eta(small, num_rounds=50, num_silos=4, rho=2.0, trusted=False, batch_size=5) == pytest.approx(
        5 * eta(small, num_rounds=50, num_silos=4, rho=2.0, trusted=False), rel=1e-12
    )


@pytest.mark.parametrize("trusted", [False, True])
def test_calibration_is_consistent(trusted: bool) -> None:
    cal = calibrate(MNIST, num_rounds=600, num_silos=100, rho=8.0, trusted=trusted, batch_size=4, delta=1e-6)
    assert cal.sensitivity == pytest.approx(2 * MNIST.S / (4 * (100 if trusted else 1)))
    assert cal.sensitivity == sensitivity(MNIST, batch_size=4, num_silos=100, trusted=trusted)
    assert cal.sigma / cal.sensitivity == pytest.approx(cal.noise_multiplier, rel=1e-12)
    assert cal.noise_multiplier == pytest.approx(math.sqrt(600) / 8.0)
    assert cal.epsilon == rho_to_epsilon(8.0, 1e-6) and cal.delta == 1e-6
    assert cal.eta == eta(MNIST, num_rounds=600, num_silos=100, rho=8.0, trusted=trusted, batch_size=4)


# ---------------------------------------------------------------------------------------------------------------------
# The iteration
# ---------------------------------------------------------------------------------------------------------------------


def test_project_ball() -> None:
    rng = np.random.default_rng(2)
    inside = np.array([0.01, -0.02, 0.0])
    np.testing.assert_array_equal(project_ball(inside, 0.05), inside)
    v = rng.normal(size=50) * 10
    p = project_ball(v, 0.05)
    assert np.linalg.norm(p) == pytest.approx(0.05, rel=1e-15)
    np.testing.assert_allclose(p / np.linalg.norm(p), v / np.linalg.norm(v), rtol=1e-14)
    others = [project_ball(u, 0.05) for u in rng.normal(size=(200, 50))]
    assert all(np.linalg.norm(v - p) <= np.linalg.norm(v - u) for u in others)  # the nearest point of the ball
    assert project_ball(v.astype(np.float32), 0.05).dtype == np.float64


def test_silo_step_closed_form() -> None:
    rng = np.random.default_rng(3)
    dim, rounds = 7, 40
    g, g_prev = rng.normal(size=(2, rounds + 1, dim))
    d1, q1 = silo_step(None, g[1], None, 1)
    np.testing.assert_array_equal(d1, g[1])
    np.testing.assert_array_equal(q1, g[1])
    d = d1
    for t in range(2, rounds + 1):
        d_next, q = silo_step(d, g[t], g_prev[t], t)
        # The algorithm's line: d_t = g + (1 - beta_t)(d_{t-1} - g_prev), beta_t = 1/t; q_t = alpha_t d_t, alpha_t = t.
        np.testing.assert_allclose(d_next, g[t] + (1 - 1 / t) * (d - g_prev[t]), rtol=1e-13, atol=1e-13)
        # Lemma 4.1: q_t = sum_{s <= t} (s g_s - (s-1) g_prev_s), and d_t = q_t / t.
        telescoped = sum(s * g[s] - (s - 1) * g_prev[s] for s in range(1, t + 1))
        np.testing.assert_allclose(q, telescoped, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(d_next, telescoped / t, rtol=1e-10, atol=1e-12)
        d = d_next
    with pytest.raises(ValueError, match="round t=2 needs d_prev"):
        silo_step(None, g[2], g_prev[2], 2)
    with pytest.raises(ValueError, match="g_prev has 3 entries, expected 7"):
        silo_step(d, g[2], np.zeros(3), 2)


def test_server_step_is_projected_anytime_averaging() -> None:
    rng = np.random.default_rng(4)
    dim, radius = 20, 0.05
    w = x = np.zeros(dim)
    ws = [w]
    for t in range(1, 30):
        qbar = rng.normal(scale=50.0, size=dim)
        w_next, x_next = server_step(w, x, qbar, t, 1e-3, radius)
        np.testing.assert_allclose(w_next, project_ball(w - 1e-3 * qbar, radius), rtol=1e-15)
        ws.append(w_next)
        # x_{t+1} = sum_{s <= t+1} s w_s / alpha_{1:t+1}: the alpha-weighted average of the w's (w_1 = x_1).
        weights = np.arange(1, t + 2)
        np.testing.assert_allclose(x_next, weights @ np.array(ws) / weights.sum(), rtol=1e-12, atol=1e-15)
        assert np.linalg.norm(w_next) <= radius * (1 + 1e-15) and np.linalg.norm(x_next) <= radius * (1 + 1e-12)
        w, x = w_next, x_next
    assert np.linalg.norm(w) == pytest.approx(radius)  # the big steps did hit the boundary
    with pytest.raises(ValueError, match="eta must be a positive"):
        server_step(w, x, qbar, 3, 0.0, radius)


def test_noise_seed_matches_the_silos_randomness() -> None:
    from flwr.app import Context, RecordDict

    from silofl.client.randomness import NOISE, round_seed

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    for seed, party, t in ((0, 0, 1), (7, 3, 599), (123, 100, 60_000)):
        assert noise_seed(seed, party, t) == round_seed(context, seed=seed, silo_id=party, server_round=t, stream=NOISE)


# ---------------------------------------------------------------------------------------------------------------------
# Reference run
# ---------------------------------------------------------------------------------------------------------------------


def _blobs(n: int, num_features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Separable data in [0, 1]: class k lights up its own block of features."""
    rng = np.random.default_rng(seed)
    y = rng.integers(classes, size=n)
    x = rng.random((n, num_features)) * 0.2
    block = num_features // classes
    for k in range(classes):
        x[y == k, k * block : (k + 1) * block] += 0.8
    return x.astype(np.float32), y


def test_non_private_reference_learns_a_separable_problem() -> None:
    x, y = _blobs(400, 12, 3, seed=5)
    start = np.zeros(logreg_dim(12, 3))
    loss0 = logreg_loss(start, x, y, 3)
    assert loss0 == pytest.approx(math.log(3))
    wide = Mu2Constants.for_logreg(12, 3, D=20.0)
    result = run_mu2_reference(x, y, 1, 400, math.inf, False, seed=0, constants=wide)
    assert result.calibration.sigma == 0.0 and result.calibration.eta == 1 / (4 * wide.L * 400)
    assert logreg_loss(result.output, x, y, 3) < 0.75 * loss0
    assert logreg_accuracy(result.output, x, y, 3) > 0.95
    # The paper's small ball (D = 0.1) still lowers the loss, just not by much (cf. its near-ln(10) MNIST losses).
    paper = run_mu2_reference(x, y, 1, 400, math.inf, False, seed=0)
    assert logreg_loss(paper.output, x, y, 3) < loss0 - 1e-3
    assert np.linalg.norm(paper.output) <= paper.constants.radius * (1 + 1e-12)
    assert result.gradient_evaluations == 2 * 400 - 1  # 2 per record, none for g_prev in round 1


@pytest.mark.parametrize("trusted", [False, True])
def test_reference_trace_invariants(trusted: bool) -> None:
    m, rounds, b = 3, 25, 2
    x, y = _blobs(m * rounds * b, 8, 4, seed=6)
    result = run_mu2_reference(x, y, m, rounds, 0.05, trusted, seed=11, batch_size=b, trace=True)
    tr, cal, radius = result.trace, result.calibration, result.constants.radius
    assert tr is not None and cal.sigma > 0
    # Lemma 4.1 on the recorded values: q_t = sum_s (s g_s - (s-1) g_prev_s), d_t = q_t / t.
    s = np.arange(1, rounds + 1)[:, None, None]
    increments = s * tr.g - (s - 1) * tr.g_prev
    np.testing.assert_allclose(tr.q, np.cumsum(increments, axis=0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(tr.d, tr.q / s, rtol=1e-12, atol=1e-14)
    # The noise is the documented draw, from each silo (untrusted) or from the server as party M (trusted).
    for t in (1, 7, rounds):
        if trusted:
            np.testing.assert_array_equal(tr.sent[t - 1], tr.q[t - 1])
            noise = cal.sigma * np.random.default_rng(noise_seed(11, m, t)).standard_normal(result.constants.dim)
            np.testing.assert_allclose(tr.qbar[t - 1], tr.q[t - 1].mean(axis=0) + noise, rtol=1e-12)
        else:
            for i in range(m):
                noise = cal.sigma * np.random.default_rng(noise_seed(11, i, t)).standard_normal(result.constants.dim)
                np.testing.assert_array_equal(tr.sent[t - 1, i], tr.q[t - 1, i] + noise)
            np.testing.assert_allclose(tr.qbar[t - 1], tr.sent[t - 1].mean(axis=0), rtol=1e-12)
    # Every w_t and x_t stays in K; with this much noise the projection is active.
    assert np.linalg.norm(tr.w, axis=1).max() <= radius * (1 + 1e-12)
    assert np.linalg.norm(tr.x, axis=1).max() <= radius * (1 + 1e-12)
    assert np.isclose(np.linalg.norm(tr.w[1:], axis=1), radius).mean() > 0.5
    # The server recursion on the recorded qbar reproduces the recorded iterates exactly.
    for t in range(1, rounds + 1):
        w_next, x_next = server_step(tr.w[t - 1], tr.x[t - 1], tr.qbar[t - 1], t, cal.eta, radius)
        np.testing.assert_array_equal(w_next, tr.w[t])
        np.testing.assert_array_equal(x_next, tr.x[t])
    np.testing.assert_array_equal(result.output, tr.x[rounds - 1])  # x_T
    np.testing.assert_array_equal(result.next_query, tr.x[rounds])
    assert result.gradient_evaluations == m * b * (2 * rounds - 1)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_one_record_moves_every_later_q_by_the_same_vector_of_norm_at_most_2s_over_b(batch_size: int) -> None:
    """Theorem 5.1's sensitivity argument, checked on a run: replace record tau* and replay the silo's recursion on
    the same (released) query points. q_t changes by one fixed vector for t >= tau* and not at all before."""
    rounds, b, classes, n_feat = 30, batch_size, 4, 8
    x, y = _blobs(rounds * b, n_feat, classes, seed=8)
    result = run_mu2_reference(x, y, 1, rounds, 1.0, False, seed=2, batch_size=b, trace=True)
    xs = result.trace.x  # x_1 .. x_{T+1}; x_0 = x_1

    def replay(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
        qs, d = [], None
        for t in range(1, rounds + 1):
            rows = slice((t - 1) * b, t * b)
            g = logreg_grad(xs[t - 1], features[rows], labels[rows], classes)
            g_prev = logreg_grad(xs[max(t - 2, 0)], features[rows], labels[rows], classes)
            d, q = silo_step(d, g, g_prev, t)
            qs.append(q)
        return np.array(qs)

    base = replay(x, y)
    np.testing.assert_allclose(base, result.trace.q[:, 0], rtol=1e-12, atol=1e-12)
    tau = 17
    neighbour_x, neighbour_y = x.copy(), y.copy()
    neighbour_x[(tau - 1) * b] = 1.0 - x[(tau - 1) * b]  # replace one record of round tau
    neighbour_y[(tau - 1) * b] = (y[(tau - 1) * b] + 1) % classes
    delta = replay(neighbour_x, neighbour_y) - base
    assert np.abs(delta[: tau - 1]).max() == 0.0
    np.testing.assert_allclose(delta[tau - 1 :], np.broadcast_to(delta[tau - 1], delta[tau - 1 :].shape), atol=1e-10)
    norm = np.linalg.norm(delta[tau - 1])
    assert 0.0 < norm <= 2 * result.constants.S / b


def test_reference_determinism_inputs_and_errors() -> None:
    x, y = _blobs(200, 6, 3, seed=9)
    a = run_mu2_reference(x, y, 2, 50, 2.0, False, seed=1)
    np.testing.assert_array_equal(a.output, run_mu2_reference(x, y, 2, 50, 2.0, False, seed=1).output)
    assert not np.array_equal(a.output, run_mu2_reference(x, y, 2, 50, 2.0, False, seed=2).output)
    # One stream per silo (e.g. a label-skewed partition) is the same as the matching pooled blocks.
    per_silo = run_mu2_reference([x[:50], x[50:100]], [y[:50], y[50:100]], 2, 50, 2.0, False, seed=1)
    np.testing.assert_array_equal(per_silo.output, a.output)
    skewed = run_mu2_reference([x[y == 0][:40], x[y != 0][:40]], [y[y == 0][:40], y[y != 0][:40]], 2, 40, 2.0, True, 0)
    assert np.linalg.norm(skewed.output) <= skewed.constants.radius * (1 + 1e-12)
    with pytest.raises(ValueError, match=r"M \* T \* batch_size = 2 \* 150 = 300 are needed"):
        run_mu2_reference(x, y, 2, 150, 2.0, False, seed=1)
    with pytest.raises(ValueError, match="pass one feature array and one label array per silo"):
        run_mu2_reference([x], [y], 2, 10, 2.0, False, seed=1)
    with pytest.raises(ValueError, match=r"constants\.dim = 7850"):
        run_mu2_reference(x, y, 1, 10, 2.0, False, seed=1, constants=MNIST)
    with pytest.raises(ValueError, match="labels must be in"):
        logreg_grad(np.zeros(logreg_dim(6, 3)), x[:2], np.array([0, 3]), 3)
