"""Argument checks of the privacy accounting (:mod:`protocols.privacy.accountant`): each returns the value in the
type the accounting uses, or raises ``ValueError`` naming the argument and saying what is accepted.

The accepted accountant names (:data:`ACCOUNTANTS`) and neighbouring relations (:data:`RELATIONS`) live here too, with
the one pair of them that cannot go together (:func:`check_accountant_supports`: RDP under ``replace_one``).
"""

from __future__ import annotations

import math
import numbers

ACCOUNTANTS = ("rdp", "pld", "best")
"""Accountant names accepted everywhere in this package. ``best`` = the smaller (tighter) of RDP and PLD (under
``replace_one``, where RDP has no analysis: PLD)."""

RELATIONS = ("add_remove", "replace_one")
"""Neighbouring relations accepted everywhere in this package (see :mod:`protocols.privacy.accountant`)."""


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
