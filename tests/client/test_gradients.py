"""Tests for client.gradients: per-sample gradients, clipping, flat vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.client.gradients import (
    clip_rows,
    clipped_gradient_sum,
    flatten_per_sample,
    mean_gradient,
    mean_gradient_and_logits,
    per_sample_gradients,
    unflatten,
)
from silofl.protocols.models import build_model, get_parameters, loss_fn, parameter_spec, set_parameters

CASES = [("logreg", 2), ("logreg", 3), ("mlp", 2), ("mlp", 4)]


def _batch(n: int, d: int, num_labels: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.randint(0, num_labels, (n,), generator=g)
    return x, y


def _single_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reference: one autograd call per record (loop allowed in tests only), flattened to (n, P)."""
    rows = []
    params = list(model.parameters())
    for i in range(x.shape[0]):
        loss = loss_fn(model(x[i : i + 1]), y[i : i + 1])
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(rows)


@pytest.mark.parametrize(("kind", "num_labels"), CASES)
def test_per_sample_gradients_match_autograd_loop(kind: str, num_labels: int) -> None:
    model = build_model(kind, 6, num_labels, hidden=5, seed=1)
    x, y = _batch(9, 6, num_labels)
    grads = per_sample_gradients(model, x, y)
    assert list(grads) == [name for name, _ in parameter_spec(model)]
    for (_, shape), g in zip(parameter_spec(model), grads.values(), strict=True):
        assert g.shape == (9, *shape)
    torch.testing.assert_close(flatten_per_sample(grads), _single_grads(model, x, y), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("kind", "num_labels"), CASES)
def test_per_sample_gradients_match_finite_differences(kind: str, num_labels: int) -> None:
    model = build_model(kind, 4, num_labels, hidden=3, seed=2).double()
    x, y = _batch(3, 4, num_labels, seed=5, dtype=torch.float64)
    flat = flatten_per_sample(per_sample_gradients(model, x, y))
    base = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spec = parameter_spec(model)
    h = 1e-6

    def loss_at(vector: torch.Tensor, i: int) -> float:
        with torch.no_grad():
            for (name, _), value in zip(spec, unflatten(vector, spec).values(), strict=True):
                model.get_parameter(name).copy_(value)
            return float(loss_fn(model(x[i : i + 1]), y[i : i + 1]))

    for i in range(x.shape[0]):
        numeric = torch.empty_like(base)
        for j in range(base.shape[0]):
            step = torch.zeros_like(base)
            step[j] = h
            numeric[j] = (loss_at(base + step, i) - loss_at(base - step, i)) / (2 * h)
        torch.testing.assert_close(flat[i], numeric, rtol=1e-5, atol=1e-7)


