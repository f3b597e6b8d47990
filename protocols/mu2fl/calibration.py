"""DP-mu2-FL's noise and step size (Reshef, Levy 2024, Theorems 5.2 and 6.2), and those of its baseline, single-pass
noisy SGD (`calibrate_noisy_sgd`): what a run fixes in advance (`Mu2Calibration`).

Privacy (the paper's Theorems 5.1 / 6.1, proof sketches eqs. 10-12 and 14-16). With alpha_t = t, beta_t = 1/t,
q_t = t g_t + (t-1)(d_{t-1} - g_prev) = q_{t-1} + t g_t - (t-1) g_prev, so (Lemma 4.1)

    q_t = sum_{s <= t} s_s,    s_s := s g_s - (s-1) g_prev_s = g_s + (s-1)(g_s - g_prev_s),

and s_s depends on ONE record, z_s (both gradients are taken at that record), and on the public query points
x_s, x_{s-1}. Lemma 4.2: ||s_s|| <= G + (s-1) L ||x_s - x_{s-1}|| <= G + 2 L D = S, because
(s-1) ||x_s - x_{s-1}|| = 2 ||w_s - x_s|| <= 2D (eq. 18; it uses alpha_{s-1} alpha_s = 2 alpha_{1:s-1} and that w_s,
x_s lie in K: this is why the projection is needed for privacy). Replacing record z_tau* by z'_tau* therefore changes
only s_tau*, and changes every q_t with t >= tau* by s_tau*(z) - s_tau*(z'), of norm <= 2S, given the same past
(released) query points: each round is a Gaussian mechanism of L2 sensitivity 2S, and T adaptive rounds compose to
(alpha, alpha T (2S)^2 / (2 sigma^2))-RDP = (alpha, alpha rho^2 / 2)-RDP with rho = 2S sqrt(T) / sigma, i.e.
sigma = 2S sqrt(T) / rho. Trusted server: the average over M silos has sensitivity 2S/M, so
sigma_s = 2S sqrt(T) / (rho M).
Minibatch extension (silofl's, not in the paper): with b records per round and mean gradients, s_t is a mean of b
per-record terms, so one record moves it by at most 2S/b and sigma scales by 1/b (and T = n/b rounds).

`rho` is the paper's rho (`accounting`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from silofl.protocols.mu2fl import checks
from silofl.protocols.mu2fl.accounting import noise_multiplier, rho_to_epsilon
from silofl.protocols.mu2fl.constants import Mu2Constants

__all__ = [
    "Mu2Calibration",
    "calibrate",
    "calibrate_noisy_sgd",
    "eta",
    "sensitivity",
    "sigma_trusted",
    "sigma_untrusted",
]


def sensitivity(constants: Mu2Constants, *, batch_size: int = 1, num_silos: int = 1, trusted: bool = False) -> float:
    """L2 sensitivity of one round's released vector to replacing one record: 2S/b (a silo's q_t), 2S/(M b) (mean)."""
    b = checks.positive_int("batch_size", batch_size)
    m = checks.positive_int("num_silos", num_silos) if trusted else 1
    return 2.0 * constants.S / (b * m)


def sigma_untrusted(S: float, num_rounds: int, rho: float, batch_size: int = 1) -> float:
    """Std of the noise each silo adds to q_t (Algorithm 1, Theorem 5.2): 2 S sqrt(T) / (rho b); 0 if rho = inf."""
    S = checks.positive("S", S)
    rho = checks.positive("rho", rho, allow_inf=True)
    b = checks.positive_int("batch_size", batch_size)
    return 2.0 * S * math.sqrt(checks.positive_int("num_rounds", num_rounds)) / (rho * b)


def sigma_trusted(S: float, num_rounds: int, rho: float, num_silos: int, batch_size: int = 1) -> float:
    """Std of the server's noise on the mean (Algorithm 2, Theorem 6.2): 2 S sqrt(T) / (rho M b); 0 if rho = inf."""
    return sigma_untrusted(S, num_rounds, rho, batch_size) / checks.positive_int("num_silos", num_silos)


def eta(
    constants: Mu2Constants, *, num_rounds: int, num_silos: int, rho: float, trusted: bool, batch_size: int = 1
) -> float:
    """Step size (Theorems 5.2 / 6.2): min(rho D m / (2 S T sqrt(d)), 1/(4 L T)), m = sqrt(M) untrusted, M trusted.

    Both are min(D / (tau sqrt(T d)), 1/(4 L T)) with tau the per-coordinate noise std of the mean qbar
    (sigma/sqrt(M) untrusted, sigma_s trusted): the first term balances D^2/eta against eta sum_t E||Y_t||^2 =
    eta T d tau^2 in the convergence bound (eqs. 13, 17). That form extends the paper's rule to minibatches
    (tau shrinks by b) and to no noise (rho = inf: eta = 1/(4 L T)).
    """
    T = checks.positive_int("num_rounds", num_rounds)
    M = checks.positive_int("num_silos", num_silos)
    if trusted:
        tau = sigma_trusted(constants.S, T, rho, M, batch_size)
    else:
        tau = sigma_untrusted(constants.S, T, rho, batch_size) / math.sqrt(M)
    smooth = 1.0 / (4.0 * constants.L * T)
    if tau == 0.0:
        return smooth
    return min(constants.D / (tau * math.sqrt(T * constants.dim)), smooth)


