"""Epsilon of a composition of ledger entries, by RDP and by PLD, as dp-accounting's accountants compute it, cached.

A :data:`State` is a tuple of accounting keys ``(noise, sampling rate, steps)``, one per
:class:`~protocols.privacy.ledger.LedgerEntry` (:meth:`~protocols.privacy.ledger.LedgerEntry.accounting_key`), oldest
first. Its epsilon is that of ``ComposedDpEvent([dp_event(entry) for entry in entries])``: :func:`rdp_epsilon` and
:func:`pld_epsilon` reproduce, operation for operation, what dp-accounting's ``RdpAccountant`` / ``PLDAccountant`` do
for that event (:func:`protocols.privacy.accountant.epsilon_spent` hands it to them), with the expensive
per-mechanism parts cached, so that a silo's ledger admits exactly the ``T`` steps ``calibrate_noise`` chose at a
fraction of the cost. tests/protocols/privacy/test_ledger.py checks the results equal the library's.

Why not call :mod:`protocols.privacy.accountant`: it builds fresh library accountants for each figure (10-40 ms for
RDP, 10-75 ms for PLD), which a silo charging every round of a run of thousands of rounds cannot afford; here

* RDP: the per-step RDP curve of each mechanism is computed once (:func:`rdp_curve`); a state's RDP is
  ``sum_e steps_e * curve_e`` plus one vectorized conversion to epsilon (:func:`rdp_to_epsilon`, ~0.2 ms);
* PLD: the per-step PLD of each mechanism, and the fold of every entry but the last, are cached
  (:func:`pld_epsilon`), so the many evaluations of one ledger that differ only in the last entry's step count build
  the earlier entries once.

The caches are per process; :func:`clear_caches` empties them (figures do not change).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import RdpAccountant, compute_epsilon

from silofl.protocols.privacy.accountant import check_delta, check_relation, library_relation, pld_value_discretization

DP_ACCOUNTING_CHECKED = ("0.6.0", "0.7")
"""dp-accounting versions this module was checked against: ``>= [0]`` and ``< [1]`` (``dp-accounting>=0.6,<0.7``).

The module uses only dp-accounting's public API, but it reproduces, operation for operation, what its ``RdpAccountant``
and ``PLDAccountant`` compute (:func:`rdp_to_epsilon` re-implements ``compute_epsilon``; :func:`pld_epsilon` composes
the PLDs as ``PLDAccountant`` does), so that a silo's ledger admits exactly the ``T`` steps ``calibrate_noise`` chose.
tests/protocols/privacy/test_ledger.py checks that equality, and fails when the installed version is outside this range:
on a new dp-accounting, re-run tests/protocols/privacy/test_ledger.py and tests/protocols/privacy/test_accountant.py,
read the library's changes to ``rdp_privacy_accountant`` and ``pld`` (RDP conversion, PLD composition / discretization),
then widen the range here and in pyproject.toml. (0.4.4 made ``RdpAccountant.orders`` / ``.rdp`` public; 0.5.0 added the
PLD ``neighboring_relation`` used for ``replace_one``; 0.6.0 added ``get_epsilon_gaussian``, which the tests use.)"""

#: One step's noise: a multiplier, or a tuple of multipliers of releases on independent Poisson samples of one rate.
StepNoise = float | tuple[float, ...]
#: A ledger's entries as the accountants see them: ``(noise, sampling rate, steps)`` per entry, oldest first.
State = tuple[tuple[StepNoise, float, int], ...]


def _multipliers(mechanism: StepNoise) -> tuple[float, ...]:
    """The multipliers of a step's independent releases (one for a plain entry)."""
    return mechanism if isinstance(mechanism, tuple) else (mechanism,)


def _non_private(state: State) -> bool:
    """Whether some release of the state has no noise (its epsilon is then ``inf``)."""
    return any(sigma == 0.0 for mechanism, _, _ in state for sigma in _multipliers(mechanism))


def _grid(state: State) -> float:
    """The finest PLD grid any release of the state needs (as ``epsilon.epsilons_by_accountant``)."""
    return min(pld_value_discretization(sigma, q) for mechanism, q, _ in state for sigma in _multipliers(mechanism))


