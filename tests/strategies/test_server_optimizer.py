"""Tests for strategies.server_optimizer: FedAvg's mean and FedAdam's step on the mean update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from silofl.strategies.server_optimizer import ServerOptimizer


def _arrays(*values: float) -> dict[str, np.ndarray]:
    return {"w": np.array(values, dtype=np.float32), "b": np.array([[values[0]]], dtype=np.float32)}


def test_avg_returns_the_mean_as_float32() -> None:
    mean = {"w": np.array([1.0, 2.0], dtype=np.float64)}
    out = ServerOptimizer("avg").step({"w": np.zeros(2, dtype=np.float32)}, mean, lr=0.5)
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], [1.0, 2.0])


def test_adams_first_step_moves_every_coordinate_by_lr_towards_the_mean() -> None:
    """Bias-corrected Adam's first step is lr * g / (|g| + eps): lr along the sign of the displacement, whatever its
    size (the point of FedAdam: per-parameter step sizes)."""
    current = _arrays(1.0, -2.0, 0.5)
    mean = {"w": np.array([1.3, -2.0001, 10.0]), "b": np.array([[0.0]])}
    out = ServerOptimizer("adam").step(current, mean, lr=0.01)
    np.testing.assert_allclose(out["w"], [1.01, -2.01, 0.51], atol=1e-5)
    np.testing.assert_allclose(out["b"], [[0.99]], atol=1e-5)
    assert set(out) == {"w", "b"} and out["w"].dtype == np.float32


def test_adam_keeps_its_moments_across_rounds_and_follows_the_lr() -> None:
    """Same as torch's Adam fed the same pseudo-gradients (current - mean), with the lr changed between steps."""
    opt = ServerOptimizer("adam")
    ref = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
    adam = torch.optim.Adam([ref], lr=0.1)
    current = {"w": np.array([0.0, 1.0], dtype=np.float32)}
    rng = np.random.default_rng(0)
    for lr in (0.1, 0.05, 0.02):
        mean = {"w": current["w"] + rng.normal(size=2)}
        ref.grad = torch.from_numpy((current["w"] - mean["w"]).astype(np.float32))
        adam.param_groups[0]["lr"] = lr
        adam.step()
        current = opt.step(current, mean, lr=lr)
        np.testing.assert_allclose(current["w"], ref.detach().numpy(), rtol=1e-6)


def test_adam_refuses_updates_that_do_not_match_the_model_and_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="names"):
        ServerOptimizer("adam").step({"w": np.zeros(2)}, {"v": np.zeros(2)}, lr=0.1)
    with pytest.raises(ValueError, match="server optimizer"):
        ServerOptimizer("sgd")  # type: ignore[arg-type]


def test_adam_restored_from_its_state_arrays_takes_the_same_steps_bit_for_bit() -> None:
    """A checkpoint's Adam state (moments and step count) put into a fresh optimizer continues exactly as the
    uninterrupted one: what a resumed FedSC + FedAdam run relies on."""
    spec = [("w", (3,)), ("b", (1, 1))]
    rng = np.random.default_rng(1)
    means = [{name: rng.normal(size=shape) for name, shape in spec} for _ in range(5)]
    whole, first = ServerOptimizer("adam"), ServerOptimizer("adam")
    assert whole.state_arrays() == {}  # nothing before the first step
    current = a = _arrays(0.5, -1.0, 2.0)
    for k, mean in enumerate(means):
        current = whole.step(current, mean, lr=0.01 * (k + 1))
        if k < 2:
            a = first.step(a, mean, lr=0.01 * (k + 1))
    state = first.state_arrays()
    assert set(state) == {f"{key}.{name}" for key in ("step", "exp_avg", "exp_avg_sq") for name, _ in spec}
    assert float(state["step.w"]) == 2.0 and state["exp_avg.w"].dtype == np.float32
    resumed = ServerOptimizer("adam")
    resumed.restore(state, spec)
    for k, mean in enumerate(means[2:], start=2):
        a = resumed.step(a, mean, lr=0.01 * (k + 1))
    for name in current:
        np.testing.assert_array_equal(a[name], current[name])


def test_adam_restore_refuses_state_of_another_model_or_optimizer() -> None:
    spec = [("w", (3,)), ("b", (1, 1))]
    opt = ServerOptimizer("adam")
    opt.step(_arrays(0.0, 1.0, 2.0), {"w": np.ones(3), "b": np.ones((1, 1))}, lr=0.1)
    state = opt.state_arrays()
    with pytest.raises(ValueError, match=r"Adam state 'exp_avg.w' is float32\(3,\), expected float32\(4,\)"):
        ServerOptimizer("adam").restore(state, [("w", (4,)), ("b", (1, 1))])
    with pytest.raises(ValueError, match=r"holds .*'exp_avg.v'"):
        ServerOptimizer("adam").restore(state, [("v", (3,)), ("b", (1, 1))])
    with pytest.raises(ValueError, match="'avg' keeps no state"):
        ServerOptimizer("avg").restore(state, spec)
    fresh = ServerOptimizer("adam")
    fresh.restore({}, spec)  # a checkpoint from before Adam's first step
    assert fresh.state_arrays() == {}
