"""Tran et al. 2021 (PF-LD) adapted to silos: the math on small arrays, then whole runs of the real ServerApp and
ClientApp (the dual step makes the model fairer; only noised quantities depend on a protected attribute; the ledger
accounts both releases of every round)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from silofl.protocols import tran
from silofl.protocols.fairness_metrics import confusion_counts, fairness_from_counts
from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import build_model
from tests.factories import copy_message


def _batch(n: int, k: int, l_: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    F = torch.softmax(torch.randn(n, l_, generator=gen, dtype=torch.float64), dim=1)
    groups = torch.randint(0, k, (n,), generator=gen)
    labels = torch.randint(0, l_, (n,), generator=gen)
    groups[: k * l_] = torch.arange(k).repeat_interleave(l_)  # every (group, label) pair present
    labels[: k * l_] = torch.arange(l_).repeat(k)
    return F, groups, labels


def _batch_prior(notion: str, groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> GroupPrior:
    """The batch's own group frequencies (P_S, or P_{S|Y}): then the prior-based estimates are exact on the batch."""
    counts = np.zeros((k, l_))
    np.add.at(counts, (groups.numpy(), labels.numpy()), 1.0)
    return GroupPrior.from_counts(notion, counts)


# ---------------------------------------------------------------------------------------------------------------------
# Math


def test_violations_are_the_group_mean_minus_the_population_mean() -> None:
    k, l_ = 3, 4
    F, groups, labels = _batch(200, k, l_, seed=0)
    prior = _batch_prior("dp", groups, labels, k, l_)
    nu = tran.violations((tran.group_mass_sum(F, groups, prior) / len(F)).numpy(), prior)
    for a in range(k):
        expected = F[groups == a].mean(0) - F.mean(0)
        np.testing.assert_allclose(nu[a], expected.numpy(), atol=1e-12)
    # equalized odds: block y is p(y) (E[F | s=a, y] - E[F | y])
    prior_eo = _batch_prior("eo", groups, labels, k, l_)
    nu_eo = tran.violations((tran.group_mass_sum(F, groups, prior_eo, labels) / len(F)).numpy(), prior_eo)
    for y in range(l_):
        in_y = labels == y
        p_y = float(in_y.double().mean())
        for a in range(k):
            expected = p_y * (F[in_y & (groups == a)].mean(0) - F[in_y].mean(0))
            np.testing.assert_allclose(nu_eo[y, a], expected.numpy(), atol=1e-12)


