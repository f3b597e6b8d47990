"""Finite releases whatever finite values a (malicious) server sends: the per-record terms a silo clips and noises.

A server can send a model, a W or query points whose values are finite but huge (a head weight of 3e38 in
float32, a query point of norm 1e300). Then one record's per-sample term overflows to inf or NaN, and with the
old rule (a NaN norm kept its clip factor 1, and 0 x inf is NaN) the noised release became NaN, or the silo raised,
exactly when a target record was present or had s = 1: noise cannot hide a NaN. The rule now: a record whose term,
or the norm of its term, is not finite contributes exactly 0 (the point every replace-one / add-remove ball is
centred on, what an unsampled record contributes); records with finite norms are clipped as before, bit for bit.

Each route gets inputs that make exactly one record (the target) overflow, and the tests check that the result is
(a) finite, (b) what the batch gives with the target's term replaced by 0 (without the target), and (c) unchanged for
the other records. Then the concrete attacks: a huge model against DP-FedSGD, SteFFLe (MLP: only s = 1 overflows),
FedFDP, DP-mu2-FL's query points and DP-CalR's clipping (a separate sensitive party runs SteFFLe's sensitive division
on the records sealed to it: the same route as a silo's).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.client import noisy_gradient
from silofl.client.algorithms import fedfdp as fedfdp_algo
from silofl.client.algorithms import steffle
from silofl.client.data.tabular import NonSensitiveDivision, SensitiveDivision
from silofl.client.gradients import clip_rows, clipped_gradient_sum, weighted_clipped_gradient_sum
from silofl.protocols import fedfdp, fedsc, models, mu2fl, tran
from silofl.protocols import steffle as steffle_maths
from silofl.protocols.models import build_model, clip_factors, head_clipped_sum, linear_stack_clipped_sum
from silofl.protocols.privacy.gaussian import GaussianMechanism
from tests.generic_module import NotTabular

HUGE = 3e38  # finite in float32 (max 3.4e38); twice it overflows
D, N, TARGET = 6, 24, 9  # features, records, the target's position in the batch


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features in [0, 1) whose first two columns are 0 for every record but the target's (1 and 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, D, generator=g)
    x[:, :2] = 0.0
    x[TARGET, :2] = 1.0
    y = torch.randint(0, 2, (N,), generator=g)
    return x, y


def _without_target(*tensors: torch.Tensor) -> list[torch.Tensor]:
    keep = torch.ones(N, dtype=torch.bool)
    keep[TARGET] = False
    return [t[keep] for t in tensors]


def _targeted(kind: str) -> torch.nn.Module:
    """A model whose logits are finite for every record of `_batch` but the target's, which overflow to inf.

    logreg: head weight 3e38 on the two marker columns, bias -3e38: z = 3e38 (x_0 + x_1) - 3e38, finite (-3e38) for
    the others, 6e38 - 3e38 = inf for the target. mlp: hidden unit 0 = relu(10 (x_0 + x_1 - 1.5)), 0 for the others
    and 5 for the target, and head weight 3e38 on it."""
    model = build_model(kind, D, 2, hidden=4, seed=1)
    with torch.no_grad():
        if kind == "logreg":
            model.head.weight.zero_()
            model.head.weight[0, :2] = HUGE
            model.head.bias.fill_(-HUGE)
        else:
            model.hidden.weight[0].zero_()
            model.hidden.weight[0, :2] = 10.0
            model.hidden.bias[0] = -15.0
            model.head.weight[0, 0] = HUGE
    return model


def _all_huge(kind: str) -> torch.nn.Module:
    """Head weight and bias 3e38: every record with a positive feature (or hidden unit) overflows."""
    model = build_model(kind, D, 2, hidden=4, seed=1)
    with torch.no_grad():
        model.head.weight.fill_(HUGE)
        model.head.bias.fill_(HUGE)
    return model


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


# ---------------------------------------------------------------------------------------------------------------------
# protocols.models: the clip factors and the clipped sums


def test_clip_factors_are_zero_for_non_finite_norms_and_unchanged_otherwise() -> None:
    norms = torch.tensor([0.0, 0.3, 1.0, 1.5, 7.0, 1e30, math.inf, math.nan, -0.0])
    factors = clip_factors(norms, 1.0)
    finite = torch.isfinite(norms)
    old = torch.where(norms > 1.0, 1.0 / norms, torch.ones_like(norms))  # the rule for finite norms, as before
    assert torch.equal(factors[finite], old[finite])
    assert factors[~finite].tolist() == [0.0, 0.0]


def test_clipped_row_sum_leaves_out_a_non_finite_row_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(N, 5, generator=g), 3.0 * torch.randn(N, 2, generator=g)]
    norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(r, dim=1) for r in rows], dim=1), dim=1)
    clean = models.clipped_row_sum(rows, norms, 1.0)
    old = torch.cat([torch.where(norms > 1.0, 1.0 / norms, torch.ones_like(norms)) @ r for r in rows])
    assert torch.equal(clean, old)  # (c) no bad record: the old formula's bits
    for bad in (math.inf, math.nan, 1e30):
        dirty = [r.clone() for r in rows]
        dirty[1][TARGET, 0] = bad
        dirty_norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(r, dim=1) for r in dirty], dim=1), dim=1
        )
        if bad == 1e30:  # finite entries whose norm overflows float32: out as well
            assert math.isinf(float(dirty_norms[TARGET]))
        total = models.clipped_row_sum(dirty, dirty_norms, 1.0)
        expected = models.clipped_row_sum(_without_target(*rows), _without_target(norms)[0], 1.0)
        assert _finite(total)  # (a)
        assert torch.equal(total, expected)  # (b), (c): the sum over the other records, bit for bit


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_linear_stack_and_head_routes_drop_an_inf_feature_record(kind: str) -> None:
    model = build_model(kind, D, 2, hidden=4, seed=1)
    x, y = _batch()
    bad = x.clone()
    bad[TARGET, 3] = math.inf
    x_rest, y_rest = _without_target(x, y)

    def total(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")

    got = linear_stack_clipped_sum(model, bad, lambda logits: total(logits, y), 1.0)
    assert _finite(got)
    torch.testing.assert_close(got, linear_stack_clipped_sum(model, x_rest, lambda lg: total(lg, y_rest), 1.0))
    if kind == "logreg":

        def grads(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return torch.softmax(logits, dim=1) - torch.nn.functional.one_hot(labels, 2)

        got = head_clipped_sum(model, bad, lambda logits: grads(logits, y), 1.0)
        assert _finite(got)
        torch.testing.assert_close(got, head_clipped_sum(model, x_rest, lambda lg: grads(lg, y_rest), 1.0))


# ---------------------------------------------------------------------------------------------------------------------
# client.gradients (DP-FedSGD, FedFDP)


def test_clip_rows_gives_zero_rows_for_non_finite_rows() -> None:
    g = torch.randn(N, 7, generator=torch.Generator().manual_seed(3))
    bad = g.clone()
    bad[TARGET, 2] = math.nan
    bad[TARGET + 1, 0] = -math.inf
    bad[TARGET + 2, 1] = 1e30  # finite, norm overflows
    clipped = clip_rows(bad, 0.5)
    assert _finite(clipped)
    assert torch.equal(clipped[TARGET : TARGET + 3], torch.zeros(3, 7))
    others = torch.ones(N, dtype=torch.bool)
    others[TARGET : TARGET + 3] = False
    assert torch.equal(clipped[others], clip_rows(g, 0.5)[others])  # (c) bit for bit


@pytest.mark.parametrize("route", ["logreg", "mlp", "vmap"])
@pytest.mark.parametrize("attack", ["targeted", "inf feature"])
def test_clipped_gradient_sum_drops_the_overflowing_record(route: str, attack: str) -> None:
    kind = "logreg" if route == "logreg" else "mlp"
    x, y = _batch()
    if attack == "targeted":
        model = _targeted(kind)
    else:
        model = build_model(kind, D, 2, hidden=4, seed=1)
        x[TARGET, 4] = math.inf
    if route == "vmap":
        model = NotTabular(model)
    with_target = clipped_gradient_sum(model, x, y, 1.0)
    without = clipped_gradient_sum(model, *_without_target(x, y), 1.0)
    assert _finite(with_target)
    torch.testing.assert_close(with_target, without)


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_dp_fedsgd_release_with_a_huge_model_is_finite_with_and_without_the_target(kind: str) -> None:
    """The attack: head weight and bias 3e38. Every record overflows (all contribute 0), or with the targeted model only
    the target: the release is finite and the target's presence changes nothing but the rounding."""
    x, y = _batch()
    x_rest, y_rest = _without_target(x, y)
    args = {"sampling_rate": 1.0, "batch_size": N, "clip": 1.0, "noise_multiplier": 1.0}
    for model in (_all_huge(kind), _targeted(kind)):
        releases = []
        for features, labels in ((x, y), (x_rest, y_rest)):
            data = NonSensitiveDivision(features.numpy().copy(), labels.numpy().copy())
            releases.append(
                noisy_gradient.noisy_gradient(
                    model,
                    data,
                    sample_rng=np.random.default_rng(0),
                    noise_generator=torch.Generator().manual_seed(4),
                    **args,
                )
            )
        assert all(_finite(r) for r in releases)
        torch.testing.assert_close(releases[0], releases[1])


