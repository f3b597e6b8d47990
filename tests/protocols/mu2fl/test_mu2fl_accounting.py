"""Tests for protocols/mu2fl/accounting.py: rho <-> (epsilon, delta) (Lemma 2.5) and dp-accounting's epsilon."""

from __future__ import annotations

import math

import pytest

from silofl.protocols.mu2fl.accounting import accountant_epsilon, epsilon_to_rho, noise_multiplier, rho_to_epsilon


def test_rho_epsilon_conversion() -> None:
    # The spec: rho in {4, 8, 16} is eps of about 27, 70, 205 at delta = 1e-5.
    assert [round(rho_to_epsilon(r, 1e-5), 1) for r in (4, 8, 16)] == [27.2, 70.4, 204.8]
    assert rho_to_epsilon(1.0, 1e-5) == pytest.approx(0.5 + math.sqrt(2 * math.log(1e5)))
    for rho in (1e-6, 0.3, 4.0, 16.0, 1e3):
        for delta in (1e-9, 1e-5, 0.1):
            assert epsilon_to_rho(rho_to_epsilon(rho, delta), delta) == pytest.approx(rho, rel=1e-12)
    assert epsilon_to_rho(27.19, 1e-5) == pytest.approx(
        math.sqrt(2 * math.log(1e5) + 2 * 27.19) - math.sqrt(2 * math.log(1e5))
    )
    assert rho_to_epsilon(math.inf, 1e-5) == math.inf and epsilon_to_rho(math.inf, 1e-5) == math.inf
    with pytest.raises(ValueError, match="delta must be in"):
        rho_to_epsilon(4.0, 1.0)
    with pytest.raises(ValueError, match="rho must be a positive"):
        rho_to_epsilon(-1.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon must be a positive"):
        epsilon_to_rho(0.0, 1e-5)


@pytest.mark.parametrize(("rho", "rounds"), [(4.0, 60_000), (8.0, 6_000), (16.0, 600), (0.5, 100)])
def test_dp_accounting_is_at_most_the_closed_form(rho: float, rounds: int) -> None:
    closed = rho_to_epsilon(rho, 1e-5)
    accounted = accountant_epsilon(noise_multiplier(rho, rounds), rounds, 1e-5)
    assert accounted <= closed
    assert accounted >= 0.85 * closed  # the same RDP curve; only the RDP -> DP conversion is tighter
    # T Gaussian releases with multiplier z are one release with multiplier z / sqrt(T) (RDP adds up).
    assert accounted == pytest.approx(accountant_epsilon(1.0 / rho, 1, 1e-5), rel=1e-9)
