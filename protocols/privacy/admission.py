"""Cheap admission of a charge near its budget: PLD figures that bound a ledger's epsilon without one PLD per charge.

A silo checks every charge against its budget. A PLD evaluation costs 10-75 ms, and near the end of a calibrated run
(where PLD is the tighter accountant) every remaining round needs one. Both functions here answer "is this state
within ``limit``?" with a figure that is the state's PLD epsilon or a sound upper bound on its true epsilon, from a few
evaluations per run instead of one per charge:

* :func:`pld_certified` (``"best"`` accountant under ``add_remove``, once RDP alone would refuse): one search finds
  the largest step count of the last mechanism still within ``limit``; every later charge up to it is admitted with
  that count's figure.
* :func:`pld_ladder` (``replace_one``, where PLD is the only accountant): a ladder of evaluations of longer runs of
  the last mechanism, ``LADDER_RATIO`` apart.

What they remember (:data:`_CERTIFICATES`, :data:`_LADDERS`) is module-level, so it outlives the ledger objects rebuilt
from a silo's state on every message; :func:`clear_caches` forgets it. Every evaluation goes through
:func:`protocols.privacy.composition.pld_epsilon` (looked up on its module at each call, so a test can count them).
"""

from __future__ import annotations

import bisect
import math

from silofl.protocols.privacy import composition
from silofl.protocols.privacy.composition import State

LADDER_RATIO = 1.1
"""Under PLD-only accounting a charge at ``s`` steps that no evaluated run covers extends the ladder to
``max(s + 1, ceil(LADDER_RATIO * s))`` steps (:func:`pld_ladder`). Smaller: tighter figures, more evaluations."""

_CACHE_LIMIT = 1024
"""Certificates / ladders kept before the store starts over (one per ledger prefix, mechanism, delta, ...)."""

_CERTIFICATES: dict[tuple[State, float, float, float, float], tuple[int, float]] = {}
"""(earlier entries, sigma, q, delta, limit) -> (steps, PLD epsilon at those steps <= limit): PLD certified the last
mechanism admissible up to that many steps. Module-level, so it outlives the ledger objects rebuilt from a silo's
state on every message."""


def pld_certified(state: State, delta: float, limit: float) -> float:
    """PLD epsilon of `state`, or an upper bound on it that is still within `limit`, at amortised ~0 cost.

    Under ``"best"`` PLD is consulted only once RDP alone would refuse: near the end of a calibrated run, for every
    remaining round, at 10-75 ms each. PLD epsilon grows with the number of steps of the last mechanism, so one search
    (doubling, then bisection: ~log2(steps) evaluations) finds the largest step count still within `limit`; every later
    charge up to that count is admitted with that count's epsilon, an upper bound on its own. A state beyond the
    certified count, or whose PLD exceeds `limit`, gets its exact PLD figure.
    """
    *prefix, (sigma, q, steps) = state
    key = (tuple(prefix), sigma, q, delta, limit)
    certificate = _CERTIFICATES.get(key)
    if certificate is not None and steps <= certificate[0]:
        return certificate[1]
    exact = composition.pld_epsilon(state, delta)
    if exact > limit:
        return exact
    good, good_eps = steps, exact
    bad = None
    probe = steps * 2
    while bad is None or bad - good > max(1, good // 1000):
        eps = composition.pld_epsilon((*prefix, (sigma, q, probe)), delta)
        if eps <= limit:
            good, good_eps = probe, eps
        else:
            bad = probe
        probe = good * 2 if bad is None else (good + bad) // 2
    if len(_CERTIFICATES) >= _CACHE_LIMIT:
        _CERTIFICATES.clear()
    _CERTIFICATES[key] = (good, good_eps)
    return exact


_LADDERS: dict[tuple[State, float, float, float, str], list[tuple[int, float]]] = {}
"""(earlier entries, sigma, q, delta, relation) -> sorted (steps, PLD epsilon) of every evaluation of the last mechanism
made by :func:`pld_ladder`. Module-level for the same reason as ``_CERTIFICATES``."""


def pld_ladder(state: State, delta: float, limit: float, relation: str) -> float:
    """An upper bound on the true epsilon of ``state``, from PLD, at amortised low cost; PLD's own figure when refused.

    For ledgers where PLD is the only accountant (``replace_one``). Why it is an upper bound: a run of ``s`` steps
    followed by more steps of the same mechanism reveals at least as much as the run of ``s`` steps (its output
    contains it; post-processing), so its true epsilon is at least as large, and PLD's pessimistic figure for the longer
    run is above its true epsilon. Hence PLD's figure at the smallest evaluated step count ``>= s`` bounds the true
    epsilon at ``s``.

    Every evaluation of the last mechanism is kept (:data:`_LADDERS`). A charge at ``s`` steps is admitted with the
    figure of the smallest kept count ``>= s`` if that is within ``limit``. Otherwise (a miss) PLD is evaluated at
    ``s``: over ``limit``, that figure is returned (the charge is refused); within, it is returned (exact at a miss)
    and the ladder is extended to ``ahead = max(s + 1, ceil(LADDER_RATIO * s))`` steps for the next charges. When
    ``ahead`` is over ``limit`` (the end of a calibrated run is near), a bisection between ``s`` and the first count
    known to be over ``limit`` finds the last count within it (``log2`` of the gap, once), so every later charge of the
    run is admitted without an evaluation. A run of ``T`` charges costs about ``2 (5 + ln(T / 10) /
    ln(LADDER_RATIO)) + log2(T / 10)`` evaluations in all, and between misses the figure is PLD's for a run at most
    ``LADDER_RATIO`` times longer.
    """
    *prefix, (sigma, q, steps) = state
    key = (tuple(prefix), sigma, q, delta, relation)
    if key not in _LADDERS and len(_LADDERS) >= _CACHE_LIMIT:
        _LADDERS.clear()
    points = _LADDERS.setdefault(key, [])

    def at(count: int) -> float:
        index = bisect.bisect_left(points, (count, -math.inf))
        if index < len(points) and points[index][0] == count:
            return points[index][1]
        value = composition.pld_epsilon((*prefix, (sigma, q, count)), delta, relation)
        points.insert(index, (count, value))
        return value

    index = bisect.bisect_left(points, (steps, -math.inf))
    if index < len(points) and points[index][1] <= limit:
        return points[index][1]
    bad = points[index][0] if index < len(points) else None  # the first kept count >= steps is over the limit
    exact = at(steps)
    if exact > limit:
        return exact
    ahead = max(steps + 1, math.ceil(steps * LADDER_RATIO))
    if bad is None or bad > ahead:
        if at(ahead) <= limit:
            return exact
        bad = ahead
    good = steps
    while bad - good > 1:
        middle = (good + bad) // 2
        if at(middle) <= limit:
            good = middle
        else:
            bad = middle
    return exact


def clear_caches() -> None:
    """Forget every certificate and ladder (figures do not change: each is found again the same way)."""
    _CERTIFICATES.clear()
    _LADDERS.clear()
