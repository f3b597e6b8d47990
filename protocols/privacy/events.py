"""A run in dp-accounting's terms: its ``DpEvent``, the library's accountants and relation, and the PLD grid.

:func:`combined_noise_multiplier` shows a step's ``K`` releases from one sample are one Gaussian mechanism,
:func:`dp_event` is the event of a run of such steps, :class:`PriorRelease` (and :func:`as_priors`) a one-off release
before it; :func:`library_accountants` and :func:`library_relation` map this package's accountant and relation names
onto dp-accounting's, and :func:`pld_value_discretization` is the PLD grid every epsilon here is computed on. Why the
event has this shape and what each relation covers: :mod:`protocols.privacy.accountant`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import dp_accounting
from dp_accounting import NeighboringRelation

from silofl.protocols.privacy.checks import (
    check_noise_multiplier,
    check_relation,
    check_releases,
    check_sampling_rate,
    check_steps,
)

_LIBRARY_RELATIONS = {
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}

PLD_MAX_VALUE_DISCRETIZATION = 1e-3
"""Coarsest grid step of privacy-loss values the PLD accountant uses (see :func:`pld_value_discretization`)."""

PLD_GRID_POINTS_PER_LOSS_SCALE = 20
"""Grid steps per ``q / sigma``, the scale of one subsampled-Gaussian step's privacy loss."""


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
    finer (``tests/protocols/privacy/test_accountant.py`` re-checks a few): the library default 1e-4 costs 0.3-0.8 s
    at q = 256/12000, T = 2000; a fixed 1e-3 is 10x faster but overstates epsilon by up to 5.7 % at epsilon ~ 0.3
    (sigma ~ 17); this rule overstates it by at most 2.1e-4 (relative) from epsilon 0.28 to 30, T = 20 to 60,000,
    q = 0.02 to 0.5, in 10-75 ms. The rounding is pessimistic at every grid (``pessimistic_estimate=True``, the library
    default, kept), so every grid gives an upper bound on the true epsilon; a coarser grid only loses tightness (in
    every case measured its epsilon was at or above the finer grid's). Under ``replace_one`` a step's loss is about
    twice as large for the same multiplier, so the same grid is relatively finer: measured against a 10x finer grid it
    overstates epsilon by at most 5.6e-5 (relative) for q = 0.02-0.2, T = 40-60,000, epsilon 1.3-180, in 10-80 ms.
    """
    if math.isinf(noise_multiplier) or noise_multiplier <= 0.0:
        return PLD_MAX_VALUE_DISCRETIZATION
    return min(PLD_MAX_VALUE_DISCRETIZATION, sampling_rate / (PLD_GRID_POINTS_PER_LOSS_SCALE * noise_multiplier))


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
