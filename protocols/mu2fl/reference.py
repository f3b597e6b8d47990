"""DP-mu2-FL on one machine (Reshef, Levy 2024, Algorithm 1, untrusted, or 2, trusted): `run_mu2_reference`, the
same arithmetic as the Flower strategy and silos in a numpy loop with no messages, against which they are checked
(tests/strategies/test_mu2fl_strategy.py, to 1e-12) and timed (benchmarks/mu2_round.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from silofl.protocols.mu2fl import checks
from silofl.protocols.mu2fl.calibration import Mu2Calibration, calibrate
from silofl.protocols.mu2fl.constants import Mu2Constants
from silofl.protocols.mu2fl.iteration import noise_seed, project_ball, server_step, silo_step
from silofl.protocols.mu2fl.logreg import logreg_dim, logreg_grad

__all__ = ["Mu2Result", "Mu2Trace", "run_mu2_reference"]


@dataclass(frozen=True)
class Mu2Trace:
    """Every intermediate value of a (small) reference run; index [t-1] is round t, [t-1, i] silo i.

    x, w: (T+1, d), x_1..x_{T+1} and w_1..w_{T+1}. g, g_prev, d, q, sent: (T, M, d) per silo (g_prev of round 1 is
    g, since x_0 = x_1; sent = q + noise untrusted, = q trusted). qbar: (T, d), the noised mean the server used.
    """

    x: np.ndarray
    w: np.ndarray
    g: np.ndarray
    g_prev: np.ndarray
    d: np.ndarray
    q: np.ndarray
    sent: np.ndarray
    qbar: np.ndarray


@dataclass(frozen=True)
class Mu2Result:
    """output: x_T (the paper's output, the last query point); next_query: x_{T+1}; w: w_{T+1}."""

    output: np.ndarray
    next_query: np.ndarray
    w: np.ndarray
    calibration: Mu2Calibration
    constants: Mu2Constants
    gradient_evaluations: int
    trace: Mu2Trace | None


def _silo_streams(
    X: np.ndarray | Sequence[np.ndarray],
    y: np.ndarray | Sequence[np.ndarray],
    num_silos: int,
    needed: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    if isinstance(X, np.ndarray):
        if not isinstance(y, np.ndarray) or X.ndim != 2 or y.shape != (X.shape[0],):
            raise ValueError(f"X must be (n, num_features) and y (n,) arrays, got {np.shape(X)} and {np.shape(y)}")
        if X.shape[0] < num_silos * needed:
            raise ValueError(
                f"X has {X.shape[0]} records but M * T * batch_size = {num_silos} * {needed} = "
                f"{num_silos * needed} are needed (one pass: every record is used once); lower T or M"
            )
        return [(X[i * needed : (i + 1) * needed], y[i * needed : (i + 1) * needed]) for i in range(num_silos)]
    if len(X) != num_silos or len(y) != num_silos:
        raise ValueError(
            f"pass one feature array and one label array per silo: got {len(X)} and {len(y)} for M = {num_silos}"
        )
    streams = []
    for i, (xi, yi) in enumerate(zip(X, y, strict=True)):
        xi, yi = np.asarray(xi), np.asarray(yi)
        if xi.ndim != 2 or yi.shape != (xi.shape[0],) or xi.shape[0] < needed:
            raise ValueError(
                f"silo {i}: features {xi.shape} and labels {yi.shape} must be aligned with at least T * batch_size = "
                f"{needed} records"
            )
        streams.append((xi[:needed], yi[:needed]))
    return streams


def run_mu2_reference(
    X: np.ndarray | Sequence[np.ndarray],
    y: np.ndarray | Sequence[np.ndarray],
    M: int,
    T: int,
    rho: float,
    trusted: bool,
    seed: int,
    *,
    num_classes: int | None = None,
    constants: Mu2Constants | None = None,
    batch_size: int = 1,
    delta: float = 1e-5,
    x1: np.ndarray | None = None,
    trace: bool = False,
) -> Mu2Result:
    """Algorithm 1 (trusted=False) or 2 (trusted=True) on one machine, in float64, for checking the Flower version.

    Data: X, y are either pooled arrays, of which silo i takes rows [i T b, (i+1) T b), or one (features, labels) pair
    per silo (e.g. from a label-skewed partition); either way silo i's round t uses the next b records of its stream
    in the given order (shuffle beforehand if needed). Each record is used once.

    rho: the paper's rho, or math.inf for the non-private run (sigma = 0). num_classes: default max(y) + 1.
    constants: default `Mu2Constants.for_logreg(num_features, num_classes, D=0.1)`. x1: the start (default 0; it is
    projected onto K). Noise: silo i's noise in round t is `default_rng(noise_seed(seed, i, t)).standard_normal(d)`
    times sigma, the trusted server's is drawn the same way as party M. trace=True records every intermediate vector
    (T x M x d floats: small runs only).
    """
    m = checks.positive_int("M", M)
    rounds = checks.positive_int("T", T)
    b = checks.positive_int("batch_size", batch_size)
    streams = _silo_streams(X, y, m, rounds * b)
    num_features = streams[0][0].shape[1]
    if num_classes is None:
        num_classes = int(max(int(np.max(labels)) for _, labels in streams)) + 1
    classes = max(checks.positive_int("num_classes", num_classes), 2)
    if constants is None:
        constants = Mu2Constants.for_logreg(num_features, classes)
    dim = logreg_dim(num_features, classes)
    if constants.dim != dim:
        raise ValueError(f"constants.dim = {constants.dim} but logreg on {num_features} features x {classes} has {dim}")
    cal = calibrate(constants, num_rounds=rounds, num_silos=m, rho=rho, trusted=trusted, batch_size=b, delta=delta)
    radius = constants.radius

    x = project_ball(np.zeros(dim) if x1 is None else checks.vector("x1", x1, dim), radius).copy()
    x_prev = x.copy()  # x_0 = x_1
    w = x.copy()  # w_1 = x_1
    d_state: list[np.ndarray | None] = [None] * m
    evaluations = 0
    if trace:
        xs, ws = [x.copy()], [w.copy()]
        tr = {k: np.zeros((rounds, m, dim)) for k in ("g", "g_prev", "d", "q", "sent")}
        qbars = np.zeros((rounds, dim))

    for t in range(1, rounds + 1):
        received = np.zeros((m, dim))
        for i, (features, labels) in enumerate(streams):
            rows = slice((t - 1) * b, t * b)
            g = logreg_grad(x, features[rows], labels[rows], classes)
            g_prev = logreg_grad(x_prev, features[rows], labels[rows], classes) if t > 1 else None
            evaluations += b if t == 1 else 2 * b
            d, q = silo_step(d_state[i], g, g_prev, t)
            d_state[i] = d
            sent = q
            if not trusted and cal.sigma > 0:
                sent = q + cal.sigma * np.random.default_rng(noise_seed(seed, i, t)).standard_normal(dim)
            received[i] = sent
            if trace:
                for key, value in (("g", g), ("g_prev", g if g_prev is None else g_prev), ("d", d), ("q", q)):
                    tr[key][t - 1, i] = value
                tr["sent"][t - 1, i] = sent
        qbar = received.mean(axis=0)
        if trusted and cal.sigma > 0:
            qbar = qbar + cal.sigma * np.random.default_rng(noise_seed(seed, m, t)).standard_normal(dim)
        output = x  # x_t: after the last round, x_T
        x_prev = x
        w, x = server_step(w, x, qbar, t, cal.eta, radius)
        if trace:
            xs.append(x.copy())
            ws.append(w.copy())
            qbars[t - 1] = qbar

    recorded = (
        Mu2Trace(x=np.array(xs), w=np.array(ws), qbar=qbars, **tr)  # type: ignore[arg-type]
        if trace
        else None
    )
    return Mu2Result(
        output=output,
        next_query=x,
        w=w,
        calibration=cal,
        constants=constants,
        gradient_evaluations=evaluations,
        trace=recorded,
    )