@pytest.mark.parametrize("route", ["logreg", "mlp", "vmap"])
def test_weighted_clipped_gradient_sum_gives_non_finite_weights_zero_and_never_raises_for_them(route: str) -> None:
    model = build_model("logreg" if route == "logreg" else "mlp", D, 2, hidden=4, seed=1)
    if route == "vmap":
        model = NotTabular(model)
    x, y = _batch()
    weights = torch.linspace(0.5, 2.0, N)
    for bad in (math.inf, math.nan):
        dirty = weights.clone()
        dirty[TARGET] = bad
        got = weighted_clipped_gradient_sum(model, x, y, dirty, 1.0)
        zeroed = weights.clone()
        zeroed[TARGET] = 0.0
        assert _finite(got)
        torch.testing.assert_close(got, weighted_clipped_gradient_sum(model, x, y, zeroed, 1.0))
    negative = weights.clone()
    negative[0] = -1.0
    with pytest.raises(ValueError, match=">= 0"):
        weighted_clipped_gradient_sum(model, x, y, negative, 1.0)  # a caller's error, not the data's


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_weighted_clipped_gradient_sum_with_a_huge_model(kind: str) -> None:
    x, y = _batch()
    model = _targeted(kind)
    weights = torch.linspace(0.5, 2.0, N)
    got = weighted_clipped_gradient_sum(model, x, y, weights, 1.0)
    assert _finite(got)
    torch.testing.assert_close(got, weighted_clipped_gradient_sum(model, *_without_target(x, y, weights), 1.0))