def test_clip_rows_bounds_norms_and_keeps_small_rows() -> None:
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [6.0, 8.0], [0.6, 0.8]])
    out = clip_rows(g, 1.0)
    norms = torch.linalg.vector_norm(out, dim=1)
    assert torch.all(norms <= 1.0 + 1e-6)
    torch.testing.assert_close(out[0], torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(out[3], torch.tensor([0.6, 0.8]))
    assert torch.equal(out[1], g[1])  # below C: bit-for-bit unchanged
    assert torch.equal(out[2], g[2])  # zero row: no NaN
    assert torch.equal(out[4], g[4])  # exactly at C: not shrunk
    assert torch.equal(g[0], torch.tensor([3.0, 4.0]))  # input not modified


def test_clip_rows_random_directions_preserved() -> None:
    g = torch.randn(50, 7) * torch.logspace(-2, 2, 50).unsqueeze(1)
    out = clip_rows(g, 0.5)
    assert torch.all(torch.linalg.vector_norm(out, dim=1) <= 0.5 + 1e-6)
    cos = torch.nn.functional.cosine_similarity(out, g, dim=1)
    torch.testing.assert_close(cos, torch.ones(50))


@pytest.mark.parametrize(("kind", "num_labels"), CASES)
@pytest.mark.parametrize("clip_norm", [0.05, 1.0, 100.0])
def test_clipped_gradient_sum_equals_manual(kind: str, num_labels: int, clip_norm: float) -> None:
    model = build_model(kind, 6, num_labels, hidden=5, seed=3)
    x, y = _batch(17, 6, num_labels, seed=1)
    rows = _single_grads(model, x, y)
    manual = torch.zeros(rows.shape[1])
    for row in rows:
        manual += row * min(1.0, clip_norm / float(row.norm()))
    result = clipped_gradient_sum(model, x, y, clip_norm)
    assert result.shape == (sum(math.prod(s) for _, s in parameter_spec(model)),)
    torch.testing.assert_close(result, manual, rtol=1e-5, atol=1e-6)
    assert float(result.norm()) <= 17 * clip_norm * (1 + 1e-6)


def test_clipped_gradient_sum_small_clip_is_sum_of_unit_directions() -> None:
    model = build_model("logreg", 3, 2, seed=0)
    x, y = _batch(5, 3, 2)
    rows = _single_grads(model, x, y)
    expected = (rows / rows.norm(dim=1, keepdim=True)).sum(0) * 1e-4
    torch.testing.assert_close(clipped_gradient_sum(model, x, y, 1e-4), expected, rtol=1e-5, atol=1e-9)


def test_clipped_gradient_sum_empty_batch_is_zero() -> None:
    model = build_model("mlp", 4, 3, hidden=2)
    out = clipped_gradient_sum(model, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0)
    assert out.shape == (4 * 2 + 2 + 2 * 3 + 3,)
    assert out.dtype == torch.float32
    assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize(("kind", "num_labels"), CASES)
def test_mean_gradient_is_mean_of_per_sample(kind: str, num_labels: int) -> None:
    model = build_model(kind, 6, num_labels, hidden=5, seed=4)
    x, y = _batch(12, 6, num_labels, seed=2)
    expected = flatten_per_sample(per_sample_gradients(model, x, y)).mean(0)
    torch.testing.assert_close(mean_gradient(model, x, y), expected, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in model.parameters())


def test_mean_gradient_rejects_empty_batch() -> None:
    model = build_model("logreg", 3, 2)
    with pytest.raises(ValueError, match="empty batch"):
        mean_gradient(model, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


def test_gradient_step_decreases_loss() -> None:
    model = build_model("logreg", 5, 2, seed=0)
    x, y = _batch(64, 5, 2, seed=9)
    y = (x[:, 0] > 0).long()
    before = loss_fn(model(x), y).item()
    step = unflatten(-0.5 * mean_gradient(model, x, y), parameter_spec(model))
    set_parameters(model, {k: v + step[k].numpy() for k, v in get_parameters(model).items()})
    assert loss_fn(model(x), y).item() < before


def test_unflatten_inverts_flatten_order() -> None:
    model = build_model("mlp", 3, 3, hidden=2, seed=0)
    spec = parameter_spec(model)
    flat = torch.cat([torch.from_numpy(v).reshape(-1) for v in get_parameters(model).values()])
    parts = unflatten(flat, spec)
    assert [(k, tuple(v.shape)) for k, v in parts.items()] == spec
    for name, value in get_parameters(model).items():
        np.testing.assert_array_equal(parts[name].numpy(), value)


def test_unflatten_rejects_wrong_length() -> None:
    spec = [("a", (2, 2)), ("b", (3,))]
    with pytest.raises(ValueError, match="vector has 6 entries but spec describes 7"):
        unflatten(torch.zeros(6), spec)
    with pytest.raises(ValueError, match="vector must be 1-D"):
        unflatten(torch.zeros(7, 1), spec)


@pytest.mark.parametrize("clip_norm", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_clip_norm_is_rejected(clip_norm: float) -> None:
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        clip_rows(torch.ones(2, 2), clip_norm)
    model = build_model("logreg", 2, 2)
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        clipped_gradient_sum(model, torch.ones(1, 2), torch.zeros(1, dtype=torch.long), clip_norm)


def test_bad_batches_are_rejected() -> None:
    model = build_model("logreg", 2, 2)
    with pytest.raises(ValueError, match="x must be 2-D"):
        per_sample_gradients(model, torch.ones(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="y must be 1-D with one label per row of x"):
        per_sample_gradients(model, torch.ones(3, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="y must hold integer class labels"):
        mean_gradient(model, torch.ones(2, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="x must be a floating tensor"):
        clipped_gradient_sum(model, torch.ones(2, 2, dtype=torch.long), torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="share the leading"):
        flatten_per_sample({"a": torch.zeros(2, 3), "b": torch.zeros(3)})


def test_models_with_buffers_are_rejected() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with pytest.raises(ValueError, match="no buffers"):
        clipped_gradient_sum(model, torch.ones(3, 2), torch.zeros(3, dtype=torch.long), 1.0)


@pytest.mark.parametrize(("kind", "labels"), [("logreg", 2), ("logreg", 3), ("mlp", 2), ("mlp", 4)])
def test_linear_stack_fast_path_equals_torch_func_route(kind: str, labels: int) -> None:
    """The vmap-free route for tabular models gives the torch.func per-sample result, with and without clipping."""
    from silofl.client.gradients import _linear_stack_clipped_sum

    torch.manual_seed(3)
    model = build_model(kind, 7, labels, hidden=5, seed=1)
    x = torch.randn(40, 7) * 3
    y = torch.randint(0, labels, (40,))
    reference_rows = flatten_per_sample(per_sample_gradients(model, x, y))
    for clip in (1e-3, 0.5, 1e6):  # all rows clipped, some, none
        reference = clip_rows(reference_rows, clip).sum(0)
        fast = _linear_stack_clipped_sum(model, x, y, clip)
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(clipped_gradient_sum(model, x, y, clip), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_labels", [2, 3, 5])
def test_logreg_mean_gradient_without_backward_pass_gives_autograds_bits(num_labels: int) -> None:
    """Logistic regression's closed-form mean loss gradient (`head_gradient` of cross-entropy's logit gradients, by
    the kernels autograd runs) equals autograd's backward pass bit for bit, batch of a SteFFLe round's size."""
    for seed in range(6):
        model = build_model("logreg", 102, num_labels, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        n = 250 + seed
        x = torch.randn(n, 102, generator=gen) * (1 + seed)
        y = torch.randint(0, num_labels, (n,), generator=gen)
        logits = model(x)
        expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_fn(logits, y), list(model.parameters()))])
        g, fast_logits = mean_gradient_and_logits(model, x, y)
        assert torch.equal(g, expected)
        assert torch.equal(fast_logits, logits.detach())
        assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("num_labels", [2, 3, 5])
def test_logreg_clipped_sum_without_backward_pass_gives_autograds_bits(num_labels: int) -> None:
    """DP-FedSGD's clipped per-record gradient sum for logistic regression (closed-form logit gradients) equals the
    autograd route's (`linear_stack_clipped_sum` over the summed cross-entropy) bit for bit, at clip norms that clip
    every row, some and none."""
    import torch.nn.functional as F

    from silofl.client.gradients import _linear_stack_clipped_sum
    from silofl.protocols.models import linear_stack_clipped_sum

    for seed in range(4):
        model = build_model("logreg", 102, num_labels, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        n = 250 + seed
        x = torch.randn(n, 102, generator=gen) * (1 + seed)
        y = torch.randint(0, num_labels, (n,), generator=gen)
        for clip in (1e-3, 1.0, 1e6):
            expected = linear_stack_clipped_sum(
                model, x, lambda logits, y=y: F.cross_entropy(logits, y, reduction="sum"), clip
            )
            assert torch.equal(_linear_stack_clipped_sum(model, x, y, clip), expected)
        assert all(p.grad is None for p in model.parameters())
