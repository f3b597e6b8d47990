"""Privacy accounting for Poisson-sampled Gaussian releases, on Google's ``dp-accounting``.

One *step* of a silo is: draw a Poisson sample of its records (rate ``q``), compute ``K`` quantities from that same
sample (e.g. SteFFLe's ``h_theta`` and ``h_W``: Gupta et al. 2024, Algorithm 1 line 8) and release each with
Gaussian noise. :func:`combined_noise_multiplier` shows the ``K`` releases are one Gaussian mechanism, so a run of ``T``
steps is ``T`` compositions of a Poisson-subsampled Gaussian (:func:`dp_event`). Its ``(epsilon, delta)`` comes from

* RDP (``dp_accounting.rdp.RdpAccountant``): Mironov et al. 2019 for the subsampled Gaussian, converted with the
  tighter bound of Balle et al. 2020 (Prop. 12); cheap, slightly loose;
* PLD (``dp_accounting.pld.PLDAccountant``): numerical composition of the privacy loss distribution (Koskela et al.
  2020; Doroshenko et al. 2022 "connect the dots"), pessimistic rounding (the library default, kept), so its epsilon is
  also an upper bound; usually 5-10 % tighter than RDP for DP-SGD-like settings, slower;
* ``"best"``: the smaller of the two. Both are valid upper bounds, so their minimum is one too.

Neighbouring relations (:data:`RELATIONS`), the ``relation`` argument of every accounting function here:

* ``"add_remove"`` (default): neighbours differ by one whole record, present or absent (DP-FedSGD, record-level DP).
  A release's ``sensitivity`` is the L2 norm bound of one record's contribution (e.g. the clip norm ``C`` of a sum of
  clipped per-record gradients). RDP, PLD and ``"best"`` all apply.
* ``"replace_one"``: neighbours differ in one record's *sensitive attribute* only (DP w.r.t. sensitive attributes:
  DP-FERMI paper Definition 2.2, SteFFLe Definition 2.3). The Poisson sample is drawn independently of the attributes,
  and each record's contribution to a released sum must lie in a ball of radius ``R`` **centred at 0, the
  contribution of a record that is not sampled**, whatever its attribute (e.g. a per-record vector clipped to norm
  ``C``: ``R = C``). ``R`` is the ``sensitivity`` given to :class:`~protocols.privacy.gaussian.GaussianMechanism`,
  so the noise multiplier is ``std / R``. Changing ``s_i`` then moves that contribution anywhere inside the ball, and
  the worst pair of outputs is dp-accounting's ``REPLACE`` adjacency (``pld/privacy_loss_mechanism.py``,
  ``AdditiveNoisePrivacyLoss``): ``mu_upper = q N(x + R) + (1 - q) N(x)``, ``mu_lower = q N(x - R) + (1 - q) N(x)``;
  at ``q = 1`` this is a Gaussian of sensitivity ``2 R`` (the library's note; ``tests/test_accountant.py`` checks
  it), and there only the distance between the two neighbours' values matters, not the centre, so ``R`` is half
  that distance (a histogram of group counts: :func:`protocols.privacy.gaussian.histogram_sensitivity`).
  Only PLD accounts it: ``PLDAccountant(neighboring_relation=REPLACE_ONE)`` hands the relation to
  ``from_gaussian_mechanism`` for ``GaussianDpEvent`` and ``PoissonSampledDpEvent(GaussianDpEvent)``, which builds
  one symmetric PMF with ``AdjacencyType.REPLACE`` (dp-accounting 0.6.0, the installed version). ``"best"`` therefore
  means PLD under ``replace_one``, and ``"rdp"`` is refused (:func:`check_accountant_supports`).

What ``replace_one`` relies on, and what it does not cover:

* That the library's pair is the worst pair in the ball. It is the textbook worst case (``c = -R e``, ``c' = R e``,
  all other records contributing 0); we did not prove that no other pair inside ``B(0, R)`` is worse, but
  ``tests/test_accountant.py`` checks, by 2-D numerical integration, that the hockey-stick divergences of several
  other pairs in the ball never exceed the library pair's.
* The centre must be 0. A ball of radius ``r`` around a centre ``m_i != 0`` that merely does not depend on ``s_i``
  (e.g. SteFFLe's W-gradient ``-2 W diag(F(x_i)) + 2 P_S^(-1/2) e_(s_i) F(x_i)^T``, whose first term is such a
  centre) is NOT covered with ``R = r``: for ``|m_i| >> noise std`` the output reveals whether record ``i`` was
  sampled, and the pair becomes ``(1 - q) A + q N(0)`` vs ``(1 - q) A + q N(2 r)`` with the "not sampled" part
  ``A`` disjoint, whose epsilon barely benefits from sampling (measured: q = 256/11300, T = 1770,
  delta = 1/33900^2, multiplier 4: 2.8 under REPLACE, 27 for that pair). Use ``R = max_i |m_i| + r`` (the
  triangle inequality puts the contribution in ``B(0, |m_i| + r)``), or clip the whole per-record contribution to a
  ball around 0.
* The sample must stay secret: a message that reveals who was sampled (e.g. an un-noised gradient of the same batch
  whose batch indices leak) gives the same disjoint pair. Draw such quantities on an independent sample.
* dp-accounting's ``RdpAccountant`` refuses ``PoissonSampledDpEvent`` under ``REPLACE_ONE``, and for a plain
  ``GaussianDpEvent`` under ``REPLACE_ONE`` it uses sensitivity 1 where its PLD accountant uses 2 (a different
  convention for the same event); this module never hands ``REPLACE_ONE`` to ``RdpAccountant``.

A valid RDP bound for ``replace_one`` does exist (replace = remove then add, joined by the weak triangle inequality
for Renyi divergences, Mironov 2017 Prop. 11: ``D_a(P||R) <= (a - 1/2)/(a - 1) D_2a(P||Q) + D_(2a-1)(Q||R)``), but it
is looser than PLD: 7-18 % above the PLD figure at q = 256/11300, T = 1770, delta = 1/33900^2, multipliers 2-8
(measured), so ``"best"`` would always pick PLD; we do not offer it.

One-off releases before the run (:class:`PriorRelease`, the ``prior`` argument): e.g. SteFFLe's setup round may
release a DP histogram of the silo's group counts once, without sampling. :func:`epsilon_spent` and
:func:`calibrate_noise` account the prior releases and the run as ONE composition (``ComposedDpEvent``, composed by the
accountant: PLD convolves the privacy loss distributions, RDP adds the curves), never as a sum of epsilons.

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
from dp_accounting import NeighboringRelation
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

ACCOUNTANTS = ("rdp", "pld", "best")
"""Accountant names accepted everywhere in this package. ``best`` = the smaller (tighter) of RDP and PLD (under
``replace_one``, where RDP has no analysis: PLD)."""

RELATIONS = ("add_remove", "replace_one")
"""Neighbouring relations accepted everywhere in this package (see the module docstring)."""

_LIBRARY_RELATIONS = {
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}

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


def check_relation(relation: object, *, name: str = "relation") -> str:
    """Return ``relation`` if it is one of :data:`RELATIONS`; else raise ``ValueError``."""
    if relation not in RELATIONS:
        raise ValueError(
            f"{name} must be one of {', '.join(RELATIONS)} (add_remove: one record present or absent; replace_one: one "
            f"record's sensitive attribute changed); got {relation!r}"
        )
    return str(relation)


def check_accountant_supports(accountant: str, relation: str) -> None:
    """Raise ``ValueError`` if ``accountant`` cannot account ``relation`` (``"rdp"`` under ``"replace_one"``)."""
    if accountant == "rdp" and relation == "replace_one":
        raise ValueError(
            "accountant='rdp' cannot account relation='replace_one': dp-accounting has no RDP analysis of "
            "Poisson-sampled Gaussians under replace-one neighbours (its RdpAccountant refuses them); use "
            "accountant='pld' or 'best' (both mean PLD under replace_one)"
        )


def library_accountants(accountant: str, relation: str) -> tuple[str, ...]:
    """The library accountants (``"rdp"``, ``"pld"``) whose figures ``accountant`` uses under ``relation``.

    ``"best"`` is both under ``add_remove`` and PLD alone under ``replace_one``. Arguments must be valid.
    """
    if accountant != "best":
        return (accountant,)
    return ("rdp", "pld") if relation == "add_remove" else ("pld",)


def library_relation(relation: str) -> NeighboringRelation:
    """dp-accounting's ``NeighboringRelation`` for one of :data:`RELATIONS`."""
    return _LIBRARY_RELATIONS[check_relation(relation)]


