"""Epsilon of a run: :func:`epsilon_spent` (and :func:`epsilons_by_accountant`, each library accountant's figure),
computed by dp-accounting's RDP and PLD accountants on the run's event (:mod:`protocols.privacy.events`), prior
releases and a companion release composed with it as one ``ComposedDpEvent``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from silofl.protocols.privacy.checks import (
    check_accountant,
    check_accountant_supports,
    check_delta,
    check_noise_multiplier,
    check_relation,
    check_releases,
    check_sampling_rate,
    check_steps,
)
from silofl.protocols.privacy.events import (
    PriorRelease,
    as_priors,
    dp_event,
    library_accountants,
    library_relation,
    pld_value_discretization,
)


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


def epsilons_by_accountant(
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
    return min(
        epsilons_by_accountant(sigma, q, count, d, k, library_accountants(name, rel), rel, priors, second).values()
    )
