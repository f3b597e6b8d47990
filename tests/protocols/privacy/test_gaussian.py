"""Tests for protocols.privacy.gaussian: noise scale, reproducibility, dtypes, validation, histogram radius."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch

from silofl.protocols.privacy.accountant import epsilon_spent
from silofl.protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity


def test_std_is_multiplier_times_sensitivity() -> None:
    assert GaussianMechanism(sensitivity=0.25, noise_multiplier=3.0).std == 0.75


def test_torch_release_has_the_claimed_std_and_mean() -> None:
    mechanism = GaussianMechanism(sensitivity=0.5, noise_multiplier=2.0)
    value = torch.full((200_000,), 3.0, dtype=torch.float64)
    noisy = mechanism.release(value, torch.Generator().manual_seed(0))
    noise = noisy - value
    assert noise.std().item() == pytest.approx(1.0, rel=0.02)
    assert abs(noise.mean().item()) < 0.01
    assert torch.equal(value, torch.full((200_000,), 3.0, dtype=torch.float64))  # input untouched


def test_torch_release_is_reproducible_with_a_generator() -> None:
    mechanism = GaussianMechanism(sensitivity=1.0, noise_multiplier=1.0)
    value = torch.zeros(3, 4)
    first = mechanism.release(value, torch.Generator().manual_seed(7))
    again = mechanism.release(value, torch.Generator().manual_seed(7))
    other = mechanism.release(value, torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert first.shape == value.shape and first.dtype == torch.float32


def test_torch_release_without_noise_returns_a_copy() -> None:
    value = torch.arange(5, dtype=torch.float32)
    released = GaussianMechanism(sensitivity=1.0, noise_multiplier=0.0).release(value, None)
    assert torch.equal(released, value)
    released[0] = 100.0
    assert value[0] == 0.0


def test_torch_release_rejects_integer_tensors() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        GaussianMechanism(1.0, 1.0).release(torch.arange(3), None)
    with pytest.raises(TypeError, match="release_numpy"):
        GaussianMechanism(1.0, 1.0).release(np.zeros(3), None)  # type: ignore[arg-type]


def test_numpy_release_std_and_reproducibility() -> None:
    mechanism = GaussianMechanism(sensitivity=2.0, noise_multiplier=1.5)
    value = np.ones((400, 500), dtype=np.float32)
    noisy = mechanism.release_numpy(value, np.random.default_rng(1))
    assert noisy.dtype == np.float64
    assert (noisy - value).std() == pytest.approx(3.0, rel=0.02)
    assert np.array_equal(noisy, mechanism.release_numpy(value, np.random.default_rng(1)))
    with pytest.raises(TypeError, match="Generator"):
        mechanism.release_numpy(value, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sensitivity", "multiplier", "name"),
    [
        (-1.0, 1.0, "sensitivity"),
        (math.nan, 1.0, "sensitivity"),
        (1.0, math.inf, "noise_multiplier"),
        (1.0, -2, "noise"),
    ],
)
def test_invalid_parameters_are_named(sensitivity: float, multiplier: float, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        GaussianMechanism(sensitivity=sensitivity, noise_multiplier=multiplier)


def test_histogram_sensitivity_per_relation() -> None:
    assert histogram_sensitivity("add_remove") == 1.0
    assert histogram_sensitivity("replace_one") == pytest.approx(math.sqrt(2) / 2)
    with pytest.raises(ValueError, match="relation"):
        histogram_sensitivity("swap")


def test_replace_one_histogram_is_accounted_as_its_true_l2_distance() -> None:
    """Moving one record between two groups moves the counts sqrt(2) apart: a Gaussian of std s is then exactly a
    Gaussian mechanism of multiplier s / sqrt(2); the replace_one accounting of the radius must give that epsilon."""
    multiplier, delta = 10.0, 1e-8
    mechanism = GaussianMechanism(sensitivity=histogram_sensitivity("replace_one"), noise_multiplier=multiplier)
    exact = dp_accounting.get_epsilon_gaussian(mechanism.std / math.sqrt(2), delta)
    accounted = epsilon_spent(multiplier, 1.0, 1, delta, accountant="pld", relation="replace_one")
    assert exact <= accounted <= exact * (1 + 1e-3)
    counts = np.array([120.0, 80.0, 40.0])
    moved = counts + np.array([-1.0, 1.0, 0.0])
    assert np.linalg.norm(counts - moved) == pytest.approx(2 * histogram_sensitivity("replace_one"))
