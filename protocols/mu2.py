"""DP-mu2-FL's pure math: constants, privacy units, noise and step size, the iteration, and a reference run.

Source: Reshef, Levy, "Private and Federated Stochastic Convex Optimization: Efficient Strategies for Centralized
Systems", 2024, Algorithm 1 (untrusted server, Section 5) and Algorithm 2 (trusted server, Section 6). numpy float64
only: no Flower, no torch, so the Flower strategy and client can call these functions and be checked against
`run_mu2_reference` to 1e-10 or bit for bit.

The iteration (alpha_t = t, beta_t = 1/t, x_0 = x_1 = w_1, d_0 = 0; Algorithms 1/2, "Actions of Machine i"/"Server"):

    silo i:  g = grad f(x_t; z_t,i)   g_prev = grad f(x_{t-1}; z_t,i)     (same record, previous query point)
             d_t = g + (1 - 1/t)(d_{t-1} - g_prev)      q_t = t d_t       -> `silo_step`
             untrusted: send q_t + N(0, sigma^2 I);  trusted: send q_t
    server:  qbar = mean_i(received)   (trusted: + N(0, sigma_s^2 I))
             w_{t+1} = Proj_K(w_t - eta qbar)   x_{t+1} = t/(t+2) x_t + 2/(t+2) w_{t+1}   -> `server_step`

x_{t+1} is the paper's (1 - alpha_{t+1}/alpha_{1:t+1}) x_t + alpha_{t+1}/alpha_{1:t+1} w_{t+1} with
alpha_{t+1}/alpha_{1:t+1} = (t+1) / ((t+1)(t+2)/2) = 2/(t+2). K is the ball of radius D/2 around 0 (diameter D) and
x_1 = 0 (Section 5.3 does not state it; this choice reproduces its near-ln(10) losses).

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

Units: the paper's rho is NOT the zCDP parameter. (alpha, alpha rho^2/2)-RDP for all alpha is (rho^2/2)-zCDP, and
Lemma 2.5 turns it into (rho^2/2 + rho sqrt(2 ln(1/delta)), delta)-DP (`rho_to_epsilon`). Everywhere in this module
`rho` is the paper's rho.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NOISE_STREAM",
    "Mu2Calibration",
    "Mu2Constants",
    "Mu2Result",
    "Mu2Trace",
    "accountant_epsilon",
    "calibrate",
    "calibrate_noisy_sgd",
    "epsilon_to_rho",
    "eta",
    "logreg_accuracy",
    "logreg_dim",
    "logreg_grad",
    "logreg_loss",
    "noise_multiplier",
    "noise_seed",
    "project_ball",
    "resolve_rho",
    "rho_to_epsilon",
    "run_mu2_reference",
    "sensitivity",
    "server_step",
    "sigma_trusted",
    "sigma_untrusted",
    "silo_step",
]

#: The per-round noise stream of a silo (`client.randomness.NOISE`); see `noise_seed`.
NOISE_STREAM = 1


# --------------------------------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------------------------------


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    number = float(value)
    if not (number > 0) or (math.isinf(number) and not allow_inf) or math.isnan(number):
        extra = " (or math.inf for no noise)" if allow_inf else ""
        raise ValueError(f"{name} must be a positive finite number{extra}, got {value!r}")
    return number


def _delta(delta: object) -> float:
    value = float(delta) if isinstance(delta, int | float | np.floating) and not isinstance(delta, bool) else math.nan
    if not 0.0 < value < 1.0:
        raise ValueError(f"delta must be in (0, 1), e.g. 1e-5, got {delta!r}")
    return value


def _vector(name: str, value: object, dim: int | None = None) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-d vector, got shape {array.shape}")
    if dim is not None and array.shape[0] != dim:
        raise ValueError(f"{name} has {array.shape[0]} entries, expected {dim} (the other vectors' length)")
    return array


# --------------------------------------------------------------------------------------------------------------------
# Constants of the loss (Section 5.3)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mu2Constants:
    """The loss's constants on K: f(.; z) is G-Lipschitz and L-smooth, K has diameter D; dim is d (parameters).

    S = G + 2 L D bounds the per-record increment s_t of q_t (Lemma 4.2), and K is the ball of radius D/2 around 0.
    """

    G: float
    L: float
    D: float
    dim: int

    def __post_init__(self) -> None:
        for name in ("G", "L", "D"):
            _positive(f"Mu2Constants.{name}", getattr(self, name))
        _positive_int("Mu2Constants.dim", self.dim)

    @property
    def S(self) -> float:
        """S = G + 2 L D (Lemma 4.2): the bound on ||s_t||, half the L2 sensitivity of q_t."""
        return self.G + 2.0 * self.L * self.D

    @property
    def radius(self) -> float:
        """Radius D/2 of the ball K around 0."""
        return self.D / 2.0

    @classmethod
    def for_logreg(cls, num_features: int, num_classes: int, D: float = 0.1) -> Mu2Constants:
        """Constants of cross-entropy logistic regression on features in [0, 1]^n with a bias (silofl's "logreg").

        Write the bias as a constant feature: a~ = (a, 1) with ||a~||^2 <= n + 1, logits z = W a~, p = softmax(z),
        f = -log p_y.

        * num_classes > 2 (W is C x (n+1), d = C (n+1)): grad_W f = (p - e_y) a~^T, so
          ||grad||_F = ||p - e_y|| ||a~||, and ||p - e_y||^2 = (1 - p_y)^2 + sum_{k != y} p_k^2
          <= (1 - p_y)^2 + (sum_{k != y} p_k)^2 = 2 (1 - p_y)^2 <= 2: G = sqrt(2 (n+1)). The Hessian is
          (diag(p) - p p^T) kron a~ a~^T; its eigenvalues are products of the factors' eigenvalues, and
          lambda_max(diag(p) - p p^T) <= max_k 2 p_k (1 - p_k) <= 1/2 (Gershgorin: row k has diagonal p_k (1 - p_k)
          and off-diagonal absolute sum p_k (1 - p_k)), lambda_max(a~ a~^T) = ||a~||^2 <= n + 1: L = (n+1)/2.
          Both are approached (G as p -> e_k, k != y; L at p = (1/2, 1/2, 0, ...)) with a = 1, so they are tight.
          MNIST (n = 784, C = 10): G = sqrt(2 * 785) = 39.62, L = 392.5, S = 118.12 with D = 0.1, d = 7850 - the
          paper's Section 5.3 values.
        * num_classes == 2: silofl's binary head has ONE output z = w . a~ (logits [0, z], `protocols.models`), so
          d = n + 1, grad = (sigmoid(z) - y) a~: G = sqrt(n + 1), and the Hessian sigma(z)(1 - sigma(z)) a~ a~^T
          gives L = (n + 1)/4.

        The bounds hold on all of R^d, so in particular on K. They need features in [0, 1] (not z-scored).
        """
        n = _positive_int("num_features", num_features)
        classes = _positive_int("num_classes", num_classes)
        if classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        width = n + 1  # the features plus the bias
        if classes == 2:
            return cls(G=math.sqrt(width), L=width / 4.0, D=_positive("D", D), dim=width)
        return cls(G=math.sqrt(2.0 * width), L=width / 2.0, D=_positive("D", D), dim=classes * width)


# --------------------------------------------------------------------------------------------------------------------
# Privacy units and accounting
# --------------------------------------------------------------------------------------------------------------------


def rho_to_epsilon(rho: float, delta: float) -> float:
    """epsilon of (alpha, alpha rho^2/2)-RDP at delta: rho^2/2 + rho sqrt(2 ln(1/delta)) (Lemma 2.5; rho^2/2-zCDP).

    rho = math.inf (no noise) gives math.inf.
    """
    rho = _positive("rho", rho, allow_inf=True)
    delta = _delta(delta)
    return rho * rho / 2.0 + rho * math.sqrt(2.0 * math.log(1.0 / delta))


def epsilon_to_rho(epsilon: float, delta: float) -> float:
    """The paper's rho whose `rho_to_epsilon` is epsilon: sqrt(2 ln(1/delta) + 2 eps) - sqrt(2 ln(1/delta)).

    (The positive root of rho^2/2 + c rho - eps = 0, c = sqrt(2 ln(1/delta)).)
    """
    epsilon = _positive("epsilon", epsilon, allow_inf=True)
    delta = _delta(delta)
    c2 = 2.0 * math.log(1.0 / delta)
    if math.isinf(epsilon):
        return math.inf
    # Written as 2 eps / (sqrt(c2 + 2 eps) + sqrt(c2)) to avoid cancellation for small eps.
    return 2.0 * epsilon / (math.sqrt(c2 + 2.0 * epsilon) + math.sqrt(c2))


def resolve_rho(rho: float, epsilon: float, delta: float) -> float:
    """The paper's rho of a run given as rho (> 0) or as (epsilon, delta): Lemma 2.5 inverted; inf: non-private."""
    if rho > 0:
        return float(rho)
    return math.inf if math.isinf(epsilon) else epsilon_to_rho(epsilon, delta)


def noise_multiplier(rho: float, num_rounds: int) -> float:
    """sigma / sensitivity of each round's Gaussian release: sqrt(T) / rho (untrusted and trusted alike)."""
    return math.sqrt(_positive_int("num_rounds", num_rounds)) / _positive("rho", rho, allow_inf=True)


def accountant_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """epsilon of `steps` Gaussian releases, each with sigma = noise_multiplier x sensitivity, by dp-accounting's RDP.

    The cross-check of `rho_to_epsilon`: T rounds with noise multiplier sqrt(T)/rho are (alpha, alpha rho^2/2)-RDP,
    and `dp_accounting.rdp.RdpAccountant` converts RDP to (epsilon, delta) with a tighter bound than Lemma 2.5
    (Balle et al. 2020), so its epsilon is at most the closed form. No subsampling: every record is used in exactly one
    round (a single pass), and the neighbouring relation is replacing one record, whose sensitivity the multiplier
    already accounts for (2S, or 2S/b, or 2S/(M b) for the trusted average).
    """
    import dp_accounting  # imported here: it pulls in scipy, which the iteration does not need
    from dp_accounting.rdp import RdpAccountant

    multiplier = _positive("noise_multiplier", noise_multiplier)
    steps = _positive_int("steps", steps)
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(multiplier), steps)
    return float(accountant.get_epsilon(_delta(delta)))


