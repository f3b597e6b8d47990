"""Tests for protocols.privacy.accountant: agreement with dp-accounting, calibration, composition of releases."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from protocols.privacy.accountant import (
    ACCOUNTANTS,
    calibrate_noise,
    combined_noise_multiplier,
    dp_event,
    epsilon_spent,
    pld_value_discretization,
)

DELTA = 1e-6


def _by_hand(sigma: float, q: float, steps: int, releases: int = 1) -> dp_accounting.DpEvent:
    gaussian = dp_accounting.GaussianDpEvent(sigma / math.sqrt(releases))
    step = gaussian if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)
    return dp_accounting.SelfComposedDpEvent(step, steps)


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "releases"), [(1.1, 0.02, 300, 1), (2.0, 0.1, 50, 2), (8.0, 1.0, 20, 3)]
)
def test_epsilon_spent_agrees_with_dp_accounting(sigma: float, q: float, steps: int, releases: int) -> None:
    event = _by_hand(sigma, q, steps, releases)
    rdp = RdpAccountant().compose(event).get_epsilon(DELTA)
    grid = pld_value_discretization(sigma / math.sqrt(releases), q)
    pld = PLDAccountant(value_discretization_interval=grid).compose(event).get_epsilon(DELTA)
    assert epsilon_spent(sigma, q, steps, DELTA, releases, "rdp") == rdp
    assert epsilon_spent(sigma, q, steps, DELTA, releases, "pld") == pld
    assert epsilon_spent(sigma, q, steps, DELTA, releases, "best") == min(rdp, pld)
    assert 0.0 < min(rdp, pld) < math.inf
    assert dp_event(sigma, q, steps, releases) == event


def test_full_batch_gaussian_matches_the_exact_analytic_epsilon() -> None:
    """q = 1: T Gaussian steps are one Gaussian with multiplier sigma / sqrt(T) (Balle & Wang 2018 give its epsilon)."""
    sigma, steps = 6.0, 16
    exact = dp_accounting.get_epsilon_gaussian(sigma / math.sqrt(steps), DELTA)
    pld = epsilon_spent(sigma, 1.0, steps, DELTA, accountant="pld")
    rdp = epsilon_spent(sigma, 1.0, steps, DELTA, accountant="rdp")
    assert exact <= pld <= exact * (1 + 1e-3)  # pessimistic, and tight
    assert rdp > exact


def test_epsilon_spent_corner_cases() -> None:
    assert epsilon_spent(1.0, 0.1, 0, DELTA) == 0.0
    assert epsilon_spent(0.0, 0.1, 10, DELTA) == math.inf
    assert epsilon_spent(math.inf, 0.1, 10, DELTA) == 0.0


def test_pld_discretization_is_pessimistic_and_close() -> None:
    """The grid rule never reports less than a 10x finer grid, and stays within 0.1 % of it."""
    for sigma, q, steps in [(2.05, 256 / 12000, 2000), (17.6, 256 / 12000, 2000), (1.0, 0.05, 40)]:
        event = _by_hand(sigma, q, steps)
        grid = pld_value_discretization(sigma, q)
        fine = PLDAccountant(value_discretization_interval=grid / 10).compose(event).get_epsilon(DELTA)
        ours = epsilon_spent(sigma, q, steps, DELTA, accountant="pld")
        assert fine <= ours <= fine * (1 + 1e-3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"sampling_rate": 0.0}, "sampling_rate"),
        ({"sampling_rate": 1.5}, "sampling_rate"),
        ({"steps": -1}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"releases": 0}, "releases"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"accountant": "moments"}, "accountant"),
    ],
)
def test_epsilon_spent_validation_names_the_argument(kwargs: dict, name: str) -> None:
    arguments = {"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 10, "delta": DELTA} | kwargs
    with pytest.raises(ValueError, match=name):
        epsilon_spent(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"), ({"steps": 0}, "steps"), ({"tolerance": 0}, "tol")],
)
def test_calibrate_noise_validation_names_the_argument(kwargs: dict, name: str) -> None:
    arguments = {"epsilon": 1.0, "delta": DELTA, "sampling_rate": 0.1, "steps": 10} | kwargs
    with pytest.raises(ValueError, match=name):
        calibrate_noise(**arguments)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_calibrate_noise_is_tight(accountant: str) -> None:
    target, q, steps = 2.0, 0.05, 60
    result = calibrate_noise(target, DELTA, q, steps, accountant=accountant)
    sigma = result.noise_multiplier
    assert result.epsilon <= target
    assert epsilon_spent(sigma, q, steps, DELTA, accountant=accountant) == result.epsilon
    assert epsilon_spent(0.98 * sigma, q, steps, DELTA, accountant=accountant) > target
    assert result.epsilon_rdp == epsilon_spent(sigma, q, steps, DELTA, accountant="rdp")
    assert result.epsilon_pld == epsilon_spent(sigma, q, steps, DELTA, accountant="pld")
    assert (result.target_epsilon, result.delta, result.sampling_rate, result.steps, result.releases) == (
        target,
        DELTA,
        q,
        steps,
        1,
    )
    if accountant == "best":
        assert result.epsilon == min(result.epsilon_rdp, result.epsilon_pld)
        assert result.accountant in ("rdp", "pld")
    else:
        assert result.accountant == accountant


def test_best_calibration_is_the_smaller_multiplier() -> None:
    args = (3.0, DELTA, 0.02, 500)
    rdp, pld, best = (calibrate_noise(*args, accountant=name).noise_multiplier for name in ("rdp", "pld", "best"))
    assert pld < rdp  # PLD is the tighter accountant in this regime
    assert best == pytest.approx(min(rdp, pld), rel=1e-3)
    assert best <= rdp


def test_calibration_is_monotone_in_sampling_rate_and_steps() -> None:
    def sigma(q: float, steps: int) -> float:
        return calibrate_noise(1.0, DELTA, q, steps, accountant="rdp").noise_multiplier

    assert sigma(0.01, 100) < sigma(0.05, 100) < sigma(0.2, 100)
    assert sigma(0.05, 20) < sigma(0.05, 100) < sigma(0.05, 500)


def test_calibrate_infinite_epsilon_needs_no_noise() -> None:
    result = calibrate_noise(math.inf, DELTA, 0.1, 10)
    assert result.noise_multiplier == 0.0
    assert result.epsilon == math.inf


def test_several_releases_of_one_sample_cost_more_than_one() -> None:
    sigma, q, steps = 1.5, 0.05, 100
    one = epsilon_spent(sigma, q, steps, DELTA, releases=1)
    three = epsilon_spent(sigma, q, steps, DELTA, releases=3)
    assert three > one * 1.2
    # K releases at sigma * sqrt(K) are one release at sigma.
    for name in ("rdp", "pld"):
        scaled = epsilon_spent(sigma * math.sqrt(3), q, steps, DELTA, releases=3, accountant=name)
        assert scaled == pytest.approx(epsilon_spent(sigma, q, steps, DELTA, accountant=name), rel=1e-9)
    k1 = calibrate_noise(2.0, DELTA, q, steps, releases=1, accountant="rdp")
    k4 = calibrate_noise(2.0, DELTA, q, steps, releases=4, accountant="rdp")
    assert k4.noise_multiplier == pytest.approx(2 * k1.noise_multiplier, rel=2e-3)
    assert k4.combined_noise_multiplier == pytest.approx(k1.noise_multiplier, rel=2e-3)


def test_combined_noise_multiplier_formula() -> None:
    assert combined_noise_multiplier([1.0, 2.0, 2.0]) == pytest.approx(1.5**-0.5)
    assert combined_noise_multiplier([3.0] * 4) == pytest.approx(1.5)
    assert combined_noise_multiplier([2.0, math.inf]) == 2.0
    assert combined_noise_multiplier([math.inf, math.inf]) == math.inf
    assert combined_noise_multiplier([0.0, 5.0]) == 0.0
    with pytest.raises(ValueError, match="multipliers"):
        combined_noise_multiplier([])
    with pytest.raises(ValueError, match=r"multipliers\[1\]"):
        combined_noise_multiplier([1.0, -2.0])


def test_combined_noise_multiplier_matches_composing_the_releases() -> None:
    """Composing Gaussian(1.2) and Gaussian(0.7) on the same data is one Gaussian at the combined multiplier."""
    parts = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(1.2), dp_accounting.GaussianDpEvent(0.7)])
    combined = dp_accounting.GaussianDpEvent(combined_noise_multiplier([1.2, 0.7]))
    assert RdpAccountant().compose(parts).get_epsilon(DELTA) == pytest.approx(
        RdpAccountant().compose(combined).get_epsilon(DELTA), rel=1e-9
    )
    exact = dp_accounting.get_epsilon_gaussian(combined_noise_multiplier([1.2, 0.7]), DELTA)
    pld = PLDAccountant(value_discretization_interval=1e-4).compose(parts).get_epsilon(DELTA)
    assert pld == pytest.approx(exact, rel=1e-3)