# ---------------------------------------------------------------------------------------------------------------------
# FedFDP


def test_fair_weights_and_clip_factors_give_non_finite_losses_weight_zero() -> None:
    losses = torch.tensor([0.5, math.inf, math.nan, 2.0])
    weights = fedfdp.fair_weights(losses, 0.7, 0.5)
    assert weights.tolist() == [pytest.approx(0.9), 0.0, 0.0, pytest.approx(1.65)]
    norms = torch.tensor([3.0, 1.0, 1.0, math.nan])
    factors = fedfdp.fair_clip_factors(torch.tensor([1.0, math.nan, math.inf, 1.0]), norms, 1.0)
    assert factors.tolist() == [pytest.approx(1.0 / 3.0), 0.0, 0.0, 0.0]
    bounded = fedfdp.clipped_loss_sum(torch.tensor([0.5, math.inf, math.nan, 9.0, -1.0]), 2.0)
    assert float(bounded) == 2.5  # 0.5 + 0 + 0 + 2 + 0


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_fedfdp_never_raises_with_a_huge_model_and_releases_finite_values(kind: str) -> None:
    x, y = _batch()
    x_rest, y_rest = _without_target(x, y)
    for model in (_all_huge(kind), _targeted(kind)):
        grads, losses = [], []
        for features, labels in ((x, y), (x_rest, y_rest)):
            data = NonSensitiveDivision(features.numpy().copy(), labels.numpy().copy())
            common = {"sampling_rate": 1.0, "batch_size": N, "sample_rng": np.random.default_rng(0)}
            grads.append(
                fedfdp_algo.fair_noisy_gradient(
                    model,
                    data,
                    global_loss=0.7,
                    lam=0.5,
                    clip=1.0,
                    noise_multiplier=1.0,
                    noise_generator=torch.Generator().manual_seed(4),
                    **common,
                )
            )
            for multiplier in (1.0, 0.0):
                common["sample_rng"] = np.random.default_rng(0)
                losses.append(
                    fedfdp_algo.loss_release(
                        model,
                        data,
                        bound=2.5,
                        noise_multiplier=multiplier,
                        noise_generator=torch.Generator().manual_seed(5),
                        **common,
                    )
                )
        assert all(_finite(g) for g in grads)
        assert all(math.isfinite(v) for v in losses)
        torch.testing.assert_close(grads[0], grads[1])
        assert losses[0] == pytest.approx(losses[2], rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# ERMI / SteFFLe


def _prior() -> steffle_maths.GroupPrior:
    return steffle_maths.GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)