# --------------------------------------------------------------------------------------------------------------------
# Noise and step size (Theorems 5.2 and 6.2)
# --------------------------------------------------------------------------------------------------------------------


def sensitivity(constants: Mu2Constants, *, batch_size: int = 1, num_silos: int = 1, trusted: bool = False) -> float:
    """L2 sensitivity of one round's released vector to replacing one record: 2S/b (a silo's q_t), 2S/(M b) (mean)."""
    b = _positive_int("batch_size", batch_size)
    m = _positive_int("num_silos", num_silos) if trusted else 1
    return 2.0 * constants.S / (b * m)


def sigma_untrusted(S: float, num_rounds: int, rho: float, batch_size: int = 1) -> float:
    """Std of the noise each silo adds to q_t (Algorithm 1, Theorem 5.2): 2 S sqrt(T) / (rho b); 0 if rho = inf."""
    S = _positive("S", S)
    rho = _positive("rho", rho, allow_inf=True)
    b = _positive_int("batch_size", batch_size)
    return 2.0 * S * math.sqrt(_positive_int("num_rounds", num_rounds)) / (rho * b)


def sigma_trusted(S: float, num_rounds: int, rho: float, num_silos: int, batch_size: int = 1) -> float:
    """Std of the server's noise on the mean (Algorithm 2, Theorem 6.2): 2 S sqrt(T) / (rho M b); 0 if rho = inf."""
    return sigma_untrusted(S, num_rounds, rho, batch_size) / _positive_int("num_silos", num_silos)