def test_soft_parity_gap_of_hard_predictions_is_the_demographic_parity_violation() -> None:
    k, l_ = 3, 3
    _, groups, labels = _batch(300, k, l_, seed=1)
    predictions = torch.randint(0, l_, (300,), generator=torch.Generator().manual_seed(2))
    F = torch.nn.functional.one_hot(predictions, l_).double()
    prior = _batch_prior("dp", groups, labels, k, l_)
    nu = tran.violations((tran.group_mass_sum(F, groups, prior) / len(F)).numpy(), prior)
    counts = confusion_counts(groups.numpy(), labels.numpy(), predictions.numpy(), k, l_)
    assert tran.soft_parity_gap(nu, prior) == pytest.approx(fairness_from_counts(counts).dp_violation, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    notion=st.sampled_from(["dp", "eo", "eopp"]),
    k=st.integers(1, 4),
    l_=st.integers(2, 4),
    seed=st.integers(0, 2**16),
)
def test_the_per_record_cotangents_sum_to_the_weighted_violations(notion: str, k: int, l_: int, seed: int) -> None:
    """mean_i <a_i, F_i> = sum c (.) nu_hat: the silo's per-record terms add up to the constraint term."""
    F, groups, labels = _batch(50, k, l_, seed)
    prior = _batch_prior(notion, groups, labels, k, l_)
    c = torch.randn(prior.w_shape(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    nu = tran.violations((tran.group_mass_sum(F, groups, prior, labels) / len(F)).numpy(), prior)
    term = tran.constraint_term(F, groups, c, prior, labels)
    assert float(term) == pytest.approx(float((c.numpy() * nu).sum()), abs=1e-10)


@pytest.mark.parametrize("notion", ["dp", "eo"])
def test_constraint_gradient_is_the_gradient_of_the_lagrangian_term(notion: str) -> None:
    """With c = lambda sign(nu), mean_i J_F(x_i)^T a_i is d/dtheta of sum lambda |nu(theta)| (autograd through the
    violations), and the clipped sum with a large C is n times it, by both routes (one backward, torch.func)."""
    k, l_, n = 2, 3, 40
    gen = torch.Generator().manual_seed(3)
    model = build_model("mlp", 5, l_, hidden=6, seed=1).double()
    x = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    _, groups, labels = _batch(n, k, l_, seed=4)
    prior = _batch_prior(notion, groups, labels, k, l_)
    lam = torch.rand(prior.w_shape(), generator=gen, dtype=torch.float64) + 0.1

    F = torch.softmax(model(x), dim=1)
    mass = tran.group_mass_sum(F, groups, prior, labels) / n
    blocks = prior.blocks()
    m = mass.reshape(blocks, k, l_)
    p = torch.from_numpy(prior.block_probs().copy())[:, :, None]
    nu = (m / p - m.sum(dim=1, keepdim=True)).reshape(prior.w_shape())
    np.testing.assert_allclose(nu.detach().numpy(), tran.violations(mass.detach().numpy(), prior), atol=1e-12)
    objective = (lam * nu.abs()).sum()
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(objective, list(model.parameters()))])

    c = torch.from_numpy(tran.signed_multipliers(lam.numpy(), nu.detach().numpy()))
    fast = tran.clipped_constraint_gradient_sum(model, x, groups, c, prior, 1e6, labels)
    np.testing.assert_allclose((fast / n).numpy(), expected.numpy(), atol=1e-10)

    class Wrapped(torch.nn.Module):  # not a TabularModel: the torch.func route
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.inner(z)

    slow = tran.clipped_constraint_gradient_sum(Wrapped(model), x, groups, c, prior, 1e6, labels)
    np.testing.assert_allclose(slow.numpy(), fast.numpy(), atol=1e-10)


def test_clipping_bounds_each_record_and_leaves_small_ones_alone() -> None:
    k, l_, n = 2, 2, 30
    gen = torch.Generator().manual_seed(5)
    model = build_model("logreg", 4, l_, seed=2).double()
    x = 3 * torch.randn(n, 4, generator=gen, dtype=torch.float64)
    _, groups, labels = _batch(n, k, l_, seed=6)
    prior = _batch_prior("dp", groups, labels, k, l_)
    c = torch.tensor([[5.0, -5.0], [-2.0, 2.0]], dtype=torch.float64)
    rows = torch.stack(
        [tran.clipped_constraint_gradient_sum(model, x[i : i + 1], groups[i : i + 1], c, prior, 1e6) for i in range(n)]
    )
    clip = float(rows.norm(dim=1).median())
    clipped = tran.clipped_constraint_gradient_sum(model, x, groups, c, prior, clip)
    factors = torch.clamp(clip / rows.norm(dim=1), max=1.0)
    np.testing.assert_allclose(clipped.numpy(), (factors[:, None] * rows).sum(0).numpy(), atol=1e-10)
    assert (factors < 1).any() and (factors == 1).any()
    one = tran.clipped_constraint_gradient_sum(model, x[:1], groups[:1], c, prior, clip)
    assert float(one.norm()) <= clip * (1 + 1e-12)


