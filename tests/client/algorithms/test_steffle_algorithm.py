"""SteFFLe's silo computations: the split of the W-gradient between the divisions, and the noise radius."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.client.algorithms.steffle import w_gradient_base, w_radius_of
from silofl.client.data.tabular import NonSensitiveDivision, SensitiveDivision
from silofl.client.group_fairness import group_label_counts
from silofl.protocols.steffle import GroupPrior, psi_w_gradients, w_shape


@pytest.mark.parametrize(
    ("notion", "k", "l_"), [("dp", 2, 2), ("dp", 3, 3), ("eo", 2, 2), ("eo", 3, 3), ("eopp", 2, 3)]
)
def test_w_gradient_splits_into_the_nonsensitive_part_and_the_s_dependent_part(notion, k, l_) -> None:
    """mean_i dpsi_i/dW == w_gradient_base (no s) + mean_i dpsi_i/dW at W = 0 (the only s-dependent term)."""
    gen = torch.Generator().manual_seed(1)
    n = 50
    probs = torch.softmax(torch.randn(n, l_, generator=gen, dtype=torch.float64), dim=1)
    groups = torch.randint(0, k, (n,), generator=gen)
    labels = torch.randint(0, l_, (n,), generator=gen)
    table = np.random.default_rng(0).dirichlet(np.ones(k), size=l_)
    prior = GroupPrior(notion, table[0] if notion == "dp" else table, num_labels=l_)
    w = torch.randn(w_shape(notion, k, l_), generator=gen, dtype=torch.float64)
    full = psi_w_gradients(probs, groups, w, prior, labels=labels).mean(dim=0)
    sensitive = psi_w_gradients(probs, groups, torch.zeros_like(w), prior, labels=labels).mean(dim=0)
    base = w_gradient_base(probs, labels, w, prior)
    torch.testing.assert_close(base + sensitive, full)
    # the base part really ignores s: any other grouping gives the same full - sensitive difference
    other = (groups + 1) % k
    full_other = psi_w_gradients(probs, other, w, prior, labels=labels).mean(dim=0)
    sens_other = psi_w_gradients(probs, other, torch.zeros_like(w), prior, labels=labels).mean(dim=0)
    torch.testing.assert_close(full_other - sens_other, base)


def test_s_dependent_w_gradient_stays_within_the_noise_radius() -> None:
    prior = GroupPrior("dp", np.array([0.1, 0.3, 0.6]), num_labels=2)
    radius = w_radius_of(prior)
    assert radius == pytest.approx(2 / math.sqrt(0.1))
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]], dtype=torch.float64)
    w0 = torch.zeros(3, 2, dtype=torch.float64)
    for s in range(3):
        grads = psi_w_gradients(probs, torch.full((3,), s), w0, prior)
        norms = torch.linalg.vector_norm(grads.reshape(3, -1), dim=1)
        assert (norms <= radius + 1e-12).all()


def test_group_label_counts() -> None:
    ns = NonSensitiveDivision(np.zeros((5, 2), np.float32), np.array([0, 1, 1, 0, 1]))
    s = SensitiveDivision(np.array([0, 0, 1, 1, 1]))
    counts = group_label_counts(ns, s, 2, 2)
    np.testing.assert_array_equal(counts, [[1, 1], [1, 2]])


@pytest.mark.parametrize(("kind", "notion", "l_"), [("logreg", "dp", 2), ("mlp", "eo", 3), ("logreg", "eopp", 3)])
def test_fairness_gradients_keep_f_from_the_clipped_sums_forward_pass_bit_for_bit(kind, notion, l_) -> None:
    """The sensitive division's theta-sum and F, from one forward pass, are the bits of `clipped_psi_theta_sum` and
    of a separate forward pass: the round's results do not depend on the shortcut."""
    from silofl.client.algorithms.steffle import _clipped_theta_sum_and_outputs
    from silofl.protocols.models import build_model
    from silofl.protocols.steffle import clipped_psi_theta_sum

    gen = torch.Generator().manual_seed(3)
    n, d, k = 40, 7, 2
    model = build_model(kind, d, l_, hidden=5, seed=2)
    x = torch.randn(n, d, generator=gen)
    s = torch.randint(0, k, (n,), generator=gen)
    y = torch.randint(0, l_, (n,), generator=gen)
    table = np.random.default_rng(1).dirichlet(np.ones(k), size=l_)
    prior = GroupPrior(notion, table[0] if notion == "dp" else table, num_labels=l_)
    w = torch.randn(w_shape(notion, k, l_), generator=gen)
    theta, probs = _clipped_theta_sum_and_outputs(model, x, s, w, prior, 0.05, y)
    assert torch.equal(theta, clipped_psi_theta_sum(model, x, s, w, prior, 0.05, labels=y))
    with torch.no_grad():
        assert torch.equal(probs, torch.softmax(model(x), dim=1))


