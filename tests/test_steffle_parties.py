"""client/algorithms/steffle_parties.py: the separate-party round of SteFFLe against the silo mode's math, on small
synthetic data (float64, so that sums over different routes agree to rounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from client.algorithms.steffle_parties import (
    FeatureRows,
    SensitiveParty,
    combine_sensitive_sums,
    feature_party_step,
    output_jacobians,
    sensitive_party_step,
)
from client.gradients import mean_gradient
from protocols.ermi import GroupPrior, clipped_psi_theta_sum, psi_w_gradients, w_shape
from protocols.models import build_model
from tests.generic_module import NotTabular

N, D, LABELS, GROUPS = 60, 5, 2, 3


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10 * N)[:N].astype(np.int64)  # universal ids: not 0..n-1, not sorted
    x = rng.standard_normal((N, D))
    y = rng.integers(0, LABELS, N).astype(np.int64)
    s = rng.integers(0, GROUPS, N).astype(np.int64)
    return ids, x, y, s


def _model(kind: str = "logreg") -> torch.nn.Module:
    return build_model(kind, D, LABELS, hidden=4, seed=1).double()


def _prior(notion: str) -> GroupPrior:
    counts = np.array([[30.0, 10.0], [20.0, 25.0], [15.0, 40.0]])  # (group, label): unequal, so rho < 1 / k
    return GroupPrior.from_counts(notion, counts)


def _w(notion: str, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.3 * torch.randn(w_shape(notion, GROUPS, LABELS), generator=g, dtype=torch.float64)


@pytest.mark.parametrize("labels", [2, 3])
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_output_jacobians_are_the_per_record_jacobians_of_softmax(kind: str, labels: int) -> None:
    """The closed form for tabular models (and the generic torch.func route) against one autograd pass per record and
    output; the binary head (logits [0, z]) and a multinomial one."""
    model = build_model(kind, D, labels, hidden=4, seed=1).double()
    _, x, _, _ = _data()
    xt = torch.from_numpy(x[:4])
    F, J = output_jacobians(model, xt)
    generic = output_jacobians(NotTabular(model), xt)
    torch.testing.assert_close(J, generic[1])
    params = [p for _, p in model.named_parameters()]
    for i in range(4):
        out = torch.softmax(model(xt[i : i + 1]), dim=-1)[0]
        for u in range(labels):
            grads = torch.autograd.grad(out[u], params, retain_graph=True)
            torch.testing.assert_close(J[i, u], torch.cat([g.reshape(-1) for g in grads]))
        torch.testing.assert_close(F[i], out.detach())


def test_feature_party_sends_the_loss_gradient_sum_and_its_sample_rows() -> None:
    model = _model()
    ids, x, y, _ = _data()
    grad_sum, count, rows = feature_party_step(model, ids, x, y, rate=0.5, rng=np.random.default_rng(3))
    sampled = np.isin(ids, rows.ids)
    assert count == len(rows) == int(sampled.sum()) and 0 < count < N
    np.testing.assert_array_equal(rows.ids, ids[sampled])  # the sample, in the party's record order
    np.testing.assert_array_equal(rows.labels.numpy(), y[sampled])
    expected = mean_gradient(model, torch.from_numpy(x[sampled]), torch.from_numpy(y[sampled]))
    torch.testing.assert_close(grad_sum, expected * count)
    assert set(vars(rows)) == {"ids", "labels", "outputs", "jacobians"}  # nothing about any sensitive attribute


@pytest.mark.parametrize("notion", ["dp", "eo", "eopp"])
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_one_sensitive_party_without_noise_computes_the_silo_modes_sums(kind: str, notion: str) -> None:
    """The same records, q_s = 1, no noise: the sums equal the silo mode's (clipped_psi_theta_sum, psi_w_gradients)."""
    model, prior, w = _model(kind), _prior(notion), _w(notion)
    ids, x, y, s = _data()
    _, _, rows = feature_party_step(model, ids, x, y, rate=0.7, rng=np.random.default_rng(4))
    pos = np.array([int(np.flatnonzero(ids == i)[0]) for i in rows.ids])
    theta, w_sum = sensitive_party_step(
        SensitiveParty(ids, s),
        rows,
        w=w,
        prior=prior,
        clip=0.4,  # binds for some records, not for others (norms 0.17-1.19 here)
        noise_multiplier=0.0,
        keep_rate=1.0,
        rng=np.random.default_rng(5),
        generator=torch.Generator().manual_seed(6),
    )
    xs, ys, ss = torch.from_numpy(x[pos]), torch.from_numpy(y[pos]), torch.from_numpy(s[pos])
    torch.testing.assert_close(theta, clipped_psi_theta_sum(model, xs, ss, w, prior, 0.4, labels=ys))
    with torch.no_grad():
        F = torch.softmax(model(xs), dim=1)
    torch.testing.assert_close(w_sum, psi_w_gradients(F, ss, torch.zeros_like(w), prior, labels=ys).sum(0))


def test_sensitive_parties_that_partition_the_ids_add_up_to_one() -> None:
    model, prior, w = _model(), _prior("dp"), _w("dp")
    ids, x, y, s = _data()
    _, _, rows = feature_party_step(model, ids, x, y, rate=0.8, rng=np.random.default_rng(7))
    kwargs = dict(w=w, prior=prior, clip=1.0, noise_multiplier=0.0, keep_rate=1.0, rng=np.random.default_rng(0))
    g = torch.Generator()
    whole = sensitive_party_step(SensitiveParty(ids, s), rows, generator=g, **kwargs)
    dealt = np.random.default_rng(8).integers(0, 3, N)  # ids dealt to 3 parties independently of the sample
    parts = [
        sensitive_party_step(SensitiveParty(ids[dealt == c], s[dealt == c]), rows, generator=g, **kwargs)
        for c in range(3)
    ]
    torch.testing.assert_close(sum(p[0] for p in parts), whole[0])
    torch.testing.assert_close(sum(p[1] for p in parts), whole[1])


