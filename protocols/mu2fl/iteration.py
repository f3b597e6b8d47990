"""DP-mu2-FL's iteration (Reshef, Levy 2024, Algorithm 1, untrusted server, Section 5; Algorithm 2, trusted server,
Section 6): one silo's round, one server round, the projection onto K and the seed of each party's noise.

The iteration (alpha_t = t, beta_t = 1/t, x_0 = x_1 = w_1, d_0 = 0; Algorithms 1/2, "Actions of Machine i"/"Server"):

    silo i:  g = grad f(x_t; z_t,i)   g_prev = grad f(x_{t-1}; z_t,i)     (same record, previous query point)
             d_t = g + (1 - 1/t)(d_{t-1} - g_prev)      q_t = t d_t       -> `silo_step`
             untrusted: send q_t + N(0, sigma^2 I);  trusted: send q_t
    server:  qbar = mean_i(received)   (trusted: + N(0, sigma_s^2 I))
             w_{t+1} = Proj_K(w_t - eta qbar)   x_{t+1} = t/(t+2) x_t + 2/(t+2) w_{t+1}   -> `server_step`

x_{t+1} is the paper's (1 - alpha_{t+1}/alpha_{1:t+1}) x_t + alpha_{t+1}/alpha_{1:t+1} w_{t+1} with
alpha_{t+1}/alpha_{1:t+1} = (t+1) / ((t+1)(t+2)/2) = 2/(t+2). K is the ball of radius D/2 around 0 (diameter D) and
x_1 = 0 (Section 5.3 does not state it; this choice reproduces its near-ln(10) losses). sigma, sigma_s and eta come
from `calibration`.
"""

from __future__ import annotations

import numpy as np

from silofl.protocols.mu2fl import checks

__all__ = ["NOISE_STREAM", "noise_seed", "project_ball", "server_step", "silo_step"]

#: The per-round noise stream of a silo (`client.randomness.NOISE`); see `noise_seed`.
NOISE_STREAM = 1


def project_ball(v: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of v onto the ball of the given radius around 0 (float64; v itself if inside)."""
    v = np.asarray(v, dtype=np.float64)
    radius = checks.positive("radius", radius)
    norm = float(np.linalg.norm(v))
    if norm <= radius:
        return v
    return v * (radius / norm)


def silo_step(
    d_prev: np.ndarray | None, g: np.ndarray, g_prev: np.ndarray | None, t: int
) -> tuple[np.ndarray, np.ndarray]:
    """One silo's round t >= 1: d_t = g + (1 - 1/t)(d_{t-1} - g_prev) and q_t = t d_t (Algorithm 1/2, machine i).

    g = grad f(x_t; z_t), g_prev = grad f(x_{t-1}; z_t) on the same record(s). At t = 1 the weight 1 - beta_1 is 0,
    so d_1 = g and d_prev, g_prev may be None (which saves the second gradient evaluation). d_t is the silo's private
    state for the next round (it must never leave the silo un-noised); q_t is what it releases (plus noise when the
    server is untrusted).
    """
    t = checks.positive_int("t", t)
    g = checks.vector("g", g)
    if t == 1:
        d = g.copy()
        return d, d.copy()
    if d_prev is None or g_prev is None:
        raise ValueError(f"round t={t} needs d_prev (the previous round's d) and g_prev (grad at x_(t-1))")
    d_prev = checks.vector("d_prev", d_prev, g.shape[0])
    g_prev = checks.vector("g_prev", g_prev, g.shape[0])
    d = g + ((t - 1) / t) * (d_prev - g_prev)
    return d, t * d


def server_step(
    w: np.ndarray, x: np.ndarray, qbar: np.ndarray, t: int, eta: float, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """The server's round t: w_{t+1} = Proj_K(w_t - eta qbar), x_{t+1} = t/(t+2) x_t + 2/(t+2) w_{t+1}.

    qbar is the (noised) mean of the silos' q_t. K is the ball of `radius` (= D/2) around 0. x_{t+1} is a convex
    combination of points of K, so it stays in K without a projection (up to float rounding, ~1e-16 relative).
    """
    t = checks.positive_int("t", t)
    w = checks.vector("w", w)
    x = checks.vector("x", x, w.shape[0])
    qbar = checks.vector("qbar", qbar, w.shape[0])
    step = checks.positive("eta", eta)
    w_next = project_ball(w - step * qbar, radius)
    x_next = (t / (t + 2)) * x + (2 / (t + 2)) * w_next
    return w_next, x_next


def noise_seed(seed: int, party: int, t: int, stream: int = NOISE_STREAM) -> int:
    """The 63-bit seed of one party's noise in round t: `client.randomness.round_seed` for simulated silos.

    Silos are parties 0..M-1; the reference run uses party M for the trusted server's noise. Re-implemented (two
    lines) rather than imported because `client.randomness` needs Flower and torch; a test checks they agree.
    """
    seq = np.random.SeedSequence([seed, party, t, stream])
    return int(seq.generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> np.uint64(1))
