"""Noise calibration: :func:`calibrate_noise`, the smallest per-release noise multiplier whose epsilon
(:mod:`protocols.privacy.epsilon`) meets a target, and its result :class:`Calibration`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from silofl.protocols.privacy.checks import (
    check_accountant,
    check_accountant_supports,
    check_delta,
    check_epsilon,
    check_relation,
    check_releases,
    check_sampling_rate,
    check_steps,
)
from silofl.protocols.privacy.epsilon import epsilon_spent, epsilons_by_accountant
from silofl.protocols.privacy.events import PriorRelease, as_priors, library_accountants

_RELATIVE_TOLERANCE_FLOOR = 1e-9


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
    floors = epsilons_by_accountant(math.inf, q, count, d, k, kinds, rel, priors)  # the prior releases alone
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

    eps = epsilons_by_accountant(sigma, q, count, d, k, kinds, rel, priors, ratio * sigma)
    eps_rdp = eps.get("rdp", math.inf)
    tighter = "rdp" if eps_rdp <= eps["pld"] else "pld"
    return result(sigma, eps, tighter if name == "best" else name)