def _s_attack_mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    """An MLP and a W (within the honest radius 2) under which only records with s = 1 overflow.

    Hidden unit 0 is 0.5 for every record (zero weights, bias 0.5); head weight 3e38 on it and head bias -1.5e38, so
    z = 0 exactly and F = (1/2, 1/2). W = [[0, 0], [-1, 1]]: a record of group 0 has a constant cotangent a_i, so its
    d psi / d z is exactly 0; one of group 1 has d psi / d z = 1 / sqrt(p(1)) = 1.41, and the hidden layer's
    gradient 3e38 x 1.41 overflows to inf."""
    model = build_model("mlp", D, 2, hidden=4, seed=1)
    with torch.no_grad():
        model.hidden.weight[0].zero_()
        model.hidden.bias[0] = 0.5
        model.head.weight.zero_()
        model.head.weight[0, 0] = HUGE
        model.head.bias.fill_(-HUGE / 2)
    return model, torch.tensor([[0.0, 0.0], [-1.0, 1.0]])


def _groups() -> torch.Tensor:
    s = torch.zeros(N, dtype=torch.long)
    s[::3] = 1
    s[TARGET] = 0
    return s


@pytest.mark.parametrize("route", ["logreg", "mlp", "vmap"])
def test_clipped_psi_theta_sum_drops_the_overflowing_record(route: str) -> None:
    model = _targeted("logreg" if route == "logreg" else "mlp")
    if route == "vmap":
        model = NotTabular(model)
    x, _ = _batch()
    s = _groups()
    w = torch.tensor([[0.3, -0.2], [0.1, 0.4]])
    got = steffle_maths.clipped_psi_theta_sum(model, x, s, w, _prior(), 1.0)
    assert _finite(got)
    x_rest, s_rest = _without_target(x, s)
    torch.testing.assert_close(got, steffle_maths.clipped_psi_theta_sum(model, x_rest, s_rest, w, _prior(), 1.0))