def test_one_records_group_mass_moves_within_the_unit_ball() -> None:
    """Replace-one geometry of the group mass: any attribute puts record i's contribution in B(0, 1)."""
    k, l_ = 4, 3
    F, groups, labels = _batch(20, k, l_, seed=7)
    prior = GroupPrior("eo", np.full((l_, k), 1.0 / k))
    base = tran.group_mass_sum(F, groups, prior, labels)
    for r in range(k):
        flipped = groups.clone()
        flipped[0] = r
        diff = tran.group_mass_sum(F, flipped, prior, labels) - base
        assert float(diff.norm()) <= math.sqrt(2) * float(F[0].norm()) + 1e-12
        single = tran.group_mass_sum(F[:1], flipped[:1], prior, labels[:1])
        assert float(single.norm()) <= 1.0


def test_dual_step_grows_the_multipliers_by_the_violation() -> None:
    lam = np.array([[0.0, 1.0], [2.0, 0.5]])
    nu = np.array([[0.1, -0.2], [-0.3, 0.0]])
    np.testing.assert_allclose(tran.dual_step(lam, nu, 0.5), lam + 0.5 * np.abs(nu))
    np.testing.assert_array_equal(tran.dual_step(lam, nu, 0.0), lam)
    np.testing.assert_allclose(tran.signed_multipliers(lam, nu), [[0.0, -1.0], [-2.0, 0.0]])
    assert tran.lagrangian(0.7, nu, lam) == pytest.approx(0.7 + 0.2 + 0.6)
    with pytest.raises(ValueError, match="dual step"):
        tran.dual_step(lam, nu, -1.0)
    with pytest.raises(ValueError, match=">= 0"):
        tran.dual_step(-lam - 1, nu, 0.1)
    with pytest.raises(ValueError, match="shape"):
        tran.violations(np.zeros((3, 2)), GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2))


# ---------------------------------------------------------------------------------------------------------------------
# Whole runs


def _run(**overrides):
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    values = {"algorithm": "tran", "num-silos": 3, "rounds": 60, "batch-size": 64, "epsilon": 2.0, "seed": 0}
    return run_job(RunConfig.parse({**values, **overrides}), progress=False)


@pytest.mark.slow
def test_a_larger_dual_step_makes_the_model_fairer_at_the_same_seed() -> None:
    plain = _run(**{"lambda": 0.0, "dual-lr": 0.0})
    fair = _run(**{"lambda": 0.0, "dual-lr": 0.5})
    assert plain["server_state"]["multipliers"] == [[0.0, 0.0], [0.0, 0.0]]
    assert min(min(row) for row in fair["server_state"]["multipliers"]) > 0.1
    assert fair["final"]["dp_violation"] < 0.7 * plain["final"]["dp_violation"]
    assert fair["final"]["error"] < 0.2  # still a useful model
    for result in (plain, fair):
        privacy = result["privacy"]
        assert 1.9 < privacy["epsilon_spent"] <= 2.0 * (1 + 1e-9)
        assert privacy["relation"].startswith("replace_one") and "constraint term" in privacy["mechanism"]


@pytest.mark.slow
def test_the_ledger_composes_both_releases_of_every_round_after_the_histogram() -> None:
    """The noise each silo used is the accountant's for (eps, delta, q, T) with TWO releases per step, composed with
    the histogram before them; accounting one release per step would understate what the silo spent."""
    from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent

    result = _run(rounds=20, epsilon=1.0)
    silo = result["privacy"]["per_silo"]["0"]
    q, rounds, delta = silo["sampling_rate"], result["federation"]["rounds"], result["privacy"]["delta"]
    one_off = calibrate_noise(0.1, delta, 1.0, 1, releases=1, relation="replace_one").noise_multiplier
    prior = [(one_off, 1.0, 1)]
    expected = calibrate_noise(1.0, delta, q, rounds, releases=2, relation="replace_one", prior=prior)
    assert silo["noise_multiplier"] == pytest.approx(expected.noise_multiplier, rel=1e-9)
    two = epsilon_spent(silo["noise_multiplier"], q, rounds, delta, releases=2, relation="replace_one", prior=prior)
    one = epsilon_spent(silo["noise_multiplier"], q, rounds, delta, releases=1, relation="replace_one", prior=prior)
    assert one < two <= 1.0 * (1 + 1e-9)
    assert silo["epsilon_spent"] == pytest.approx(two, rel=0.06)