def pld_value_discretization(noise_multiplier: float, sampling_rate: float) -> float:
    """PLD grid step for a ``PoissonSampled(q, Gaussian(noise_multiplier))`` step: ``min(1e-3, q / (20 sigma))``.

    ``noise_multiplier`` is the step's combined multiplier. Why this rule: a fixed grid is too coarse when one step's
    privacy loss (of order ``q / sigma``) is comparable to the grid step. Measured at delta = 1e-9 against a grid 10x
    finer (``tests/test_accountant.py`` re-checks a few): the library default 1e-4 costs 0.3-0.8 s at q = 256/12000,
    T = 2000; a fixed 1e-3 is 10x faster but overstates epsilon by up to 5.7 % at epsilon ~ 0.3 (sigma ~ 17); this
    rule overstates it by at most 2.1e-4 (relative) from epsilon 0.28 to 30, T = 20 to 60,000, q = 0.02 to 0.5, in
    10-75 ms. The rounding is pessimistic at every grid (``pessimistic_estimate=True``, the library default, kept), so
    every grid gives an upper bound on the true epsilon; a coarser grid only loses tightness (in every case measured
    its epsilon was at or above the finer grid's). Under ``replace_one`` a step's loss is about twice as large for the
    same multiplier, so the same grid is relatively finer: measured against a 10x finer grid it overstates epsilon by
    at most 5.6e-5 (relative) for q = 0.02-0.2, T = 40-60,000, epsilon 1.3-180, in 10-80 ms.
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

    The event is the same under every neighbouring relation: in dp-accounting a ``DpEvent`` describes the mechanism
    and the relation is a property of the accountant that composes it (``PLDAccountant(neighboring_relation=...)``),
    which is why this function has no ``relation`` argument.
    """
    sigma = check_noise_multiplier(noise_multiplier, allow_inf=False)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps)
    k = check_releases(releases)
    gaussian = dp_accounting.GaussianDpEvent(sigma / math.sqrt(k))
    step = gaussian if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)
    return dp_accounting.SelfComposedDpEvent(step, count)


