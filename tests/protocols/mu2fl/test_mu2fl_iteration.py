"""Tests for protocols/mu2fl/iteration.py: the projection, one silo's and one server's round (Algorithms 1/2,
Lemma 4.1) and the noise seed."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.protocols.mu2fl.iteration import noise_seed, project_ball, server_step, silo_step


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