@dataclass(frozen=True)
class Mu2Calibration:
    """Everything a run fixes in advance from (constants, T, M, b, rho, trusted): noise, step size, privacy."""

    rho: float
    delta: float
    epsilon: float
    num_rounds: int
    num_silos: int
    batch_size: int
    trusted: bool
    sensitivity: float  # of one round's noised vector (a silo's q_t untrusted, the mean trusted)
    sigma: float  # std of the noise added to that vector, per coordinate
    noise_multiplier: float  # sigma / sensitivity = sqrt(T) / rho
    eta: float


def _calibration(
    rho: float,
    delta: float,
    T: int,
    M: int,
    b: int,
    trusted: bool,
    *,
    sensitivity: float,
    sigma: float,
    noise_multiplier: float,
    eta: float,
) -> Mu2Calibration:
    """The Mu2Calibration of a run of T rounds, M silos and batch b (all checked) at (rho, delta): delta checked,
    epsilon = rho's at delta; the noise and the step size are the calibrating rule's (`calibrate`,
    `calibrate_noisy_sgd`)."""
    return Mu2Calibration(
        rho=float(rho),
        delta=checks.delta(delta),
        epsilon=rho_to_epsilon(rho, delta),
        num_rounds=T,
        num_silos=M,
        batch_size=b,
        trusted=bool(trusted),
        sensitivity=sensitivity,
        sigma=sigma,
        noise_multiplier=noise_multiplier,
        eta=eta,
    )


def calibrate(
    constants: Mu2Constants,
    *,
    num_rounds: int,
    num_silos: int,
    rho: float,
    trusted: bool,
    batch_size: int = 1,
    delta: float = 1e-5,
) -> Mu2Calibration:
    """Noise std, step size and (rho, epsilon) at delta for one run; rho = math.inf is the non-private run."""
    T = checks.positive_int("num_rounds", num_rounds)
    M = checks.positive_int("num_silos", num_silos)
    b = checks.positive_int("batch_size", batch_size)
    sigma = sigma_trusted(constants.S, T, rho, M, b) if trusted else sigma_untrusted(constants.S, T, rho, b)
    return _calibration(
        rho,
        delta,
        T,
        M,
        b,
        trusted,
        sensitivity=sensitivity(constants, batch_size=b, num_silos=M, trusted=trusted),
        sigma=sigma,
        noise_multiplier=noise_multiplier(rho, T),
        eta=eta(constants, num_rounds=T, num_silos=M, rho=rho, trusted=trusted, batch_size=b),
    )


def calibrate_noisy_sgd(
    constants: Mu2Constants,
    *,
    num_rounds: int,
    num_silos: int,
    rho: float,
    trusted: bool,
    batch_size: int = 1,
    delta: float = 1e-5,
) -> Mu2Calibration:
    """silofl's baseline (the paper runs none): single-pass noisy projected SGD at the same rho, against DP-mu2-FL.

    Each record is used in exactly one round, so (parallel composition) one Gaussian release per record: a silo's
    mean gradient over b records moves by at most 2G/b when one record is replaced, so sigma = 2G / (rho b) per silo
    (untrusted) or 2G / (rho M b) on the server's mean (trusted) gives (alpha, alpha rho^2/2)-RDP, the same unit as
    DP-mu2-FL. Step size eta = D / sqrt(T (G^2 + d tau^2)), tau the per-coordinate noise std of the mean gradient:
    the standard rate of projected SGD with averaged iterates for a G-Lipschitz convex loss and noisy gradients.
    """
    T = checks.positive_int("num_rounds", num_rounds)
    M = checks.positive_int("num_silos", num_silos)
    b = checks.positive_int("batch_size", batch_size)
    rho = checks.positive("rho", rho, allow_inf=True)
    sens = 2.0 * constants.G / b / (M if trusted else 1)
    sigma = 0.0 if math.isinf(rho) else sens / rho
    tau = sigma if trusted else sigma / math.sqrt(M)
    return _calibration(
        rho,
        delta,
        T,
        M,
        b,
        trusted,
        sensitivity=sens,
        sigma=sigma,
        noise_multiplier=0.0 if math.isinf(rho) else 1.0 / rho,
        eta=constants.D / math.sqrt(T * (constants.G**2 + constants.dim * tau**2)),
    )