@dataclass(frozen=True)
class PriorRelease:
    """Gaussian releases made on the same records outside the run being accounted (e.g. a setup-round histogram).

    ``steps`` mechanisms, each on a Poisson sample of rate ``sampling_rate`` (``1.0``, the default: the whole data set,
    no sampling) releasing ``releases`` quantities, each with noise std ``noise_multiplier`` x its sensitivity under the
    relation in use (``inf``: nothing revealed). Wherever a prior is accepted, a tuple
    ``(noise_multiplier[, sampling_rate[, steps[, releases]]])`` is too (:func:`as_priors`).

    Example, SteFFLe's setup round under ``replace_one``: a histogram of the silo's ``k`` group counts with noise std
    ``s`` is ``PriorRelease(s / histogram_sensitivity("replace_one"))`` (see
    :func:`protocols.privacy.gaussian.histogram_sensitivity`).
    """

    noise_multiplier: float
    sampling_rate: float = 1.0
    steps: int = 1
    releases: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "noise_multiplier",
            check_noise_multiplier(self.noise_multiplier, name="PriorRelease.noise_multiplier"),
        )
        object.__setattr__(
            self, "sampling_rate", check_sampling_rate(self.sampling_rate, name="PriorRelease.sampling_rate")
        )
        object.__setattr__(self, "steps", check_steps(self.steps, name="PriorRelease.steps"))
        object.__setattr__(self, "releases", check_releases(self.releases, name="PriorRelease.releases"))

    @property
    def combined_noise_multiplier(self) -> float:
        """Noise multiplier of one step's releases taken together (``noise_multiplier / sqrt(releases)``)."""
        return self.noise_multiplier / math.sqrt(self.releases)


def as_priors(prior: object, *, name: str = "prior") -> tuple[PriorRelease, ...]:
    """``prior`` (a sequence of :class:`PriorRelease` or of tuples of its fields, in order) as a tuple of releases.

    Raises ``ValueError`` naming ``prior[i]`` for an element that is neither, or whose fields are invalid.
    """
    if isinstance(prior, (str, bytes)) or not isinstance(prior, Sequence):
        raise ValueError(
            f"{name} must be a sequence of PriorRelease or of (noise_multiplier[, sampling_rate[, steps[, releases]]]) "
            f"tuples, got {prior!r}"
        )
    releases: list[PriorRelease] = []
    for index, item in enumerate(prior):
        if isinstance(item, PriorRelease):
            releases.append(item)
            continue
        if not isinstance(item, (tuple, list)) or not 1 <= len(item) <= 4:
            raise ValueError(
                f"{name}[{index}] must be a PriorRelease or a (noise_multiplier[, sampling_rate[, steps[, releases]]]) "
                f"tuple, got {item!r}"
            )
        try:
            releases.append(PriorRelease(*item))
        except ValueError as error:
            raise ValueError(f"{name}[{index}]: {error}") from None
    return tuple(releases)