@pytest.mark.parametrize("notion", ["dp", "eo", "eopp"])
def test_psi_w_sensitive_sum_leaves_out_a_non_finite_row_of_f(notion: str) -> None:
    g = torch.Generator().manual_seed(2)
    F = torch.softmax(torch.randn(N, 2, generator=g), dim=1)
    s = _groups()
    y = torch.randint(0, 2, (N,), generator=g)
    labels = None if notion == "dp" else y
    prior = steffle_maths.GroupPrior.from_counts(notion, np.array([[10.0, 30.0], [25.0, 15.0]]))
    clean = steffle_maths.psi_w_sensitive_sum_checked(F, s, prior, labels)
    for bad in (math.nan, math.inf):
        dirty = F.clone()
        dirty[TARGET, 1] = bad
        got = steffle_maths.psi_w_sensitive_sum_checked(dirty, s, prior, labels)
        F_rest, s_rest, y_rest = _without_target(F, s, y)
        expected = steffle_maths.psi_w_sensitive_sum_checked(F_rest, s_rest, prior, None if notion == "dp" else y_rest)
        assert _finite(got)
        torch.testing.assert_close(got, expected)
        # (c): replacing the target's F by 0 gives the same sum up to rounding, and the clean batch is unchanged
        zeroed = F.clone()
        zeroed[TARGET] = 0.0
        torch.testing.assert_close(got, steffle_maths.psi_w_sensitive_sum_checked(zeroed, s, prior, labels))
    reference = steffle_maths.psi_w_gradients(F, s, torch.zeros(prior.w_shape()), prior, labels).sum(dim=0)
    assert torch.equal(clean, reference)


def _steffle_release(model: torch.nn.Module, w: torch.Tensor, s: torch.Tensor, sigma: float):
    x, y = _batch()
    return steffle.fairness_gradients(
        model,
        NonSensitiveDivision(x.numpy().copy(), y.numpy().copy()),
        SensitiveDivision(s.numpy().copy()),
        w=w,
        prior=_prior(),
        rate=1.0,
        clip=1.0,
        noise_multiplier=sigma,
        generator=torch.Generator().manual_seed(7),
        sample=np.arange(N),
    )


@pytest.mark.parametrize("sigma", [0.0, 2.0])
def test_steffle_fairness_gradients_with_an_mlp_where_only_s_1_overflows(sigma: float) -> None:
    """The target's s = 0 and s = 1 give finite releases of the same shapes (before: NaN exactly when s = 1)."""
    model, w = _s_attack_mlp()
    s0 = _groups()
    s1 = s0.clone()
    s1[TARGET] = 1
    theta0, w0 = _steffle_release(model, w, s0, sigma)
    theta1, w1 = _steffle_release(model, w, s1, sigma)
    assert _finite(theta0) and _finite(theta1) and _finite(w0) and _finite(w1)
    assert theta0.shape == theta1.shape and w0.shape == w1.shape
    if sigma == 0.0:  # the target's theta term: exactly 0 with s = 0, left out (0) with s = 1
        torch.testing.assert_close(theta0, theta1)


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_steffle_fairness_gradients_with_a_huge_head(kind: str) -> None:
    w = torch.tensor([[0.3, -0.2], [0.1, 0.4]])
    for model in (_all_huge(kind), _targeted(kind)):
        theta, w_sum = _steffle_release(model, w, _groups(), 2.0)
        assert _finite(theta) and _finite(w_sum)


# ---------------------------------------------------------------------------------------------------------------------
# Tran


@pytest.mark.parametrize("route", ["mlp", "vmap"])
def test_clipped_constraint_gradient_sum_drops_the_overflowing_record(route: str) -> None:
    model = _targeted("mlp")
    if route == "vmap":
        model = NotTabular(model)
    x, _ = _batch()
    s = _groups()
    c = torch.tensor([[0.5, -0.5], [-0.3, 0.3]])
    got = tran.clipped_constraint_gradient_sum(model, x, s, c, _prior(), 1.0)
    assert _finite(got)
    x_rest, s_rest = _without_target(x, s)
    torch.testing.assert_close(got, tran.clipped_constraint_gradient_sum(model, x_rest, s_rest, c, _prior(), 1.0))