@functools.lru_cache(maxsize=64)
def rdp_curve(sigma: float, sampling_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP per step) of one ``PoissonSampled(q, Gaussian(sigma))`` step (or ``Gaussian(sigma)`` if q = 1).

    Read through ``RdpAccountant``'s public ``orders`` / ``rdp`` properties (copies of its arrays; dp-accounting >=
    0.4.4, see :data:`DP_ACCOUNTING_CHECKED`), so the curve is the library's own for the event, whatever its internals.
    Computing it once per mechanism is what makes a charge cost ~0.2 ms instead of ~30 ms. The arrays are read-only.
    """
    step = GaussianDpEvent(sigma)
    if sampling_rate != 1.0:
        step = PoissonSampledDpEvent(sampling_rate, step)
    accountant = RdpAccountant()
    accountant.compose(step)
    orders = np.asarray(accountant.orders, dtype=np.float64)
    curve = np.asarray(accountant.rdp, dtype=np.float64)
    orders.flags.writeable = False
    curve.flags.writeable = False
    return orders, curve


def rdp_epsilon(state: State, delta: float) -> float:
    """RDP epsilon at ``delta`` of ``state`` (``add_remove`` only): what ``RdpAccountant`` gives for the composed
    events, from the cached per-step curves (:func:`rdp_curve`) and one conversion (:func:`rdp_to_epsilon`)."""
    if not state:
        return 0.0
    if _non_private(state):
        return math.inf
    orders = None
    total = None
    for mechanism, q, steps in state:
        for sigma in _multipliers(mechanism):
            orders, curve = rdp_curve(sigma, q)
            total = np.zeros_like(curve) if total is None else total
            total += steps * curve
    return rdp_to_epsilon(orders, total, delta)


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """dp-accounting's `compute_epsilon` (the improved RDP -> (eps, delta) conversion of Balle et al. 2020,
    Proposition 12, as in `rdp_privacy_accountant.compute_epsilon`), vectorized over the orders.

    Why our own: the library loops over ~100 orders in Python (~0.2 ms), and a silo converts once per round for
    runs of thousands of rounds; tests check equality with the library on the same inputs.
    """
    if delta <= 0:
        return compute_epsilon(orders, rdp, delta)[0]
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    usable, log_term, delta_term = _conversion_terms(a.tobytes(), delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(usable, r + log_term - delta_term, np.inf)
        eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)  # KL bound: epsilon = 0 suffices
        eps = np.where(r < 0, 0.0, eps)  # numerical noise below zero, as the library treats it
    return float(max(0.0, eps[int(np.argmin(eps))]))


@functools.lru_cache(maxsize=64)
def _conversion_terms(orders: bytes, delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of :func:`rdp_to_epsilon`'s bound that depend only on the orders and delta (the same for every
    round of a run): which orders are used, log1p(-1/a) and log(delta a) / (a - 1). The bound is then
    ``rdp + log1p(-1/a) - log(delta a) / (a - 1)``, the very operations in the very order of the formula."""
    a = np.frombuffer(orders, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = (a > 1.01, np.log1p(-1.0 / a), np.log(delta * a) / (a - 1.0))
    for term in terms:
        term.flags.writeable = False
    return terms


@functools.lru_cache(maxsize=16)
def _pld_step(
    sigma: float, sampling_rate: float, grid: float, relation: str = "add_remove"
) -> pld_lib.PrivacyLossDistribution:
    """PLD of one Poisson-sampled Gaussian step, as ``PLDAccountant`` builds it (the construction is the slow part)."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=grid,
        sampling_prob=sampling_rate,
        neighboring_relation=library_relation(relation),
    )


def pld_epsilon(state: State, delta: float, relation: str = "add_remove") -> float:
    """PLD epsilon of ``state`` under ``relation``: what ``PLDAccountant(neighboring_relation=...)`` gives for the
    composed events, on the finest grid any entry needs (as :func:`~protocols.privacy.accountant.epsilon_spent`).

    The composition is the library's left fold ``identity . e_1 . e_2 ... e_n``; the fold of every entry but the last
    is cached (:func:`_pld_prefix`), so that the many evaluations of one ledger, which differ only in the last entry's
    step count (the ladder, the certificates), build and compose the earlier entries (e.g. SteFFLe's histogram) once.
    The operations, and so the figure, are those of the uncached fold: PLD objects are immutable.
    """
    if not state:
        return 0.0
    if _non_private(state):
        return math.inf
    grid = _grid(state)
    *prefix, last = state
    distribution = _pld_prefix(tuple(prefix), grid, relation)
    for part in _pld_parts(last, grid, relation):
        distribution = distribution.compose(part)
    return float(distribution.get_epsilon_for_delta(delta))


def composed_epsilon(state: State, delta: float, relation: str) -> float:
    """PLD epsilon at ``delta`` of the composition of ``state`` (ledger keys ``(multiplier, sampling rate, steps)``)
    under ``relation``: what a silo's lifetime ledger reports for the events of all its jobs
    (`client.lifetime_ledger`), by the same library calls as a job's ledger. ``inf`` if any release is un-noised."""
    check_delta(delta)
    check_relation(relation)
    return pld_epsilon(tuple(state), delta, relation)


#: The PLD grid of a composition with randomized responses and no Gaussian release (dp-accounting's default).
RESPONSE_GRID = 1e-4


def composed_epsilon_with_responses(
    state: State, responses: tuple[tuple[float, int], ...], delta: float, relation: str
) -> float:
    """:func:`composed_epsilon` of ``state`` composed with randomized responses, each ``(noise parameter, buckets)``
    as dp-accounting's ``RandomizedResponseDpEvent`` (a sensitive party's permanent randomized response of its test
    records' groups, made by versions before the sealed record exchange and still in its lifetime ledger), under
    ``relation``, which must be ``replace_one`` (the library defines the response's PLD for replacing a record
    only)."""
    check_delta(delta)
    check_relation(relation)
    if not responses:
        return pld_epsilon(tuple(state), delta, relation)
    if relation != "replace_one":
        raise ValueError(f"randomized responses compose under replace_one only, not {relation!r}")
    if state and _non_private(tuple(state)):
        return math.inf
    grid = _grid(tuple(state)) if state else RESPONSE_GRID
    distribution = _pld_prefix(tuple(state), grid, relation)
    for noise, buckets in responses:
        distribution = distribution.compose(
            pld_lib.from_randomized_response(
                noise_parameter=noise,
                num_buckets=buckets,
                value_discretization_interval=grid,
                neighboring_relation=library_relation(relation),
            )
        )
    return float(distribution.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=64)
def _pld_prefix(prefix: State, grid: float, relation: str) -> pld_lib.PrivacyLossDistribution:
    """``identity . e_1 ... e_k`` for the entries of ``prefix``, in order, on ``grid`` (see :func:`pld_epsilon`)."""
    distribution = pld_lib.identity(value_discretization_interval=grid)
    for entry in prefix:
        for part in _pld_parts(entry, grid, relation):
            distribution = distribution.compose(part)
    return distribution


def _pld_parts(
    entry: tuple[StepNoise, float, int], grid: float, relation: str
) -> list[pld_lib.PrivacyLossDistribution]:
    """The PLDs one ledger entry adds to the fold: one per independent release (``PLDAccountant`` composes a
    ``ComposedDpEvent`` of self-composed events part by part, in order)."""
    mechanism, q, steps = entry
    return [_pld_part((sigma, q, steps), grid, relation) for sigma in _multipliers(mechanism)]


def _pld_part(entry: tuple[float, float, int], grid: float, relation: str) -> pld_lib.PrivacyLossDistribution:
    """PLD of one ledger entry (``steps`` steps of one mechanism), as ``PLDAccountant`` builds it."""
    sigma, q, steps = entry
    if q == 1.0:  # PLDAccountant on SelfComposed(Gaussian): one Gaussian with std sigma / sqrt(steps)
        return _pld_gaussian(sigma / math.sqrt(steps), grid, relation)
    return _pld_step(sigma, q, grid, relation).self_compose(steps)


@functools.lru_cache(maxsize=16)
def _pld_gaussian(standard_deviation: float, grid: float, relation: str) -> pld_lib.PrivacyLossDistribution:
    """PLD of one unsampled Gaussian release (e.g. a one-off histogram); cached like :func:`_pld_step`."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=standard_deviation,
        value_discretization_interval=grid,
        neighboring_relation=library_relation(relation),
    )


def clear_caches() -> None:
    """Forget the RDP curves, conversion terms and PLDs this module keeps between ledgers (figures do not change:
    every cached value is recomputed the same way)."""
    rdp_curve.cache_clear()
    _conversion_terms.cache_clear()
    _pld_step.cache_clear()
    _pld_prefix.cache_clear()
    _pld_gaussian.cache_clear()