def _make_accountant(
    which: str, pld_discretization: float, relation: str = "add_remove"
) -> dp_accounting.PrivacyAccountant:
    """A fresh library accountant of kind ``which`` (``rdp`` or ``pld``), configured as everywhere in this module.

    RDP is only ever built for ``add_remove`` (see :func:`check_accountant_supports`).
    """
    if which == "rdp":
        check_accountant_supports("rdp", relation)
        return RdpAccountant()
    return PLDAccountant(
        neighboring_relation=library_relation(relation), value_discretization_interval=pld_discretization
    )


def _epsilon_of_event(
    event: dp_accounting.DpEvent, delta: float, accountant: str, pld_discretization: float, relation: str = "add_remove"
) -> float:
    """Epsilon of ``event`` at ``delta`` by one accountant (``rdp`` or ``pld``) under ``relation``, via the library."""
    return float(_make_accountant(accountant, pld_discretization, relation).compose(event).get_epsilon(delta))


def _epsilons(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    releases: int,
    which: Sequence[str],
    relation: str = "add_remove",
    prior: Sequence[PriorRelease] = (),
    companion: float = math.inf,
) -> dict[str, float]:
    """Epsilon by each accountant in ``which`` of ``prior`` followed by the run (validated arguments).

    ``companion`` (``inf``: none) is the multiplier of a second release per step on an independent Poisson sample of
    the same rate: the run is then ``steps`` of each, composed (see :func:`epsilon_spent`).

    Handles the corner cases: parts with no step or an infinite multiplier reveal nothing and are left out (nothing
    left: ``0.0``); a part with multiplier 0 is non-private (``inf``). The parts are composed in that order as one
    ``ComposedDpEvent`` (a single part is passed as is), on the finest PLD grid any part needs.
    """
    parts = [(p.combined_noise_multiplier, p.sampling_rate, p.steps) for p in prior]
    parts.append((noise_multiplier / math.sqrt(releases), sampling_rate, steps))
    parts.append((companion, sampling_rate, steps))
    parts = [(sigma, q, count) for sigma, q, count in parts if count > 0 and not math.isinf(sigma)]
    if not parts:
        return dict.fromkeys(which, 0.0)
    if any(sigma == 0.0 for sigma, _, _ in parts):
        return dict.fromkeys(which, math.inf)
    events = [dp_event(sigma, q, count) for sigma, q, count in parts]
    event = events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
    grid = min(pld_value_discretization(sigma, q) for sigma, q, _ in parts)
    return {name: _epsilon_of_event(event, delta, name, grid, relation) for name in which}