def test_group_mass_sum_leaves_out_a_non_finite_row_of_f() -> None:
    F = torch.softmax(torch.randn(N, 2, generator=torch.Generator().manual_seed(5)), dim=1)
    s = _groups()
    clean = tran.group_mass_sum(F, s, _prior())
    dirty = F.clone()
    dirty[TARGET] = math.nan
    got = tran.group_mass_sum(dirty, s, _prior())
    assert _finite(got)
    F_rest, s_rest = _without_target(F, s)
    torch.testing.assert_close(got, tran.group_mass_sum(F_rest, s_rest, _prior()))
    place = torch.nn.functional.one_hot(s, 2).to(F.dtype)
    assert torch.equal(clean, torch.einsum("nb,nk,nl->bkl", torch.ones(N, 1), place, F).reshape(2, 2))


# ---------------------------------------------------------------------------------------------------------------------
# DP-mu2-FL


@pytest.mark.parametrize("classes", [2, 3])
def test_logreg_grad_is_finite_and_right_at_extreme_query_points(classes: int) -> None:
    rng = np.random.default_rng(0)
    features = rng.random((16, 5))
    labels = rng.integers(0, classes, 16)
    dim = mu2fl.logreg_dim(5, classes)
    cases = [rng.standard_normal(dim) for _ in range(3)] + [np.ones(dim)]  # the last: logits tie, or z = +inf
    for scale, direction in zip((1e300, 1e308, 1.7e308, 1.7e308), cases, strict=True):
        params = direction * (scale / np.abs(direction).max())
        g = mu2fl.logreg_grad(params, features, labels, classes)
        assert np.all(np.isfinite(g))
        # the limit: softmax of logits that differ by >= 1e280 is one-hot at the largest (uniform over ties)
        rows = 1 if classes == 2 else classes
        weight, bias = params[: rows * 5].reshape(rows, 5), params[rows * 5 :]
        z = features @ (weight.T / scale) + bias / scale  # the logits / scale: finite
        logits = np.concatenate([np.zeros_like(z), z], axis=1) if classes == 2 else z
        top = logits == logits.max(axis=1, keepdims=True)
        p = top / top.sum(axis=1, keepdims=True)
        r = p - np.eye(classes)[labels]
        r = r[:, 1:] if classes == 2 else r
        expected = np.concatenate([(r.T @ features).ravel(), r.sum(axis=0)]) / 16
        np.testing.assert_allclose(g, expected, atol=1e-12)
        assert not math.isnan(mu2fl.logreg_loss(params, features, labels, classes))  # inf at most: the true loss
        assert 0.0 <= mu2fl.logreg_accuracy(params, features, labels, classes) <= 1.0
    with np.errstate(all="ignore"):
        # a query point of norm 1e300 (the check of `client.rounds.mu2fl` bounds steps, not points)
        params = np.full(dim, 1e300 / math.sqrt(dim))
        assert np.all(np.isfinite(mu2fl.logreg_grad(params, features, labels, classes)))


def test_logreg_grad_leaves_out_a_record_with_non_finite_features() -> None:
    rng = np.random.default_rng(1)
    features = rng.random((8, 4))
    labels = rng.integers(0, 2, 8)
    params = rng.standard_normal(5)
    bad = features.copy()
    bad[3, 2] = np.inf
    g = mu2fl.logreg_grad(params, bad, labels, 2)
    assert np.all(np.isfinite(g))
    keep = np.arange(8) != 3
    # the others' gradients, still divided by the batch size 8 (the bad record contributes 0)
    expected = mu2fl.logreg_grad(params, features[keep], labels[keep], 2) * 7 / 8
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------------------------------
# DP-CalR (FedSC)