@pytest.mark.slow
def test_the_silo_noises_both_releases_at_its_multiplier_times_their_radius() -> None:
    """h gets N(0, (sigma C)^2) and the group mass N(0, sigma^2) on the sum (before the division by q n_j); with all
    multipliers 0, h is exactly 0 (a constant needs no noise) and only the group mass is noised."""
    from silofl.client.data.federate import load_federation
    from silofl.client.rounds.tran import fairness_release

    _, silos = load_federation("synthetic", 1, seed=0)
    silo = silos[0]
    model = build_model("logreg", silo.info.num_features, silo.info.num_labels, seed=0)
    prior = GroupPrior("dp", np.array([0.5, 0.5]), num_labels=2)
    c = torch.tensor([[0.0, 1.0], [0.0, -1.0]])
    rate, clip, sigma = 0.05, 0.3, 2.0
    expected = rate * len(silo.train)

    def release(multiplier: float, seed: int, c: torch.Tensor = c):
        return fairness_release(
            model,
            silo,
            c=c,
            prior=prior,
            rate=rate,
            clip=clip,
            noise_multiplier=multiplier,
            rng=np.random.default_rng(seed),
            generator=torch.Generator().manual_seed(seed),
        )

    h_noise, mass_noise = [], []
    for seed in range(200):
        (h, mass), (h0, mass0) = release(sigma, seed), release(0.0, seed)
        h_noise.append((h - h0) * expected)
        mass_noise.append((mass - mass0) * expected)
    assert float(torch.stack(h_noise).std()) == pytest.approx(sigma * clip, rel=0.05)
    assert float(torch.stack(mass_noise).std()) == pytest.approx(sigma * 1.0, rel=0.1)
    h, mass = release(sigma, 0, c=torch.zeros(2, 2))
    assert float(h.abs().max()) == 0.0 and float((mass - release(0.0, 0)[1]).abs().max()) > 0


@pytest.mark.slow
def test_dp_fermi_and_fermi_are_steffle_on_one_silo() -> None:
    """The issue's DP-FERMI (steffle, one silo) and FERMI (the same, epsilon inf) configurations run."""
    for epsilon in (1.0, "inf"):
        result = _run(algorithm="steffle", **{"num-silos": 1, "rounds": 5, "epsilon": epsilon, "lambda": 1.0})
        assert result["status"]["completed"] and len(result["federation"]["silos"]) == 1


