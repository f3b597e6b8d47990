"""Tests for protocols/mu2fl/calibration.py: noise and step size (Theorems 5.2 and 6.2) and their calibration."""

from __future__ import annotations

import math

import pytest

from silofl.protocols.mu2fl.accounting import rho_to_epsilon
from silofl.protocols.mu2fl.calibration import calibrate, eta, sensitivity, sigma_trusted, sigma_untrusted
from silofl.protocols.mu2fl.constants import Mu2Constants

MNIST = Mu2Constants.for_logreg(784, 10, D=0.1)


def test_noise_and_step_size_follow_theorems_5_2_and_6_2() -> None:
    S, d = MNIST.S, MNIST.dim
    assert sigma_untrusted(S, 60_000, 4.0) == pytest.approx(2 * S * math.sqrt(60_000) / 4)
    assert sigma_trusted(S, 600, 4.0, 100) == pytest.approx(2 * S * math.sqrt(600) / (4 * 100))
    assert sigma_untrusted(S, 600, 4.0, batch_size=8) == pytest.approx(sigma_untrusted(S, 600, 4.0) / 8)
    assert sigma_untrusted(S, 600, math.inf) == 0.0
    # M = 1, T = 60000, rho = 4: the privacy term is the smaller one.
    e = eta(MNIST, num_rounds=60_000, num_silos=1, rho=4.0, trusted=False)
    assert e == pytest.approx(4.0 * 0.1 / (2 * S * 60_000 * math.sqrt(d)), rel=1e-12)
    assert e < 1 / (4 * MNIST.L * 60_000)
    # M = 1: trusted and untrusted coincide (the paper's remark under Table 2).
    assert eta(MNIST, num_rounds=60_000, num_silos=1, rho=4.0, trusted=True) == pytest.approx(e, rel=1e-12)
    # M = 10, T = 6000, rho = 8, untrusted: rho D sqrt(M) / (2 S T sqrt(d)).
    assert eta(MNIST, num_rounds=6_000, num_silos=10, rho=8.0, trusted=False) == pytest.approx(
        8.0 * 0.1 * math.sqrt(10) / (2 * S * 6_000 * math.sqrt(d)), rel=1e-12
    )
    # M = 100, T = 600, rho = 16: the smoothness cap 1/(4 L T) binds (untrusted and trusted).
    for trusted in (False, True):
        assert eta(MNIST, num_rounds=600, num_silos=100, rho=16.0, trusted=trusted) == 1 / (4 * 392.5 * 600)
    # M = 100, T = 600, rho = 4 untrusted: still the privacy term, which the trusted rule multiplies by sqrt(M).
    untrusted = eta(MNIST, num_rounds=600, num_silos=100, rho=4.0, trusted=False)
    assert untrusted == pytest.approx(4.0 * 0.1 * 10 / (2 * S * 600 * math.sqrt(d)), rel=1e-12)
    assert eta(MNIST, num_rounds=60, num_silos=1, rho=math.inf, trusted=False) == 1 / (4 * 392.5 * 60)
    # Minibatch: the noise on qbar shrinks by b, so the privacy term grows by b.
    small = Mu2Constants(G=1.0, L=1e-9, D=1.0, dim=100)
    assert eta(small, num_rounds=50, num_silos=4, rho=2.0, trusted=False, batch_size=5) == pytest.approx(
        5 * eta(small, num_rounds=50, num_silos=4, rho=2.0, trusted=False), rel=1e-12
    )


@pytest.mark.parametrize("trusted", [False, True])
def test_calibration_is_consistent(trusted: bool) -> None:
    cal = calibrate(MNIST, num_rounds=600, num_silos=100, rho=8.0, trusted=trusted, batch_size=4, delta=1e-6)
    assert cal.sensitivity == pytest.approx(2 * MNIST.S / (4 * (100 if trusted else 1)))
    assert cal.sensitivity == sensitivity(MNIST, batch_size=4, num_silos=100, trusted=trusted)
    assert cal.sigma / cal.sensitivity == pytest.approx(cal.noise_multiplier, rel=1e-12)
    assert cal.noise_multiplier == pytest.approx(math.sqrt(600) / 8.0)
    assert cal.epsilon == rho_to_epsilon(8.0, 1e-6) and cal.delta == 1e-6
    assert cal.eta == eta(MNIST, num_rounds=600, num_silos=100, rho=8.0, trusted=trusted, batch_size=4)
