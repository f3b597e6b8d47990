"""Privacy accounting for Poisson-sampled Gaussian releases, on Google's ``dp-accounting``.

One *step* of a silo is: draw a Poisson sample of its records (rate ``q``), compute ``K`` quantities from that same
sample (e.g. SteFFLe's ``h_theta`` and ``h_W``, spec ``steffle.md`` "Algorithm 1" step 3) and release each with
Gaussian noise. :func:`combined_noise_multiplier` shows the ``K`` releases are one Gaussian mechanism, so a run of ``T``
steps is ``T`` compositions of a Poisson-subsampled Gaussian (:func:`dp_event`). Its ``(epsilon, delta)`` comes from

* RDP (``dp_accounting.rdp.RdpAccountant``): Mironov et al. 2019 for the subsampled Gaussian, converted with the
  tighter bound of Balle et al. 2020 (Prop. 12); cheap, slightly loose;
* PLD (``dp_accounting.pld.PLDAccountant``): numerical composition of the privacy loss distribution (Koskela et al.
  2020; Doroshenko et al. 2022 "connect the dots"), pessimistic rounding (the library default, kept), so its epsilon is
  also an upper bound; usually 5-10 % tighter than RDP for DP-SGD-like settings, slower;
* ``"best"``: the smaller of the two. Both are valid upper bounds, so their minimum is one too.

The neighbouring relation is add/remove-one record (the one under which Poisson subsampling amplifies privacy); the
sensitivities fed to :class:`protocols.privacy.gaussian.GaussianMechanism` must be stated for that relation.

Why a wrapper at all: the library takes events, not run parameters; the wrapper fixes the event shape (so the silo
ledger, the calibration and the CLI all account the same thing), validates input with errors that name the argument,
and fixes the PLD discretization (:func:`pld_value_discretization`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

ACCOUNTANTS = ("rdp", "pld", "best")
"""Accountant names accepted everywhere in this package. ``best`` = the smaller (tighter) of RDP and PLD."""

PLD_MAX_VALUE_DISCRETIZATION = 1e-3
"""Coarsest grid step of privacy-loss values the PLD accountant uses (see :func:`pld_value_discretization`)."""

PLD_GRID_POINTS_PER_LOSS_SCALE = 20
"""Grid steps per ``q / sigma``, the scale of one subsampled-Gaussian step's privacy loss."""


_RELATIVE_TOLERANCE_FLOOR = 1e-9


# --------------------------------------------------------------------------------------------------------------------
# Validation: each helper names the argument and says what is accepted.
# --------------------------------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_steps(steps: object, *, name: str = "steps", minimum: int = 1) -> int:
    """Return ``steps`` as an int if it is an integer ``>= minimum``; else raise ``ValueError`` naming ``name``."""
    if not _is_int(steps):
        raise ValueError(f"{name} must be an integer number of steps, got {steps!r} ({type(steps).__name__})")
    if steps < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {steps}")
    return int(steps)


def check_releases(releases: object, *, name: str = "releases") -> int:
    """Return ``releases`` as an int if it is an integer ``>= 1``; else raise ``ValueError``."""
    if not _is_int(releases) or releases < 1:
        raise ValueError(
            f"{name} must be an integer >= 1 (how many noisy quantities each step releases from the same sample), "
            f"got {releases!r}"
        )
    return int(releases)


def check_sampling_rate(sampling_rate: object, *, name: str = "sampling_rate") -> float:
    """Return ``sampling_rate`` as a float in ``(0, 1]``; else raise ``ValueError``."""
    if not isinstance(sampling_rate, numbers.Real) or isinstance(sampling_rate, bool):
        raise ValueError(f"{name} must be a number in (0, 1], got {sampling_rate!r}")
    q = float(sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ValueError(
            f"{name} must be in (0, 1] (Poisson sampling probability of a record, batch size / records), got {q}"
        )
    return q


def check_delta(delta: object, *, name: str = "delta") -> float:
    """Return ``delta`` as a float in ``(0, 1)``; else raise ``ValueError``."""
    if not isinstance(delta, numbers.Real) or isinstance(delta, bool):
        raise ValueError(f"{name} must be a number in (0, 1), got {delta!r}")
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"{name} must be in (0, 1), e.g. 1/n^2 for n records; got {d}")
    return d