def epsilon_spent(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    releases: int = 1,
    accountant: str = "best",
    *,
    relation: str = "add_remove",
    prior: Sequence[PriorRelease | tuple] = (),
    companion: float = math.inf,
) -> float:
    """Epsilon at ``delta`` of :func:`dp_event` ``(noise_multiplier, sampling_rate, steps, releases)``, by ``relation``.

    ``companion`` (``inf``, the default: none): each step also makes one Gaussian release with this noise multiplier
    on its OWN Poisson sample of rate ``sampling_rate``, drawn independently of the first (FedFDP's loss release: Ling
    et al. 2024, arXiv 2402.16028 v6, Algorithm 2 lines 16-20). Two samples make two mechanisms, not one
    (:func:`combined_noise_multiplier` does not apply): the run is
    ``ComposedDpEvent([dp_event(noise_multiplier, q, steps, releases), dp_event(companion, q, steps)])``.

    ``steps = 0`` -> ``0.0``; ``noise_multiplier = 0`` -> ``inf`` (non-private); ``noise_multiplier = inf`` -> ``0.0``.
    ``accountant="best"`` evaluates both RDP and PLD and returns the smaller (PLD alone under ``replace_one``;
    ``"rdp"`` there raises ``ValueError``). ``prior`` releases (:class:`PriorRelease`) are composed before the run, as
    one composition; with them, ``steps = 0`` gives the epsilon of the prior releases alone.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps, minimum=0)
    d = check_delta(delta)
    k = check_releases(releases)
    name = check_accountant(accountant)
    rel = check_relation(relation)
    check_accountant_supports(name, rel)
    priors = as_priors(prior)
    second = check_noise_multiplier(companion, name="companion")
    return min(_epsilons(sigma, q, count, d, k, library_accountants(name, rel), rel, priors, second).values())


# --------------------------------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate_noise`: the noise to use and what the accountants say it costs.

    ``noise_multiplier`` is per release: each of the ``releases`` quantities of a step gets noise std
    ``noise_multiplier * its own L2 sensitivity`` (under ``replace_one``: x its ball radius ``R``). ``epsilon`` is the
    figure of ``accountant`` (the one used; for ``"best"`` the tighter one at this multiplier) and is
    ``<= target_epsilon``; it covers the ``prior`` releases and the run together. ``epsilon_rdp`` is ``inf`` under
    ``replace_one``, where RDP has no analysis and certifies nothing.
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
    relation: str = "add_remove"
    prior: tuple[PriorRelease, ...] = ()

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
    relation: str = "add_remove",
    prior: Sequence[PriorRelease] = (),
    companion_ratio: float = math.inf,
) -> float:
    """Smallest ``sigma`` whose epsilon by ``which`` is ``<= target``, to relative ``tolerance``; never below it.

    With a finite ``companion_ratio`` each candidate ``sigma`` comes with a companion release of multiplier
    ``companion_ratio * sigma`` (see :func:`epsilon_spent`).

    Brackets geometrically from ``start`` (factor 2 up, factor 0.8 down: RDP and PLD differ by well under 20 %, so a
    bracket started from the other accountant's answer costs one or two evaluations), then bisects keeping
    ``eps(lo) > target >= eps(hi)`` and returns ``hi``. Why not ``dp_accounting.calibrate_dp_mechanism``: its
    accountant factory cannot see the candidate ``sigma``, and the PLD grid here depends on it
    (:func:`pld_value_discretization`); bisection also keeps the "never above target" invariant by construction, even
    if the numerical epsilon is not perfectly monotone in ``sigma`` at the 1e-9 level.
    """

    def gap(sigma: float) -> float:
        return (
            epsilon_spent(
                sigma,
                sampling_rate,
                steps,
                delta,
                releases,
                which,
                relation=relation,
                prior=prior,
                companion=companion_ratio * sigma,
            )
            - target
        )

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


def _starting_guess(
    epsilon: float, delta: float, sampling_rate: float, steps: int, releases: int, relation: str = "add_remove"
) -> float:
    """Rough multiplier to start the search: Abadi et al. 2016 (Thm 1) ``q sqrt(T log(1/delta)) / eps`` form.

    Only a starting point (the search brackets from it), floored at 0.5 where that asymptotic form breaks down. Under
    ``replace_one`` the neighbours' outputs are up to ``2 R`` apart, so the guess is scaled by
    :data:`_REPLACE_ONE_GUESS_FACTOR`.
    """
    sigma = sampling_rate * math.sqrt(2.0 * steps * math.log(1.0 / delta)) / epsilon
    factor = _REPLACE_ONE_GUESS_FACTOR if relation == "replace_one" else 1.0
    return max(sigma, 0.5) * math.sqrt(releases) * factor


_REPLACE_ONE_GUESS_FACTOR = 2.0
"""replace_one multiplier / add_remove multiplier for the same target, roughly: measured 1.36-2.0 (2.0 at q = 1, where
replace_one is a Gaussian of doubled sensitivity, and 1.96 at q = 256/11300, T = 1770, epsilon = 1)."""


def calibrate_noise(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int = 1,
    accountant: str = "best",
    tolerance: float = 1e-3,
    *,
    relation: str = "add_remove",
    prior: Sequence[PriorRelease | tuple] = (),
    companion_ratio: float = math.inf,
) -> Calibration:
    """Smallest per-release noise multiplier whose epsilon (by ``accountant``) is ``<= epsilon`` after ``steps`` steps.

    ``companion_ratio`` (``inf``: none): every step also makes a release on its own, independent Poisson sample with
    multiplier ``companion_ratio * sigma`` (FedFDP's loss release at sigma_l = 2.5 sigma, the ratio of the paper's
    defaults sigma = 2, sigma_l = 5: Ling et al. 2024, arXiv 2402.16028); the target then bounds both, composed
    (:func:`epsilon_spent` ``companion``).

    ``tolerance`` is relative: the answer is within ``tolerance * sigma*`` above the exact smallest multiplier
    ``sigma*`` and is never below it (its epsilon never exceeds the target). ``epsilon = inf`` -> multiplier ``0``.

    ``relation`` is the neighbouring relation (:data:`RELATIONS`; ``"rdp"`` under ``"replace_one"`` raises
    ``ValueError``). ``prior`` lists releases made before the run (:class:`PriorRelease`, e.g. a setup-round
    histogram at ``sampling_rate=1``): the target then bounds the composition of the prior releases and the run,
    accounted as one composition. If the prior releases alone already reach the target, ``ValueError`` says so.

    For ``"best"`` the answer is ``min(sigma_rdp, sigma_pld)``: ``{sigma: min(eps_rdp, eps_pld) <= target}`` is the
    union of the two up-sets ``[sigma_rdp, inf)`` and ``[sigma_pld, inf)``. RDP is solved first (cheap); PLD is only
    searched below the RDP answer when PLD is tighter there (usual), which keeps PLD away from tiny multipliers where
    its grid gets large. Under ``add_remove`` the RDP answer is also the starting point of the ``"pld"`` search.
    Under ``replace_one`` (or when RDP cannot meet the target after the prior releases) PLD is searched alone, from
    :func:`_starting_guess`.
    """
    target = check_epsilon(epsilon)
    d = check_delta(delta)
    q = check_sampling_rate(sampling_rate)
    count = check_steps(steps)
    k = check_releases(releases)
    name = check_accountant(accountant)
    rel = check_relation(relation)
    check_accountant_supports(name, rel)
    priors = as_priors(prior)
    if not isinstance(tolerance, numbers.Real) or not 0.0 < float(tolerance) < 1.0:
        raise ValueError(f"tolerance must be a relative tolerance in (0, 1), e.g. 1e-3; got {tolerance!r}")
    tol = max(float(tolerance), _RELATIVE_TOLERANCE_FLOOR)
    which = library_accountants(name, rel)

    def result(sigma: float, eps: dict[str, float], used: str) -> Calibration:
        return Calibration(
            noise_multiplier=sigma,
            epsilon=eps[used],
            epsilon_rdp=eps.get("rdp", math.inf),
            epsilon_pld=eps["pld"],
            accountant=used,
            target_epsilon=target,
            delta=d,
            sampling_rate=q,
            steps=count,
            releases=k,
            relation=rel,
            prior=priors,
        )

    if math.isinf(target):
        return result(0.0, {"rdp": math.inf, "pld": math.inf}, which[0] if name == "best" else name)

    kinds = ("rdp", "pld") if rel == "add_remove" else ("pld",)
    floors = _epsilons(math.inf, q, count, d, k, kinds, rel, priors)  # the prior releases alone
    if all(floors[kind] >= target for kind in which):
        raise ValueError(
            f"the prior releases alone already spend epsilon={min(floors[kind] for kind in which):.6g} (accountant "
            f"{name}, relation {rel}, delta={d:g}), not below the target epsilon={target:g}: no noise on the run can "
            "meet it; raise the target or the prior releases' noise multiplier"
        )

    args = (target, d, q, count, k)
    if not isinstance(companion_ratio, numbers.Real) or not float(companion_ratio) > 0.0:
        raise ValueError(f"companion_ratio must be > 0 (inf: no companion release), got {companion_ratio!r}")
    ratio = float(companion_ratio)
    extra = {"relation": rel, "prior": priors}
    if rel == "add_remove" and floors["rdp"] < target:
        sigma = _smallest_admissible(
            "rdp", *args, start=_starting_guess(*args), tolerance=tol, companion_ratio=ratio, **extra
        )
        if name != "rdp" and floors["pld"] < target:
            at_rdp = epsilon_spent(sigma, q, count, d, k, "pld", companion=ratio * sigma, **extra) - target
            if at_rdp <= 0.0 or name == "pld":  # PLD tighter here (usual), or PLD alone was asked for
                sigma_pld = _smallest_admissible(
                    "pld", *args, start=sigma, tolerance=tol, start_gap=at_rdp, companion_ratio=ratio, **extra
                )
            else:  # "best", and RDP is the tighter one at its own answer: PLD's answer is above it
                sigma_pld = sigma
            sigma = min(sigma, sigma_pld)
    else:  # PLD alone: replace_one, or RDP cannot meet the target once the prior releases are counted
        sigma = _smallest_admissible(
            "pld", *args, start=_starting_guess(*args, rel), tolerance=tol, companion_ratio=ratio, **extra
        )

    eps = _epsilons(sigma, q, count, d, k, kinds, rel, priors, ratio * sigma)
    eps_rdp = eps.get("rdp", math.inf)
    tighter = "rdp" if eps_rdp <= eps["pld"] else "pld"
    return result(sigma, eps, tighter if name == "best" else name)