def test_fedsc_clip_rows_gives_zero_rows_for_non_finite_rows() -> None:
    z = torch.randn(N, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3
    bad = z.clone()
    bad[TARGET] = math.inf
    bad[TARGET + 1, 2] = math.nan
    bad[TARGET + 2, 0] = -math.inf
    clipped = fedsc.clip_rows(bad, 2.0)
    assert _finite(clipped)
    assert torch.equal(clipped[TARGET : TARGET + 3], torch.zeros(3, 6, dtype=torch.float64))
    others = torch.ones(N, dtype=torch.bool)
    others[TARGET : TARGET + 3] = False
    assert torch.equal(clipped[others], fedsc.clip_rows(z, 2.0)[others])
    # differentiable as before, and the bad rows pass no NaN gradient back (zero)
    leaf = bad.clone().requires_grad_(True)
    fedsc.clip_rows(leaf, 2.0).sum().backward()
    assert _finite(leaf.grad)
    assert torch.equal(leaf.grad[TARGET : TARGET + 3], torch.zeros(3, 6, dtype=torch.float64))
    # the correlation DP-CalR sums is finite
    assert _finite(clipped.T @ clipped)


def test_fedsc_normalize_rows_never_emits_nan() -> None:
    z = torch.randn(N, 6, generator=torch.Generator().manual_seed(6))
    bad = z.clone()
    bad[TARGET, 1] = math.inf
    bad[TARGET + 1, 0] = math.nan
    out = fedsc.normalize_rows(bad, 4.0)
    assert _finite(out)
    assert torch.equal(out[TARGET : TARGET + 2], torch.zeros(2, 6))
    others = torch.ones(N, dtype=torch.bool)
    others[TARGET : TARGET + 2] = False
    assert torch.equal(out[others], fedsc.normalize_rows(z, 4.0)[others])
    assert torch.equal(fedsc.normalize_rows(z, 4.0), torch.nn.functional.normalize(z, dim=-1) * 2.0)
    leaf = bad.clone().requires_grad_(True)
    (fedsc.normalize_rows(leaf, 4.0) * torch.arange(6.0)).sum().backward()
    assert _finite(leaf.grad)
    assert torch.equal(leaf.grad[TARGET : TARGET + 2], torch.zeros(2, 6))


# ---------------------------------------------------------------------------------------------------------------------
# The Gaussian mechanism's last line of defence


@pytest.mark.parametrize("bad", ["inf", "nan", "overflow"])
def test_release_of_a_non_finite_value_is_the_noise_alone(bad: str) -> None:
    mechanism = GaussianMechanism(sensitivity=1.0, noise_multiplier=1e37 if bad == "overflow" else 2.0)
    noise = torch.randn(5, generator=torch.Generator().manual_seed(8)) * mechanism.std
    if bad == "overflow":  # finite, but value + noise overflows float32
        value = torch.full((5,), 3.4e38) * torch.sign(noise)
        assert not _finite(value + noise)
    else:
        value = torch.zeros(5)
        value[2] = math.inf if bad == "inf" else math.nan
    g1, g2 = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    released = mechanism.release(value, g1)
    torch.randn(5, generator=g2)
    assert _finite(released)
    assert torch.equal(released, noise)
    assert torch.equal(g1.get_state(), g2.get_state())  # the generator consumed as on the normal path
    # a finite value: value + noise, as always
    assert torch.equal(mechanism.release(torch.ones(5), torch.Generator().manual_seed(8)), torch.ones(5) + noise)
    # no noise: no release of a non-finite value either (the constant 0)
    if bad != "overflow":
        assert torch.equal(GaussianMechanism(1.0, 0.0).release(value), torch.zeros(5))


def test_release_numpy_of_a_non_finite_value_is_the_noise_alone() -> None:
    value = np.array([0.0, np.inf, 1.0])
    mechanism = GaussianMechanism(sensitivity=1.0, noise_multiplier=2.0)
    rng1, rng2 = np.random.default_rng(3), np.random.default_rng(3)
    released = mechanism.release_numpy(value, rng1)
    noise = rng2.normal(0.0, mechanism.std, size=3)
    assert np.array_equal(released, noise)
    assert rng1.random() == rng2.random()
    assert np.array_equal(GaussianMechanism(1.0, 0.0).release_numpy(value, rng1), np.zeros(3))
    finite = np.array([0.0, 1.0, 2.0])
    assert np.array_equal(mechanism.release_numpy(finite, np.random.default_rng(3)), finite + noise)
