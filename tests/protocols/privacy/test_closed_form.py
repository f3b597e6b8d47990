"""Tests for protocols.privacy.closed_form: the papers' Theorem 3.3 noise and what the accountant says it costs."""

from __future__ import annotations

import math

import pytest

from silofl.protocols.privacy.accountant import epsilon_spent
from silofl.protocols.privacy.closed_form import steffle_closed_form

# The papers' Credit Card setting (spec steffle.md): 30,000 rows, 3:1 train/test, 3 silos; batch 256; delta = 1/n^2.
N_SILO, BATCH, ROUNDS = 7500, 256, 1200
DELTA = 1 / N_SILO**2


def test_formulas_of_theorem_3_3() -> None:
    eps, delta, n, m, steps, rho, lipschitz, bound = 2.0, 1e-6, 5000, 100, 3000, 0.3, 1.5, 4.0
    form = steffle_closed_form(eps, delta, n, m, steps, rho, lipschitz, bound)
    log_term = math.log(1 / delta)
    assert form["sigma_w"] ** 2 == pytest.approx(16 * steps * log_term / (eps**2 * n**2 * rho))
    assert form["sigma_theta"] ** 2 == pytest.approx(
        16 * lipschitz**2 * bound**2 * log_term * steps / (eps**2 * n**2 * rho)
    )
    assert form["sensitivity_w"] ** 2 == pytest.approx(8 / (m**2 * rho))
    assert form["sensitivity_theta"] ** 2 == pytest.approx(8 * bound**2 * lipschitz**2 / (m**2 * rho))
    assert form["sampling_rate"] == m / n
    assert form["min_steps"] == pytest.approx((n * math.sqrt(eps) / (2 * m)) ** 2)
    assert form["valid"] is True


def test_noise_multiplier_is_the_abadi_form_for_both_streams() -> None:
    """sigma / Delta = q sqrt(2 T ln(1/delta)) / eps: rho, L and D cancel, the same for theta and W."""
    form = steffle_closed_form(1.0, DELTA, N_SILO, BATCH, ROUNDS, 0.3, 2.0, 3.0)
    other = steffle_closed_form(1.0, DELTA, N_SILO, BATCH, ROUNDS, 0.05, 0.5, 1.0)
    q = BATCH / N_SILO
    expected = q * math.sqrt(2 * ROUNDS * math.log(1 / DELTA))
    assert form["noise_multiplier"] == pytest.approx(expected)
    assert form["sigma_theta"] / form["sensitivity_theta"] == pytest.approx(expected)
    assert other["noise_multiplier"] == pytest.approx(expected)
    assert other["sigma_w"] != form["sigma_w"]


def test_validity_conditions() -> None:
    # T >= (n sqrt(eps) / (2 m))^2: 214.6 at eps = 1, 1931.2 at eps = 9 (Credit Card)
    assert steffle_closed_form(1.0, DELTA, N_SILO, BATCH, ROUNDS, 0.3, 1.0, 1.0)["valid"] is True
    at_nine = steffle_closed_form(9.0, DELTA, N_SILO, BATCH, ROUNDS, 0.3, 1.0, 1.0)
    assert at_nine["valid"] is False and 1931 < at_nine["min_steps"] < 1932
    assert steffle_closed_form(9.0, DELTA, N_SILO, BATCH, 1932, 0.3, 1.0, 1.0)["valid"] is True
    # eps <= 2 ln(1/delta)
    assert steffle_closed_form(5.0, 0.5, 100, 99, 10_000, 0.3, 1.0, 1.0)["valid"] is False


def test_closed_form_understates_epsilon_as_the_spec_measured() -> None:
    """Spec steffle.md "Noise": nominal 9 -> about 17 at T = 1200 on Credit Card, and nominal 1 -> about 1.3 once theta
    and W are counted together; both read the papers' noise as an add/remove multiplier of Delta (their proof's)."""
    nine = steffle_closed_form(9.0, DELTA, N_SILO, BATCH, ROUNDS, 0.3, 1.0, 1.0)
    q = nine["sampling_rate"]
    assert epsilon_spent(nine["noise_multiplier"], q, ROUNDS, DELTA, accountant="pld") == pytest.approx(17.3, abs=0.1)
    one = steffle_closed_form(1.0, DELTA, N_SILO, BATCH, ROUNDS, 0.3, 1.0, 1.0)
    both = epsilon_spent(one["noise_multiplier"], q, ROUNDS, DELTA, releases=2, accountant="rdp")
    assert both == pytest.approx(1.30, abs=0.01)
    assert epsilon_spent(one["noise_multiplier"], q, ROUNDS, DELTA, accountant="pld") < 1.0  # one stream alone: fine


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": math.inf}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"n": 0}, "n must"),
        ({"m": 2.5}, "m must"),
        ({"m": 20_000}, "m .the batch size. must be <= n"),
        ({"T": 0}, "T must"),
        ({"rho": 1.5}, "rho"),
        ({"L": -1.0}, "L must"),
        ({"D": math.nan}, "D must"),
    ],
)
def test_invalid_arguments_are_named(change: dict, name: str) -> None:
    arguments = {"epsilon": 1.0, "delta": DELTA, "n": N_SILO, "m": BATCH, "T": ROUNDS, "rho": 0.3, "L": 1.0, "D": 1.0}
    with pytest.raises(ValueError, match=name):
        steffle_closed_form(**(arguments | change))