@pytest.mark.parametrize(("notion", "k", "l_"), [("dp", 3, 2), ("dp", 5, 3), ("eo", 3, 2), ("eopp", 4, 3)])
def test_balanced_w_gradient_is_the_whole_mean_gradient_from_the_sensitive_release(notion, k, l_) -> None:
    """Group-balanced objective: fairness_gradients' h_W (no noise) is the whole mean_i dpsi_i/dW over its sample,
    its -2 W F term recovered from the s-dependent release (`balanced_w_base`); the theta part is the clipped sum of
    the weighted per-sample gradients; and every record's s-dependent W-gradient lies within w_radius_of."""
    from silofl.client.algorithms.steffle import balanced_w_base, fairness_gradients
    from silofl.protocols.models import build_model
    from silofl.protocols.steffle import clipped_psi_theta_sum

    gen = torch.Generator().manual_seed(5)
    n, d = 60, 4
    model = build_model("logreg" if l_ == 2 else "mlp", d, l_, hidden=5, seed=1)
    data = NonSensitiveDivision(
        torch.randn(n, d, generator=gen).numpy(), torch.randint(0, l_, (n,), generator=gen).numpy()
    )
    sensitive = SensitiveDivision(torch.randint(0, k, (n,), generator=gen).numpy())
    table = np.random.default_rng(2).dirichlet(np.ones(k), size=l_)
    prior = GroupPrior(notion, table[0] if notion == "dp" else table, num_labels=l_, balanced=True)
    w = 0.5 * torch.randn(w_shape(notion, k, l_), generator=gen)
    h_theta, h_w = fairness_gradients(
        model, data, sensitive, w=w, prior=prior, rate=1.0, clip=0.3, noise_multiplier=0.0,
        rng=np.random.default_rng(0), generator=torch.Generator(),
    )  # fmt: skip
    x, y, s = torch.from_numpy(data.features), torch.from_numpy(data.labels), torch.from_numpy(sensitive.groups)
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1)
    torch.testing.assert_close(h_w, psi_w_gradients(probs, s, w, prior, labels=y).mean(dim=0))
    torch.testing.assert_close(h_theta, clipped_psi_theta_sum(model, x, s, w, prior, 0.3, labels=y) / n)
    sens = psi_w_gradients(probs, s, torch.zeros_like(w), prior, labels=y)
    torch.testing.assert_close(balanced_w_base(w, sens.mean(dim=0), prior) + sens.mean(dim=0), h_w)
    assert float(torch.linalg.vector_norm(sens.reshape(n, -1), dim=1).max()) <= w_radius_of(prior) + 1e-5
    assert w_radius_of(prior) == pytest.approx(2 / (math.sqrt(k) * float(prior.block_probs().min())))