def test_a_party_holding_none_of_the_ids_answers_with_noise_of_the_same_shape_and_scale() -> None:
    """The paper's dummy noise: who answers, and with what shape and scale, does not reveal who holds which ids."""
    model, prior, w = _model("mlp"), _prior("dp"), _w("dp")
    ids, x, y, s = _data()
    _, _, rows = feature_party_step(model, ids, x, y, rate=0.5, rng=np.random.default_rng(9))
    sigma, clip = 2.0, 1.0
    replies = {}
    for name, party in {"holds all": SensitiveParty(ids, s), "holds none": SensitiveParty(ids + 10**6, s)}.items():
        replies[name] = sensitive_party_step(
            party,
            rows,
            w=w,
            prior=prior,
            clip=clip,
            noise_multiplier=sigma,
            keep_rate=1.0,
            rng=np.random.default_rng(1),
            generator=torch.Generator().manual_seed(11),
        )
    theta_all, w_all = replies["holds all"]
    theta_none, w_none = replies["holds none"]
    assert theta_all.shape == theta_none.shape and w_all.shape == w_none.shape
    # the empty party's reply is pure noise of std sigma * C (theta) and sigma * R_W (W)
    assert 0.8 * sigma * clip < float(theta_none.std()) < 1.2 * sigma * clip
    silent = sensitive_party_step(
        SensitiveParty(ids + 10**6, s),
        rows,
        w=w,
        prior=prior,
        clip=clip,
        noise_multiplier=0.0,
        keep_rate=1.0,
        rng=np.random.default_rng(1),
        generator=torch.Generator(),
    )
    assert not silent[0].any() and not silent[1].any()
    # the same noise draw: what differs between the two replies is exactly the holder's signal
    assert not torch.equal(theta_all, theta_none)


def test_changing_one_records_sensitive_value_moves_the_sum_by_at_most_the_clip_bound() -> None:
    """Replace-one on s: one record's theta term stays in the ball of radius C (so the sums differ by <= 2C) and its W
    term in the ball of radius R_W = 2 / sqrt(rho)."""
    model, prior, w = _model("mlp"), _prior("dp"), _w("dp")
    ids, x, y, s = _data()
    _, _, rows = feature_party_step(model, ids, x, y, rate=1.0, rng=np.random.default_rng(12))
    kwargs = dict(
        w=w,
        prior=prior,
        clip=0.5,
        noise_multiplier=0.0,
        keep_rate=1.0,
        rng=np.random.default_rng(0),
        generator=torch.Generator(),
    )
    base = sensitive_party_step(SensitiveParty(ids, s), rows, **kwargs)
    other = s.copy()
    other[0] = (s[0] + 1) % GROUPS
    moved = sensitive_party_step(SensitiveParty(ids, other), rows, **kwargs)
    assert 0 < float(torch.linalg.vector_norm(moved[0] - base[0])) <= 2 * 0.5 + 1e-12
    assert 0 < float(torch.linalg.vector_norm(moved[1] - base[1])) <= 2 * 2.0 / np.sqrt(prior.rho) + 1e-12


def test_secret_coins_keep_about_q_s_of_the_records_and_the_server_rescales() -> None:
    model, prior, w = _model(), _prior("dp"), _w("dp")
    ids, x, y, s = _data()
    _, count, rows = feature_party_step(model, ids, x, y, rate=1.0, rng=np.random.default_rng(13))
    party = SensitiveParty(ids, s)
    kept = []
    for seed in range(200):
        theta, _ = sensitive_party_step(
            party,
            rows,
            w=w,
            prior=prior,
            clip=1e6,
            noise_multiplier=0.0,
            keep_rate=0.25,
            rng=np.random.default_rng(seed),
            generator=torch.Generator(),
        )
        kept.append(combine_sensitive_sums([(theta, torch.zeros_like(w))], count, 0.25)[0])
    full, _ = sensitive_party_step(
        party,
        rows,
        w=w,
        prior=prior,
        clip=1e6,
        noise_multiplier=0.0,
        keep_rate=1.0,
        rng=np.random.default_rng(0),
        generator=torch.Generator(),
    )
    mean = torch.stack(kept).mean(0)
    target = full / count  # unbiased: E[sum kept] / (q_s n) = sum / n
    assert float(torch.linalg.vector_norm(mean - target)) < 0.15 * float(torch.linalg.vector_norm(target))


def test_bad_rows_and_parties_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="ids holds a record id twice"):
        FeatureRows(np.array([1, 1]), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 2, 3))
    with pytest.raises(ValueError, match="jacobians must have shape"):
        FeatureRows(np.array([1, 2]), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="holds a record id twice"):
        SensitiveParty(np.array([3, 3]), np.array([0, 1]))
    with pytest.raises(ValueError, match="keep_rate"):
        rows = FeatureRows(np.array([1]), torch.zeros(1, dtype=torch.long), torch.zeros(1, 2), torch.zeros(1, 2, 3))
        sensitive_party_step(
            SensitiveParty(np.array([1]), np.array([0])),
            rows,
            w=_w("dp"),
            prior=_prior("dp"),
            clip=1.0,
            noise_multiplier=0.0,
            keep_rate=0.0,
            rng=np.random.default_rng(0),
            generator=torch.Generator(),
        )