def check_epsilon(epsilon: object, *, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float ``> 0`` (``inf`` allowed: no privacy); else raise ``ValueError``."""
    if not isinstance(epsilon, numbers.Real) or isinstance(epsilon, bool):
        raise ValueError(f"{name} must be a number > 0, got {epsilon!r}")
    e = float(epsilon)
    if math.isnan(e) or e <= 0.0:
        raise ValueError(f"{name} must be > 0 (use inf for no privacy), got {e}")
    return e


def check_noise_multiplier(
    noise_multiplier: object, *, name: str = "noise_multiplier", allow_inf: bool = True
) -> float:
    """Return ``noise_multiplier`` as a float ``>= 0`` (``inf`` if ``allow_inf``); else raise ``ValueError``."""
    if not isinstance(noise_multiplier, numbers.Real) or isinstance(noise_multiplier, bool):
        raise ValueError(f"{name} must be a number >= 0, got {noise_multiplier!r}")
    s = float(noise_multiplier)
    if math.isnan(s) or s < 0.0 or (math.isinf(s) and not allow_inf):
        bound = ">= 0" if allow_inf else ">= 0 and finite"
        raise ValueError(f"{name} must be {bound} (noise std / L2 sensitivity), got {s}")
    return s


def check_accountant(accountant: object, *, name: str = "accountant") -> str:
    """Return ``accountant`` if it is one of :data:`ACCOUNTANTS`; else raise ``ValueError``."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"{name} must be one of {', '.join(ACCOUNTANTS)}; got {accountant!r}")
    return str(accountant)


def pld_value_discretization(noise_multiplier: float, sampling_rate: float) -> float:
    """PLD grid step for a ``PoissonSampled(q, Gaussian(noise_multiplier))`` step: ``min(1e-3, q / (20 sigma))``.

    ``noise_multiplier`` is the step's combined multiplier. Why this rule: a fixed grid is too coarse when one step's
    privacy loss (of order ``q / sigma``) is comparable to the grid step. Measured at delta = 1e-9 against a grid 10x
    finer (``tests/test_accountant.py`` re-checks a few): the library default 1e-4 costs 0.3-0.8 s at q = 256/12000,
    T = 2000; a fixed 1e-3 is 10x faster but overstates epsilon by up to 5.7 % at epsilon ~ 0.3 (sigma ~ 17); this
    rule overstates it by at most 2.1e-4 (relative) from epsilon 0.28 to 30, T = 20 to 60,000, q = 0.02 to 0.5, in
    10-75 ms. The rounding is pessimistic at every grid (``pessimistic_estimate=True``, the library default, kept), so
    every grid gives an upper bound on the true epsilon; a coarser grid only loses tightness (in every case measured
    its epsilon was at or above the finer grid's).
    """
    if math.isinf(noise_multiplier) or noise_multiplier <= 0.0:
        return PLD_MAX_VALUE_DISCRETIZATION
    return min(PLD_MAX_VALUE_DISCRETIZATION, sampling_rate / (PLD_GRID_POINTS_PER_LOSS_SCALE * noise_multiplier))


# --------------------------------------------------------------------------------------------------------------------
# Mechanism algebra and events
# --------------------------------------------------------------------------------------------------------------------


def combined_noise_multiplier(multipliers: Sequence[float]) -> float:
    """Noise multiplier of ``K`` Gaussian releases computed from the SAME sampled batch, seen as one mechanism.

    Release ``k`` is ``Y_k = f_k(D) + N(0, (s_k * Delta_k)^2 I)``, where ``Delta_k`` is the L2 sensitivity of ``f_k``
    and ``s_k = multipliers[k]``. Claim: ``(Y_1, ..., Y_K)`` is exactly as private as one Gaussian mechanism with
    noise multiplier ``s = (sum_k s_k^-2)^(-1/2)``.

    Proof. Whiten each release: ``W_k = Y_k / (s_k Delta_k) = g_k(D) + N(0, I)`` with ``g_k = f_k / (s_k Delta_k)``.
    The map ``(Y_k) -> (W_k)`` is a fixed bijection that does not depend on ``D``, so by post-processing (both ways)
    the two tuples have the same privacy. Stack ``g = (g_1, ..., g_K)``: ``W = g(D) + N(0, I)``, one Gaussian
    mechanism with noise std 1. Its L2 sensitivity is ``Delta_g^2 = sup ||g(D) - g(D')||^2
    = sup sum_k ||f_k(D) - f_k(D')||^2 / (s_k Delta_k)^2 <= sum_k 1 / s_k^2``, so its noise multiplier is
    ``1 / Delta_g >= (sum_k s_k^-2)^(-1/2)`` (equality when every ``f_k`` can move by its full ``Delta_k`` on the same
    pair of neighbours, so the bound is tight in general). The Poisson sample is drawn once for all ``K``, so
    subsampling applies to the stacked mechanism once: the step is ``PoissonSampled(q, Gaussian(s))``. With equal
    multipliers ``s_k = sigma``: ``s = sigma / sqrt(K)``. QED.

    Edge cases: a release with ``s_k = inf`` reveals nothing and contributes ``0`` to the sum (all ``inf`` -> ``inf``);
    a release with ``s_k = 0`` is non-private, so the result is ``0``.

    Raises:
        ValueError: if ``multipliers`` is empty or holds a negative / NaN value.
    """
    values = list(multipliers)
    if not values:
        raise ValueError("multipliers must hold at least one release's noise multiplier, got an empty sequence")
    precision = 0.0
    for index, value in enumerate(values):
        s = check_noise_multiplier(value, name=f"multipliers[{index}]")
        if s == 0.0:
            return 0.0
        precision += 0.0 if math.isinf(s) else s**-2
    return math.inf if precision == 0.0 else precision**-0.5


def dp_event(noise_multiplier: float, sampling_rate: float, steps: int, releases: int = 1) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of ``steps`` Poisson-sampled steps, each releasing ``releases`` Gaussian quantities.

    Every release of a step uses ``noise_multiplier`` (noise std / its own L2 sensitivity); by
    :func:`combined_noise_multiplier` the step is one ``Gaussian(noise_multiplier / sqrt(releases))``. The event is
    ``SelfComposed(PoissonSampled(q, Gaussian(noise_multiplier / sqrt(releases))), steps)``; for ``q = 1`` the
    sampling wrapper is dropped (``SelfComposed(Gaussian(...), steps)``): the same mechanism, and the PLD accountant
    then composes it in closed form (one Gaussian with std ``sigma / sqrt(steps)``) instead of numerically.
    """
    sigma = check_noise_multiplier(noise_multiplier, allow_inf=False)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps)
    k = check_releases(releases)
    gaussian = dp_accounting.GaussianDpEvent(sigma / math.sqrt(k))
    step = gaussian if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)
    return dp_accounting.SelfComposedDpEvent(step, count)


def _make_accountant(which: str, pld_discretization: float) -> dp_accounting.PrivacyAccountant:
    """A fresh library accountant of kind ``which`` (``rdp`` or ``pld``), configured as everywhere in this module."""
    if which == "rdp":
        return RdpAccountant()
    return PLDAccountant(value_discretization_interval=pld_discretization)


def _epsilon_of_event(event: dp_accounting.DpEvent, delta: float, accountant: str, pld_discretization: float) -> float:
    """Epsilon of ``event`` at ``delta`` by one accountant (``rdp`` or ``pld``), via the library."""
    return float(_make_accountant(accountant, pld_discretization).compose(event).get_epsilon(delta))


def _epsilons(
    noise_multiplier: float, sampling_rate: float, steps: int, delta: float, releases: int, which: Sequence[str]
) -> dict[str, float]:
    """Epsilon by each accountant in ``which`` (validated arguments; handles the 0 / inf corner cases)."""
    if steps == 0 or math.isinf(noise_multiplier):
        return dict.fromkeys(which, 0.0)
    if noise_multiplier == 0.0:
        return dict.fromkeys(which, math.inf)
    event = dp_event(noise_multiplier, sampling_rate, steps, releases)
    grid = pld_value_discretization(noise_multiplier / math.sqrt(releases), sampling_rate)
    return {name: _epsilon_of_event(event, delta, name, grid) for name in which}


def epsilon_spent(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    releases: int = 1,
    accountant: str = "best",
) -> float:
    """Epsilon at ``delta`` of :func:`dp_event` ``(noise_multiplier, sampling_rate, steps, releases)``.

    ``steps = 0`` -> ``0.0``; ``noise_multiplier = 0`` -> ``inf`` (non-private); ``noise_multiplier = inf`` -> ``0.0``.
    ``accountant="best"`` evaluates both RDP and PLD and returns the smaller.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps, minimum=0)
    d = check_delta(delta)
    k = check_releases(releases)
    name = check_accountant(accountant)
    which = ("rdp", "pld") if name == "best" else (name,)
    return min(_epsilons(sigma, q, count, d, k, which).values())