def eta(
    constants: Mu2Constants, *, num_rounds: int, num_silos: int, rho: float, trusted: bool, batch_size: int = 1
) -> float:
    """Step size (Theorems 5.2 / 6.2): min(rho D m / (2 S T sqrt(d)), 1/(4 L T)), m = sqrt(M) untrusted, M trusted.

    Both are min(D / (tau sqrt(T d)), 1/(4 L T)) with tau the per-coordinate noise std of the mean qbar
    (sigma/sqrt(M) untrusted, sigma_s trusted): the first term balances D^2/eta against eta sum_t E||Y_t||^2 =
    eta T d tau^2 in the convergence bound (eqs. 13, 17). That form extends the paper's rule to minibatches
    (tau shrinks by b) and to no noise (rho = inf: eta = 1/(4 L T)).
    """
    T = _positive_int("num_rounds", num_rounds)
    M = _positive_int("num_silos", num_silos)
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
    T = _positive_int("num_rounds", num_rounds)
    M = _positive_int("num_silos", num_silos)
    b = _positive_int("batch_size", batch_size)
    sigma = sigma_trusted(constants.S, T, rho, M, b) if trusted else sigma_untrusted(constants.S, T, rho, b)
    return Mu2Calibration(
        rho=float(rho),
        delta=_delta(delta),
        epsilon=rho_to_epsilon(rho, delta),
        num_rounds=T,
        num_silos=M,
        batch_size=b,
        trusted=bool(trusted),
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
    T = _positive_int("num_rounds", num_rounds)
    M = _positive_int("num_silos", num_silos)
    b = _positive_int("batch_size", batch_size)
    rho = _positive("rho", rho, allow_inf=True)
    sens = 2.0 * constants.G / b / (M if trusted else 1)
    sigma = 0.0 if math.isinf(rho) else sens / rho
    tau = sigma if trusted else sigma / math.sqrt(M)
    return Mu2Calibration(
        rho=float(rho),
        delta=_delta(delta),
        epsilon=rho_to_epsilon(rho, delta),
        num_rounds=T,
        num_silos=M,
        batch_size=b,
        trusted=bool(trusted),
        sensitivity=sens,
        sigma=sigma,
        noise_multiplier=0.0 if math.isinf(rho) else 1.0 / rho,
        eta=constants.D / math.sqrt(T * (constants.G**2 + constants.dim * tau**2)),
    )


# --------------------------------------------------------------------------------------------------------------------
# The iteration
# --------------------------------------------------------------------------------------------------------------------


def project_ball(v: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of v onto the ball of the given radius around 0 (float64; v itself if inside)."""
    v = np.asarray(v, dtype=np.float64)
    radius = _positive("radius", radius)
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
    t = _positive_int("t", t)
    g = _vector("g", g)
    if t == 1:
        d = g.copy()
        return d, d.copy()
    if d_prev is None or g_prev is None:
        raise ValueError(f"round t={t} needs d_prev (the previous round's d) and g_prev (grad at x_(t-1))")
    d_prev = _vector("d_prev", d_prev, g.shape[0])
    g_prev = _vector("g_prev", g_prev, g.shape[0])
    d = g + ((t - 1) / t) * (d_prev - g_prev)
    return d, t * d


def server_step(
    w: np.ndarray, x: np.ndarray, qbar: np.ndarray, t: int, eta: float, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """The server's round t: w_{t+1} = Proj_K(w_t - eta qbar), x_{t+1} = t/(t+2) x_t + 2/(t+2) w_{t+1}.

    qbar is the (noised) mean of the silos' q_t. K is the ball of `radius` (= D/2) around 0. x_{t+1} is a convex
    combination of points of K, so it stays in K without a projection (up to float rounding, ~1e-16 relative).
    """
    t = _positive_int("t", t)
    w = _vector("w", w)
    x = _vector("x", x, w.shape[0])
    qbar = _vector("qbar", qbar, w.shape[0])
    step = _positive("eta", eta)
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


# --------------------------------------------------------------------------------------------------------------------
# Multinomial logistic regression in closed form (silofl's "logreg" parameter layout)
# --------------------------------------------------------------------------------------------------------------------


def logreg_dim(num_features: int, num_classes: int) -> int:
    """Parameters of silofl's logreg: C (n + 1) for C > 2 classes, n + 1 for the binary single-output head."""
    rows = 1 if _positive_int("num_classes", num_classes) == 2 else int(num_classes)
    return rows * (_positive_int("num_features", num_features) + 1)


def _split_params(params: np.ndarray, num_features: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    rows = 1 if num_classes == 2 else num_classes
    expected = rows * (num_features + 1)
    if params.shape != (expected,):
        raise ValueError(
            f"params must be a flat vector of {expected} entries (head.weight {rows}x{num_features} then head.bias), "
            f"got shape {params.shape}"
        )
    return params[: rows * num_features].reshape(rows, num_features), params[rows * num_features :]


def _logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    weight, bias = _split_params(params, features.shape[1], num_classes)
    z = features @ weight.T + bias
    return np.concatenate([np.zeros_like(z), z], axis=1) if num_classes == 2 else z


def _shifted_logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    """``logits - max(logits)`` per row (<= 0), for any finite query point.

    Rows whose logits are finite: exactly ``logits - logits.max(axis=1)`` (a difference that overflows is -inf, whose
    exp is the 0 it rounds to anyway). A query point of norm ~1e308 (an untrusted server's choice) can overflow the
    logits themselves to inf, or to NaN (inf - inf), and the softmax to NaN; those rows are recomputed at the point
    scaled by a power of two (exact), then scaled back (:func:`_rescaled_shifted_logits`), so their softmax is its
    true value, one-hot at the largest logit."""
    with np.errstate(over="ignore", invalid="ignore"):
        logits = _logits(params, features, num_classes)
        shifted = logits - logits.max(axis=1, keepdims=True)
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():
            shifted[bad] = _rescaled_shifted_logits(params, features[bad], num_classes)
    return shifted


def _rescaled_shifted_logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    """``logits - max(logits)`` per row from the logits at ``params 2^-e``, with ``2^e`` the power of two just above
    ``max |params|``: those are finite for finite features in a sane range, and a power of two scales exactly, so
    ``(logits 2^-e - max) 2^e`` is the difference of the true logits, rounded; where it does not fit in float64 it is
    -inf (exp: 0). A row whose features are not finite has no logits: NaN (its record then contributes 0)."""
    top = float(np.max(np.abs(params))) if params.size else 0.0
    exponent = int(np.frexp(top)[1]) if 0.0 < top < math.inf else 0
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        scaled = _logits(np.ldexp(params, -exponent), features, num_classes)
        shifted = np.ldexp(scaled - scaled.max(axis=1, keepdims=True), exponent)
    shifted[~np.isfinite(features).all(axis=1)] = np.nan
    return shifted


def _batch(features: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] == 0:
        raise ValueError(f"features must be (n, num_features) and labels (n,), n >= 1; got {x.shape} and {y.shape}")
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"labels must be in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    return x, y.astype(np.int64, copy=False)


def logreg_grad(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Mean cross-entropy gradient over the batch, flat in silofl's layout (head.weight row-major, then head.bias).

    Closed form: with r = softmax(logits) - onehot(y), grad_W = r^T a / n and grad_b = sum(r) / n (for the binary
    single-output head, r is the second column: sigmoid(z) - y).

    Finite for any finite query point: the softmax is computed stably even where the logits overflow
    (:func:`_shifted_logits`), so a record's gradient is its true value, of norm <= G (:class:`Mu2Constants`,
    bounds that hold on all of R^d), at a query point of norm 1e308 too. A record whose gradient is still not
    finite (features that are not finite) contributes 0, a point of the ball of radius G the sensitivity assumes;
    the mean still divides by the batch size. The same bits as before whenever the logits are finite.
    """
    params = _vector("params", params)
    x, y = _batch(features, labels, num_classes)
    r = np.exp(_shifted_logits(params, x, num_classes))
    r /= r.sum(axis=1, keepdims=True)
    r[np.arange(y.shape[0]), y] -= 1.0
    if num_classes == 2:
        r = r[:, 1:]
    r /= y.shape[0]
    keep = np.isfinite(r).all(axis=1)
    if not keep.all():
        r, x = r[keep], x[keep]
    return np.concatenate([(r.T @ x).ravel(), r.sum(axis=0)])


def logreg_loss(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Mean cross-entropy (natural log) of the batch: never NaN for finite query points and features (a record's
    loss can be inf where its true value exceeds float64, at a query point of norm ~1e308)."""
    x, y = _batch(features, labels, num_classes)
    params = _vector("params", params)
    rows = np.arange(y.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        logits = _logits(params, x, num_classes)
        top = logits.max(axis=1)
        log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        losses = log_norm - logits[rows, y]
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():  # logits that overflow: -log softmax from the stable differences
            shifted = _rescaled_shifted_logits(params, x[bad], num_classes)
            losses[bad] = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(shifted.shape[0]), y[bad]]
        return float(np.mean(losses))


def logreg_accuracy(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Fraction of the batch whose arg-max logit is its label (the arg-max of logits that overflow included)."""
    x, y = _batch(features, labels, num_classes)
    return float(np.mean(_shifted_logits(_vector("params", params), x, num_classes).argmax(axis=1) == y))


# --------------------------------------------------------------------------------------------------------------------
# Reference run
# --------------------------------------------------------------------------------------------------------------------


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
    m = _positive_int("M", M)
    rounds = _positive_int("T", T)
    b = _positive_int("batch_size", batch_size)
    streams = _silo_streams(X, y, m, rounds * b)
    num_features = streams[0][0].shape[1]
    if num_classes is None:
        num_classes = int(max(int(np.max(labels)) for _, labels in streams)) + 1
    classes = max(_positive_int("num_classes", num_classes), 2)
    if constants is None:
        constants = Mu2Constants.for_logreg(num_features, classes)
    dim = logreg_dim(num_features, classes)
    if constants.dim != dim:
        raise ValueError(f"constants.dim = {constants.dim} but logreg on {num_features} features x {classes} has {dim}")
    cal = calibrate(constants, num_rounds=rounds, num_silos=m, rho=rho, trusted=trusted, batch_size=b, delta=delta)
    radius = constants.radius

    x = project_ball(np.zeros(dim) if x1 is None else _vector("x1", x1, dim), radius).copy()
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