@pytest.mark.parametrize("fairness", ["dp", "eo", "eopp"])
def test_replies_differ_only_in_noised_fields_when_one_protected_attribute_changes(tmp_path, fairness: str) -> None:
    """Two silos whose data differ only in one record's protected attribute, sent the very same messages with the
    same seeds, send replies that differ only in the noised releases (counts, constraint gradient, group mass).
    Batch size >= n_j makes every record sampled every round, so the flipped record does reach those releases."""
    from flwr.app import Context, RecordDict

    from silofl.client.app import app as client_app
    from silofl.client.data.federate import load_federation
    from silofl.client.data.silo_store import load_silo, save_silo
    from silofl.client.data.tabular import SensitiveDivision, Split
    from silofl.protocols import messages as msg
    from silofl.protocols.config import RunConfig
    from silofl.server.app import make_server_app
    from silofl.server.inprocess_grid import InProcessGrid, deliver

    _, silos = load_federation("synthetic", 2, seed=0)
    folders = []
    for silo in silos:
        folders.append(tmp_path / f"silo_{silo.silo_id}")
        save_silo(silo, folders[-1])
    twin = load_silo(folders[0])
    groups = twin.train.sensitive.groups.copy()
    i = int(np.flatnonzero(twin.train.nonsensitive.labels == twin.info.num_labels - 1)[0])  # active for eopp too
    groups[i] = (groups[i] + 1) % twin.info.num_groups
    save_silo(
        dataclasses.replace(twin, train=Split(twin.train.nonsensitive, SensitiveDivision(groups))), tmp_path / "t"
    )

    base = {"deterministic-noise": True}
    twins = {
        p: Context(
            run_id=1, node_id=1000 + p, node_config={"data-path": str(f), **base}, state=RecordDict(), run_config={}
        )
        for p, f in enumerate([tmp_path / "t", folders[1]])
    }
    pairs = []

    def both(message, context):
        twin_message = copy_message(message)
        reply = deliver(client_app, message, context)
        pairs.append((reply, deliver(client_app, twin_message, twins[int(context.node_config["partition-id"])])))
        if reply.has_error():
            raise RuntimeError(reply.error.reason)
        return reply

    config = RunConfig.parse(
        {
            "algorithm": "tran",
            "num-silos": 2,
            "rounds": 3,
            "epsilon": 2.0,
            "batch-size": 100_000,
            "lambda": 1.0,
            "fairness": fairness,
        }
    )
    grid = InProcessGrid(both, 2, node_configs=[{"data-path": str(f), **base} for f in folders])
    make_server_app(config, progress=False)(
        grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    )
    differing = set()
    for reply, other in pairs:
        assert not other.has_error(), other.error.reason
        for record_name, record in reply.content.items():
            for key, value in record.items():
                a = value.numpy() if hasattr(value, "numpy") else value
                b = other.content[record_name][key]
                b = b.numpy() if hasattr(b, "numpy") else b
                if not np.array_equal(np.asarray(a), np.asarray(b)):
                    differing.add((reply.metadata.message_type, record_name, key))
    train_fair = {key for kind, record, key in differing if kind == msg.TRAIN and record == msg.FAIR_UPDATE}
    assert "mass" in train_fair and len(train_fair) > 1, "the flipped attribute did not reach both releases"
    assert (msg.GROUPS, msg.COUNTS, "counts") in differing
    for kind, record_name, key in differing:
        assert record_name in (msg.COUNTS, msg.FAIR_UPDATE), (kind, record_name, key)


def test_shuffled_epochs_from_the_command_line(tmp_path, capsys) -> None:
    """`silofl run tran --sampling shuffle --epsilon 1 --rounds 13`, progress bar on: the ledgers' epsilon, the
    accountant's for the histogram and 3 unsampled releases (`tests.silo_driver.shuffled_cli_run`)."""
    from tests.silo_driver import shuffled_cli_run

    result = shuffled_cli_run("tran", tmp_path / "run", capsys)
    assert "constraint term" in result["privacy"]["mechanism"]


def test_shuffled_epochs_put_every_record_in_one_sensitive_batch_per_epoch(tmp_path) -> None:
    """sampling shuffle, read from a silo's real replies: record i's attribute changes exactly one round's release
    (h and the group mass) per epoch, nothing else; the rounds of an epoch cover the 14 records once (5, 5, 4)."""
    from silofl.client.data.federate import load_federation
    from silofl.client.data.silo_store import save_silo
    from tests.silo_driver import sensitive_rounds_of_each_record

    _, silos = load_federation("synthetic", 2, seed=0)
    save_silo(dataclasses.replace(silos[1], train=silos[1].train.subset(np.arange(14))), tmp_path / "silo")
    touched = sensitive_rounds_of_each_record(
        "tran", tmp_path / "silo", tmp_path, rounds=6, sampling="shuffle", batch_size=5, epsilon=1.0, delta=1e-6
    )
    assert all([(t - 1) // 3 for t in rounds] == [0, 1] for rounds in touched.values())
    for first in (1, 4):
        batches = [{i for i, rounds in touched.items() if t in rounds} for t in range(first, first + 3)]
        assert [len(b) for b in batches] == [5, 5, 4] and set().union(*batches) == set(range(14))