# --------------------------------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate_noise`: the noise to use and what the accountants say it costs.

    ``noise_multiplier`` is per release: each of the ``releases`` quantities of a step gets noise std
    ``noise_multiplier * its own L2 sensitivity``. ``epsilon`` is the figure of ``accountant`` (the one used; for
    ``"best"`` the tighter one at this multiplier) and is ``<= target_epsilon``.
    """

    noise_multiplier: float
    epsilon: float
    epsilon_rdp: float
    epsilon_pld: float
    accountant: str
    target_epsilon: float
    delta: float
    sampling_rate: float
    steps: int
    releases: int

    @property
    def combined_noise_multiplier(self) -> float:
        """Noise multiplier of one step's releases taken together (``noise_multiplier / sqrt(releases)``)."""
        return self.noise_multiplier / math.sqrt(self.releases)


def _smallest_admissible(
    which: str,
    target: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int,
    start: float,
    tolerance: float,
    *,
    start_gap: float | None = None,
    max_tries: int = 200,
) -> float:
    """Smallest ``sigma`` whose epsilon by ``which`` is ``<= target``, to relative ``tolerance``; never below it.

    Brackets geometrically from ``start`` (factor 2 up, factor 0.8 down: RDP and PLD differ by well under 20 %, so a
    bracket started from the other accountant's answer costs one or two evaluations), then bisects keeping
    ``eps(lo) > target >= eps(hi)`` and returns ``hi``. Why not ``dp_accounting.calibrate_dp_mechanism``: its
    accountant factory cannot see the candidate ``sigma``, and the PLD grid here depends on it
    (:func:`pld_value_discretization`); bisection also keeps the "never above target" invariant by construction, even
    if the numerical epsilon is not perfectly monotone in ``sigma`` at the 1e-9 level.
    """

    def gap(sigma: float) -> float:
        return epsilon_spent(sigma, sampling_rate, steps, delta, releases, which) - target

    hi = start
    hi_gap = gap(hi) if start_gap is None else start_gap
    tries = 0
    while hi_gap > 0.0:
        tries += 1
        if tries > max_tries:
            raise ValueError(f"no noise multiplier up to {hi:g} reaches epsilon={target}; check epsilon and delta")
        hi *= 2.0
        hi_gap = gap(hi)
    lo = hi
    while True:
        tries += 1
        if tries > max_tries:  # even a vanishing multiplier meets the target
            return hi
        lo *= 0.8
        if gap(lo) > 0.0:
            break
        hi = lo
    while hi - lo > tolerance * lo:
        middle = 0.5 * (lo + hi)
        if gap(middle) > 0.0:
            lo = middle
        else:
            hi = middle
    return hi


