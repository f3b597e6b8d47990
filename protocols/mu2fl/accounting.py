"""DP-mu2-FL's privacy units and accounting: the paper's rho <-> (epsilon, delta), the noise multiplier, and the
accountant's epsilon as a cross-check (Reshef, Levy 2024, Section 2, Lemma 2.5; Theorems 5.1 / 6.1).

Units: the paper's rho is NOT the zCDP parameter. (alpha, alpha rho^2/2)-RDP for all alpha is (rho^2/2)-zCDP, and
Lemma 2.5 turns it into (rho^2/2 + rho sqrt(2 ln(1/delta)), delta)-DP (`rho_to_epsilon`). Everywhere in
`protocols.mu2fl` `rho` is the paper's rho.
"""

from __future__ import annotations

import math

from silofl.protocols.mu2fl import checks

__all__ = ["accountant_epsilon", "epsilon_to_rho", "noise_multiplier", "resolve_rho", "rho_to_epsilon"]


def rho_to_epsilon(rho: float, delta: float) -> float:
    """epsilon of (alpha, alpha rho^2/2)-RDP at delta: rho^2/2 + rho sqrt(2 ln(1/delta)) (Lemma 2.5; rho^2/2-zCDP).

    rho = math.inf (no noise) gives math.inf.
    """
    rho = checks.positive("rho", rho, allow_inf=True)
    delta = checks.delta(delta)
    return rho * rho / 2.0 + rho * math.sqrt(2.0 * math.log(1.0 / delta))


def epsilon_to_rho(epsilon: float, delta: float) -> float:
    """The paper's rho whose `rho_to_epsilon` is epsilon: sqrt(2 ln(1/delta) + 2 eps) - sqrt(2 ln(1/delta)).

    (The positive root of rho^2/2 + c rho - eps = 0, c = sqrt(2 ln(1/delta)).)
    """
    epsilon = checks.positive("epsilon", epsilon, allow_inf=True)
    delta = checks.delta(delta)
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
    return math.sqrt(checks.positive_int("num_rounds", num_rounds)) / checks.positive("rho", rho, allow_inf=True)


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

    multiplier = checks.positive("noise_multiplier", noise_multiplier)
    steps = checks.positive_int("steps", steps)
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(multiplier), steps)
    return float(accountant.get_epsilon(checks.delta(delta)))