@pytest.mark.slow
@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize(("notion", "l_"), [("dp", 2), ("eo", 2), ("eopp", 3)])
def test_per_group_w_noise_scales_each_row_to_its_own_bound(notion, l_, balanced) -> None:
    """w-noise per-group: row (b, r) of the W release gets noise std sigma * B_br (B = w_row_bounds), i.e. the
    release divided row by row by B is the unit-sensitivity Gaussian; every record's contribution to the scaled
    release lies in the unit ball (the accountant's radius 1); the largest bound is w_radius_of's."""
    from silofl.client.algorithms.steffle import per_group_w_release

    k = 4
    table = np.array([[0.02, 0.08, 0.3, 0.6], [0.05, 0.15, 0.2, 0.6], [0.1, 0.1, 0.2, 0.6]])[:l_]
    prior = GroupPrior(notion, table[0] if notion == "dp" else table, num_labels=l_, balanced=balanced)
    bounds = prior.w_row_bounds()
    assert float(bounds.max()) == pytest.approx(w_radius_of(prior))
    shape = w_shape(notion, k, l_)
    zeros = torch.zeros(shape, dtype=torch.float64)
    draws = torch.stack([per_group_w_release(zeros, prior, 2.0, torch.Generator().manual_seed(i)) for i in range(4000)])
    per_row = draws.reshape(4000, -1, l_).std(dim=(0, 2))  # (blocks * k,)
    torch.testing.assert_close(per_row, torch.from_numpy(2.0 * bounds.reshape(-1)), rtol=0.05, atol=0.0)
    # same generator: the scaled release is exactly the unit-sensitivity mechanism's draw
    value = torch.randn(shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    scale = torch.from_numpy(bounds).reshape(*shape[:-1], 1)
    released = per_group_w_release(value, prior, 1.5, torch.Generator().manual_seed(3))
    unit = value / scale + 1.5 * torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(released / scale, unit)
    # each record's s-dependent W-gradient, divided by its row's bound, has norm <= 1 (reached for a vertex F)
    F = torch.eye(l_, dtype=torch.float64).repeat(k, 1)
    groups = torch.arange(k).repeat_interleave(l_)
    labels = torch.full((k * l_,), l_ - 1) if notion != "dp" else None
    rows = psi_w_gradients(F, groups, zeros, prior, labels=labels) / scale
    norms = torch.linalg.vector_norm(rows.reshape(k * l_, -1), dim=1)
    assert float(norms.max()) == pytest.approx(1.0) and bool((norms <= 1.0 + 1e-12).all())


def test_balanced_is_for_silos_only_and_per_group_noise_for_every_topology() -> None:
    from silofl.protocols.config import ConfigError, RunConfig

    base = {"algorithm": "steffle", "dataset": "synthetic", "epsilon": 1.0}
    assert RunConfig.parse({**base, "group-weight": "balanced", "w-noise": "per-group"}).group_weight == "balanced"
    with pytest.raises((ConfigError, ValueError), match="topology 'silos' only"):
        RunConfig.parse({**base, "topology": "divided", "group-weight": "balanced"})
    # per-group W noise, explicit or by default (auto), is implemented at the separate sensitive parties too
    for w_noise in ("per-group", "auto", "isotropic"):
        assert RunConfig.parse({**base, "topology": "divided", "w-noise": w_noise}).w_noise == w_noise
    assert RunConfig.parse({**base, "topology": "divided"}).w_noise == "auto"


def test_w_noise_auto_is_per_group() -> None:
    """The default w-noise (auto) noises the W release row by row, exactly as an explicit per-group does;
    isotropic stays what it was (the paper-reproduction sweeps pin it)."""
    from silofl.client.rounds.steffle import w_noise_of
    from silofl.protocols.config import RunConfig

    assert RunConfig.parse({"algorithm": "steffle", "rounds": 2}).w_noise == "auto"
    assert RunConfig.parse({"algorithm": "steffle", "rounds": 2}).w_lr == 0.02
    assert [w_noise_of(w) for w in ("auto", "per-group", "isotropic")] == ["per-group", "per-group", "isotropic"]