def _starting_guess(epsilon: float, delta: float, sampling_rate: float, steps: int, releases: int) -> float:
    """Rough multiplier to start the search: Abadi et al. 2016 (Thm 1) ``q sqrt(T log(1/delta)) / eps`` form.

    Only a starting point (the search brackets from it), floored at 0.5 where that asymptotic form breaks down.
    """
    sigma = sampling_rate * math.sqrt(2.0 * steps * math.log(1.0 / delta)) / epsilon
    return max(sigma, 0.5) * math.sqrt(releases)


def calibrate_noise(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int = 1,
    accountant: str = "best",
    tolerance: float = 1e-3,
) -> Calibration:
    """Smallest per-release noise multiplier whose epsilon (by ``accountant``) is ``<= epsilon`` after ``steps`` steps.

    ``tolerance`` is relative: the answer is within ``tolerance * sigma*`` above the exact smallest multiplier
    ``sigma*`` and is never below it (its epsilon never exceeds the target). ``epsilon = inf`` -> multiplier ``0``.

    For ``"best"`` the answer is ``min(sigma_rdp, sigma_pld)``: ``{sigma: min(eps_rdp, eps_pld) <= target}`` is the
    union of the two up-sets ``[sigma_rdp, inf)`` and ``[sigma_pld, inf)``. RDP is solved first (cheap); PLD is only
    searched below the RDP answer when PLD is tighter there (usual), which keeps PLD away from tiny multipliers where
    its grid gets large.
    """
    target = check_epsilon(epsilon)
    d = check_delta(delta)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps)
    k = check_releases(releases)
    name = check_accountant(accountant)
    if not isinstance(tolerance, numbers.Real) or not 0.0 < float(tolerance) < 1.0:
        raise ValueError(f"tolerance must be a relative tolerance in (0, 1), e.g. 1e-3; got {tolerance!r}")
    tol = max(float(tolerance), _RELATIVE_TOLERANCE_FLOOR)

    if math.isinf(target):
        return Calibration(0.0, math.inf, math.inf, math.inf, "rdp" if name == "best" else name, target, d, q, count, k)

    args = (target, d, q, count, k)
    sigma = _smallest_admissible("rdp", *args, start=_starting_guess(target, d, q, count, k), tolerance=tol)
    if name != "rdp":
        at_rdp = epsilon_spent(sigma, q, count, d, k, "pld") - target
        if at_rdp <= 0.0 or name == "pld":  # PLD tighter here (usual), or PLD alone was asked for
            sigma_pld = _smallest_admissible("pld", *args, start=sigma, tolerance=tol, start_gap=at_rdp)
        else:  # "best", and RDP is the tighter one at its own answer: PLD's answer is above it
            sigma_pld = sigma
        sigma = min(sigma, sigma_pld)

    eps = _epsilons(sigma, q, count, d, k, ("rdp", "pld"))
    tighter = "rdp" if eps["rdp"] <= eps["pld"] else "pld"
    used = tighter if name == "best" else name
    return Calibration(
        noise_multiplier=sigma,
        epsilon=eps[used],
        epsilon_rdp=eps["rdp"],
        epsilon_pld=eps["pld"],
        accountant=used,
        target_epsilon=target,
        delta=d,
        sampling_rate=q,
        steps=count,
        releases=k,
    )
