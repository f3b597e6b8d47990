"""Tests for protocols/steffle/theta.py: the per-sample theta-gradients against autograd and finite differences, and
their clipped sum (the Linear-stack fast path and the closed-form logistic route against the torch.func route)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from silofl.protocols.fairness_prior import FAIRNESS_NOTIONS, GroupPrior
from silofl.protocols.models import build_model, parameter_spec
from silofl.protocols.steffle.gradients import psi_output_cotangents
from silofl.protocols.steffle.objective import psi
from silofl.protocols.steffle.theta import clipped_psi_theta_sum, psi_theta_gradients
from tests.generic_module import NotTabular
from tests.steffle_cases import batch, batch_prior, random_w

MODELS = [("logreg", 2, 2), ("logreg", 3, 3), ("mlp", 3, 2), ("mlp", 2, 4)]  # (kind, k, l)


def _autograd_theta_rows(model, x, groups, W, prior, labels) -> torch.Tensor:
    """Reference: autograd of the scalar psi_i through the model, one record at a time, flattened (n, P)."""
    params = list(model.parameters())
    rows = []
    for i in range(x.shape[0]):
        F_i = torch.softmax(model(x[i : i + 1]), dim=1)
        lab = None if labels is None else labels[i : i + 1]
        value = psi(F_i, groups[i : i + 1], W, prior, lab)[0]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params, allow_unused=True)]))
    return torch.stack(rows)


def _model_batch(kind: str, k: int, l_: int, n: int, seed: int, dtype=torch.float32):
    model = build_model(kind, 5, l_, hidden=4, seed=seed)
    if dtype == torch.float64:
        model = model.double()
    gen = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(n, 5, generator=gen, dtype=dtype)
    _, groups, labels = batch(n, k, l_, seed=seed)
    return model, x, groups, labels


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_psi_theta_gradients_match_autograd_per_sample(notion: str, kind: str, k: int, l_: int) -> None:
    model, x, groups, labels = _model_batch(kind, k, l_, 11, seed=21)
    prior = batch_prior(notion, groups, labels, k, l_)
    W = random_w(prior, seed=22, dtype=torch.float32)
    grads = psi_theta_gradients(model, x, groups, W, prior, labels)
    assert list(grads) == [name for name, _ in parameter_spec(model)]
    for (_, shape), g in zip(parameter_spec(model), grads.values(), strict=True):
        assert g.shape == (11, *shape) and g.dtype == torch.float32
    flat = torch.cat([g.reshape(11, -1) for g in grads.values()], dim=1)
    torch.testing.assert_close(flat, _autograd_theta_rows(model, x, groups, W, prior, labels), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_psi_theta_gradients_match_finite_differences(kind: str, k: int, l_: int) -> None:
    n = k * l_  # one record per (group, label) cell
    model, x, groups, labels = _model_batch(kind, k, l_, n, seed=23, dtype=torch.float64)
    prior = batch_prior("eo", groups, labels, k, l_)
    W = random_w(prior, seed=24)
    flat = torch.cat([g.reshape(n, -1) for g in psi_theta_gradients(model, x, groups, W, prior, labels).values()], 1)
    h = 1e-6
    for param in model.parameters():
        base = param.detach().clone()
        for j in range(param.numel()):
            with torch.no_grad():
                param.view(-1)[j] = base.view(-1)[j] + h
                up = psi(torch.softmax(model(x), 1), groups, W, prior, labels)
                param.view(-1)[j] = base.view(-1)[j] - h
                down = psi(torch.softmax(model(x), 1), groups, W, prior, labels)
                param.copy_(base)
            column = sum(p.numel() for p in list(model.parameters())[: _index(model, param)]) + j
            torch.testing.assert_close(flat[:, column], (up - down) / (2 * h), rtol=1e-5, atol=1e-8)


def _index(model: torch.nn.Module, param: torch.nn.Parameter) -> int:
    return next(i for i, p in enumerate(model.parameters()) if p is param)


def test_binary_logreg_gradient_is_the_sigmoid_chain_rule() -> None:
    # F = (1 - sigma(z), sigma(z)), so d psi_i / d theta = (a_i1 - a_i0) sigma(z_i) (1 - sigma(z_i)) [x_i, 1].
    model, x, groups, labels = _model_batch("logreg", 2, 2, 9, seed=25, dtype=torch.float64)
    prior = batch_prior("dp", groups, labels, 2, 2)
    W = random_w(prior, seed=26)
    z = (x @ model.head.weight.detach().T + model.head.bias.detach())[:, 0]
    sig = torch.sigmoid(z)
    torch.testing.assert_close(torch.softmax(model(x), 1), torch.stack([1 - sig, sig], dim=1))
    a = psi_output_cotangents(groups, W, prior)
    coef = (a[:, 1] - a[:, 0]) * sig * (1 - sig)
    grads = psi_theta_gradients(model, x, groups, W, prior)
    torch.testing.assert_close(grads["head.weight"][:, 0, :], coef[:, None] * x)
    torch.testing.assert_close(grads["head.bias"][:, 0], coef)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize(("kind", "k", "l_"), MODELS)
def test_clipped_sum_fast_path_matches_torch_func_route(notion: str, kind: str, k: int, l_: int) -> None:
    model, x, groups, labels = _model_batch(kind, k, l_, 24, seed=31)
    prior = batch_prior(notion, groups, labels, k, l_)
    W = random_w(prior, seed=32, dtype=torch.float32)
    rows = torch.cat([g.reshape(24, -1) for g in psi_theta_gradients(model, x, groups, W, prior, labels).values()], 1)
    norms = torch.linalg.vector_norm(rows, dim=1)
    active = norms > 0
    assert int(active.sum()) >= 4
    positive = norms[active]
    cases = {  # clip -> how many active rows it clips
        "none": (float(positive.max()) * 1.01, 0),
        "some": (float(positive.median()), None),
        "all": (float(positive.min()) * 0.99, int(active.sum())),
    }
    for clip, clipped in cases.values():
        reference = (rows * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)[:, None]).sum(0)
        fast = clipped_psi_theta_sum(model, x, groups, W, prior, clip, labels)
        slow = clipped_psi_theta_sum(NotTabular(model), x, groups, W, prior, clip, labels)
        assert fast.shape == (rows.shape[1],) and fast.dtype == torch.float32
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(slow, reference, rtol=1e-5, atol=1e-6)
        n_clipped = int((norms > clip).sum())
        if clipped is not None:
            assert n_clipped == clipped
        else:
            assert 0 < n_clipped < int(active.sum())


def test_clipped_sum_respects_the_bound_per_record() -> None:
    model, x, groups, labels = _model_batch("mlp", 2, 3, 16, seed=33)
    prior = batch_prior("dp", groups, labels, 2, 3)
    W = 3.0 * random_w(prior, seed=34, dtype=torch.float32)
    clip = 0.05
    for i in range(16):  # one record's contribution is its clipped gradient: norm <= C, == C when it was clipped
        single = clipped_psi_theta_sum(model, x[i : i + 1], groups[i : i + 1], W, prior, clip)
        assert float(torch.linalg.vector_norm(single)) == pytest.approx(clip, rel=1e-5)
    total = clipped_psi_theta_sum(model, x, groups, W, prior, clip)
    assert float(torch.linalg.vector_norm(total)) <= 16 * clip * (1 + 1e-5)
    empty = clipped_psi_theta_sum(model, x[:0], groups[:0], W, prior, clip)
    assert empty.shape == total.shape and torch.all(empty == 0)
    with pytest.raises(ValueError, match="clip must be a finite number > 0"):
        clipped_psi_theta_sum(model, x, groups, W, prior, 0.0)


def test_model_and_prior_must_agree_on_labels() -> None:
    model = build_model("logreg", 4, 3, seed=0)
    prior = GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)
    x, groups = torch.randn(3, 4), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="3 logits per record but the prior has num_labels=2"):
        psi_theta_gradients(model, x, groups, torch.zeros(2, 2), prior)
    with pytest.raises(ValueError, match="3 logits per record"):
        clipped_psi_theta_sum(model, x, groups, torch.zeros(2, 2), prior, 1.0)
    with pytest.raises(ValueError, match="x has 2 rows but groups has 3"):
        clipped_psi_theta_sum(build_model("logreg", 4, 2), x[:2], groups, torch.zeros(2, 2), prior, 1.0)


@pytest.mark.parametrize("notion", FAIRNESS_NOTIONS)
@pytest.mark.parametrize("l_", [2, 3])
def test_logreg_clipped_sum_without_backward_pass_gives_autograds_bits(notion: str, l_: int) -> None:
    """Logistic regression's theta-sum from the closed-form logit gradients (`psi_logit_grads`, no backward pass)
    equals the backward pass of sum_i <a_i, F(x_i)> (`linear_stack_clipped_sum`) bit for bit, at a SteFFLe round's
    batch size, with every row clipped, some, and none."""
    from silofl.protocols.models import linear_stack_clipped_sum

    for seed in range(4):
        model = build_model("logreg", 102, l_, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        n = 256 + seed
        x = torch.randn(n, 102, generator=gen) * (1 + seed)
        groups = torch.randint(0, 3, (n,), generator=gen)
        labels = torch.randint(0, l_, (n,), generator=gen)
        prior = batch_prior(notion, groups, labels, 3, l_)
        W = random_w(prior, seed=seed, dtype=torch.float32)
        a = psi_output_cotangents(groups, W, prior, labels)

        def total(logits: torch.Tensor, a: torch.Tensor = a) -> torch.Tensor:
            return (a * torch.softmax(logits, -1)).sum()

        for clip in (1e-4, 0.05, 1e6):
            expected = linear_stack_clipped_sum(model, x, total, clip)
            assert torch.equal(clipped_psi_theta_sum(model, x, groups, W, prior, clip, labels), expected)
