"""FedFDP (spec ``fedfdp.md``): the fair clip, the step (lambda = 0 is DP-FedSGD's), the loss release, the
accounting (both releases composed; the paper's gradient-only figures), the real silo's messages, and a run through
the real entry point."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from silofl.client import noisy_gradient, randomness
from silofl.client.algorithms import fedfdp as algo
from silofl.client.batches import poisson_sample
from silofl.client.data.tabular import NonSensitiveDivision
from silofl.client.gradients import (
    clipped_gradient_sum,
    flatten_per_sample,
    per_sample_gradients,
    per_sample_losses,
    weighted_clipped_gradient_sum,
)
from silofl.client.rounds import fedfdp as fedfdp_round
from silofl.client.silo_data import load_silo_data
from silofl.protocols import fedfdp
from silofl.protocols import messages as msg
from silofl.protocols.models import build_model, get_parameters, set_parameters
from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent
from silofl.protocols.privacy.ledger import PrivacyLedger
from silofl.server.cli import main
from tests.factories import deliver_to_silo, setup_silo, silo_context

SPEC = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0)

pytestmark = pytest.mark.usefixtures("task_identity")


def _data(n: int = 300, d: int = 6, seed: int = 0) -> NonSensitiveDivision:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
    return NonSensitiveDivision(features=x, labels=y)


def _model(kind: str = "logreg", d: int = 6) -> torch.nn.Module:
    model = build_model(kind, d, 2, hidden=8, seed=3)
    with torch.no_grad():  # away from the origin, so that losses (and fair weights) differ between records
        for p in model.parameters():
            p.mul_(4.0)
    return model


# -- the step ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_lambda_zero_gives_dp_fedsgds_step_with_the_same_seed(kind: str) -> None:
    data, model = _data(), _model(kind)
    args = {"sampling_rate": 0.2, "batch_size": 60, "clip": 0.5, "noise_multiplier": 1.3}
    ours = algo.fair_noisy_gradient(
        model,
        data,
        global_loss=0.7,
        lam=0.0,
        sample_rng=np.random.default_rng(5),
        noise_generator=torch.Generator().manual_seed(9),
        **args,
    )
    theirs = noisy_gradient.noisy_gradient(
        model, data, sample_rng=np.random.default_rng(5), noise_generator=torch.Generator().manual_seed(9), **args
    )
    assert torch.equal(ours, theirs)
    # the fair route itself, with every weight 1, is DP-FedSGD's clipped sum (same bits for logistic regression)
    x, y = torch.from_numpy(data.features[:50]), torch.from_numpy(data.labels[:50])
    fair = weighted_clipped_gradient_sum(model, x, y, torch.ones(50), 0.5)
    plain = clipped_gradient_sum(model, x, y, 0.5)
    if kind == "logreg":
        assert torch.equal(fair, plain)
    else:
        torch.testing.assert_close(fair, plain, rtol=1e-6, atol=1e-7)


def test_lambda_changes_the_step() -> None:
    data, model = _data(), _model()
    args = {"sampling_rate": 0.2, "batch_size": 60, "clip": 0.5, "noise_multiplier": 0.0, "global_loss": 0.3}
    steps = [
        algo.fair_noisy_gradient(
            model,
            data,
            lam=lam,
            sample_rng=np.random.default_rng(5),
            noise_generator=torch.Generator().manual_seed(9),
            **args,
        )
        for lam in (0.0, 1.0)
    ]
    assert not torch.allclose(steps[0], steps[1])


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("lam", [0.0, 0.1, 2.0, 50.0])
def test_fair_clip_factors_are_nonnegative_and_bound_every_term(kind: str, lam: float) -> None:
    data, model, clip = _data(n=80), _model(kind), 0.3
    x, y = torch.from_numpy(data.features), torch.from_numpy(data.labels)
    losses = per_sample_losses(model, x, y)
    global_loss = float(losses.mean())  # half the records below it: with lambda 50, 1 + lambda Delta < 0 for many
    weights = fedfdp.fair_weights(losses, global_loss, lam)
    g = flatten_per_sample(per_sample_gradients(model, x, y))
    norms = torch.linalg.vector_norm(g, dim=1)
    c = fedfdp.fair_clip_factors(weights, norms, clip)
    assert bool((c >= 0).all())
    assert bool((torch.linalg.vector_norm(c.unsqueeze(1) * g, dim=1) <= clip * (1 + 1e-6)).all())
    if lam == 50.0:
        assert bool((c == 0).any())  # the clamp: the paper's min would go negative there
    # Eq. 13 as the silo computes it: the clipped sum of the weighted per-record gradients
    expected = (c.unsqueeze(1) * g).sum(0)
    torch.testing.assert_close(
        weighted_clipped_gradient_sum(model, x, y, weights, clip), expected, rtol=1e-5, atol=1e-6
    )


def test_fair_weights_follow_eqs_10_11() -> None:
    losses = torch.tensor([0.1, 0.5, 2.0])
    torch.testing.assert_close(fedfdp.fair_weights(losses, 0.5, 1.0), torch.tensor([0.6, 1.0, 2.5]))
    torch.testing.assert_close(fedfdp.fair_weights(losses, 0.5, 3.0), torch.tensor([0.0, 1.0, 5.5]))
    assert torch.equal(fedfdp.fair_weights(losses, 0.5, 0.0), torch.ones(3))


def test_server_average_and_loss_bound() -> None:
    avg = fedfdp.server_average([np.array([1.0]), np.array([4.0])], [100, 300])
    assert avg == pytest.approx([3.25])
    assert fedfdp.next_loss_bound(-0.4) == fedfdp.LOSS_BOUND_FLOOR
    assert fedfdp.next_loss_bound(0.8) == 0.8
    assert float(fedfdp.clipped_loss_sum(torch.tensor([-1.0, 0.5, 9.0]), 2.0)) == pytest.approx(2.5)


# -- the loss release -------------------------------------------------------------------------------------------------


def _release(data: NonSensitiveDivision, model, *, sigma: float, seed: int, bound: float = 0.8) -> float:
    return algo.loss_release(
        model,
        data,
        bound=bound,
        sampling_rate=0.5,
        batch_size=100,
        noise_multiplier=sigma,
        sample_rng=np.random.default_rng(seed),
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )


def test_one_changed_record_moves_the_loss_release_by_at_most_its_sensitivity() -> None:
    data, model, bound, m = _data(), _model(), 0.8, 100
    changed = NonSensitiveDivision(features=data.features.copy(), labels=data.labels.copy())
    changed.features[7] = 50.0  # an extreme record: a huge loss (or none), clipped into [0, C_l]
    changed.labels[7] = 1 - changed.labels[7]
    moved = []
    for seed in range(20):
        a = _release(data, model, sigma=2.0, seed=seed, bound=bound)
        b = _release(changed, model, sigma=2.0, seed=seed, bound=bound)
        assert abs(a - b) <= bound / m + 1e-6  # same sample, same noise draw: at most C_l / m apart
        moved.append(abs(a - b))
    assert max(moved) > 0.5 * bound / m  # the record was in some samples, and its clipped loss moved the release
    # with noise the release is not the exact value; its spread is sigma_l C_l / m
    exact = _release(data, model, sigma=0.0, seed=0, bound=bound)
    assert not np.isclose(_release(data, model, sigma=2.0, seed=0, bound=bound), exact)
    spread = np.std(
        [
            algo.loss_release(
                model,
                data,
                bound=bound,
                sampling_rate=0.5,
                batch_size=m,
                noise_multiplier=2.0,
                sample_rng=np.random.default_rng(0),
                noise_generator=torch.Generator().manual_seed(s),
            )
            for s in range(400)
        ]
    )
    assert spread == pytest.approx(2.0 * bound / m, rel=0.15)


def test_a_non_private_release_is_the_unclipped_mean_loss() -> None:
    """No noise, no DP: the loss is not clipped at C_l (spec's non-private ablation), so F_t tracks the real loss."""
    data, model, m = _data(), _model(), 100
    data.features[:5] = 50.0  # records with losses far above the bound
    data.labels[:5] = 1 - data.labels[:5]
    idx = poisson_sample(len(data.labels), 0.5, np.random.default_rng(3))
    losses = per_sample_losses(model, torch.from_numpy(data.features[idx]), torch.from_numpy(data.labels[idx]))
    assert float(losses.max()) > 1.0
    got = _release(data, model, sigma=0.0, seed=3, bound=0.01)
    assert got == pytest.approx(float(losses.double().sum()) / m)
    assert got > 0.01 * len(idx) / m  # more than any clipped release could give


# -- accounting -------------------------------------------------------------------------------------------------------


def test_paper_gradient_only_accountant_reproduces_the_specs_T() -> None:
    got = [fedfdp.paper_max_steps(2.0, 1e-5, 0.05, sigma) for sigma in (1.0, 1.5, 2.0, 2.5, 3.0)]
    assert got == [6, 114, 267, 463, 702]
    assert fedfdp.paper_max_steps(3.52, 1e-5, 0.05, 2.0) == 776


@pytest.mark.parametrize("accountant", ["rdp", "pld", "best"])
def test_composing_the_loss_release_costs_more_than_the_gradient_alone(accountant: str) -> None:
    for sigma, steps in ((2.0, 776), (1.0, 50)):
        alone = epsilon_spent(sigma, 0.05, steps, 1e-5, accountant=accountant)
        both = epsilon_spent(sigma, 0.05, steps, 1e-5, accountant=accountant, companion=2.5 * sigma)
        assert both > alone
    # the spec's check at the paper's setting: PLD 3.45 with both releases against 3.22 with the gradient alone
    assert epsilon_spent(2.0, 0.05, 776, 1e-5, accountant="pld") == pytest.approx(3.22, abs=0.01)
    assert epsilon_spent(2.0, 0.05, 776, 1e-5, accountant="pld", companion=5.0) == pytest.approx(3.45, abs=0.01)


def test_eps_352_allows_688_rounds_under_rdp_with_both_releases() -> None:
    def eps(steps: int) -> float:
        return epsilon_spent(2.0, 0.05, steps, 1e-5, accountant="rdp", companion=5.0)

    assert eps(688) <= 3.52 < eps(689)


@pytest.mark.slow
def test_calibration_with_the_loss_release_and_the_ledger_admit_exactly_T_rounds() -> None:
    q, steps, delta = 0.05, 40, 1e-5
    cal = calibrate_noise(2.0, delta, q, steps, companion_ratio=fedfdp.LOSS_NOISE_RATIO)
    alone = calibrate_noise(2.0, delta, q, steps)
    assert cal.epsilon <= 2.0 and cal.noise_multiplier > alone.noise_multiplier
    sigma = cal.noise_multiplier
    ledger = PrivacyLedger(epsilon_budget=2.0, delta=delta, accountant="best")
    for t in range(1, steps + 1):
        ledger.charge(round=t, noise_multiplier=sigma, sampling_rate=q, companion=2.5 * sigma)
    assert len(ledger.entries) == 1  # the rounds merge: one entry with its companion
    spent = ledger.spent()
    assert spent <= 2.0 * (1 + 1e-9)
    assert spent == pytest.approx(epsilon_spent(sigma, q, steps, delta, companion=2.5 * sigma), rel=1e-12)
    with pytest.raises(RuntimeError, match="refuses"):
        ledger.charge(round=steps + 1, noise_multiplier=sigma, sampling_rate=q, companion=2.5 * sigma)
    again = PrivacyLedger.from_dict(ConfigRecord(ledger.to_dict()))
    assert again.entries == ledger.entries and again.spent() == spent
    plain = PrivacyLedger(epsilon_budget=2.0, delta=delta)
    plain.charge(round=1, noise_multiplier=sigma, sampling_rate=q)
    assert "entry_companion" not in plain.to_dict()  # other algorithms' ledgers are unchanged


# -- the real silo's messages -----------------------------------------------------------------------------------------


def _train(context: Context, info: msg.SiloInfo, server_round: int, loss=None, **overrides) -> Message:
    model = build_model("logreg", info.num_features, info.num_labels)
    values = {
        "server_round": server_round,
        "total_rounds": 10,
        "batch_size": 64,
        "lr": 0.25,
        "epsilon": 2.0,
        "delta": 1e-6,
        "clip": 1.0,
        "lambda": 0.5,
    } | overrides
    instruction = msg.TrainInstruction.for_algorithm("fedfdp", **values)
    loss = np.array([0.6], dtype=np.float32) if loss is None else loss
    content = RecordDict(
        {
            msg.MODEL: msg.arrays_record(get_parameters(model)),
            msg.GLOBAL_LOSS: msg.arrays_record({"value": loss}),
            msg.CONFIG: instruction.to_config_record(),
        }
    )
    return deliver_to_silo(context, content, msg.TRAIN)


@pytest.mark.slow
def test_reply_holds_the_local_model_the_noised_loss_and_a_public_report() -> None:
    context = silo_context()
    info = setup_silo(context)
    reply = _train(context, info, 1)
    assert not reply.has_error(), reply.error
    assert set(reply.content.keys()) == {msg.UPDATE, msg.LOSS_RELEASE, msg.REPORT}
    report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
    assert set(report.model_dump()) == set(msg.TrainReport.model_fields)
    assert 0 < report.epsilon_spent <= 2.0 and report.noise_multiplier > 0
    released = float(reply.content[msg.LOSS_RELEASE]["value"].numpy()[0])
    # the exact (un-noised) value of the same release: same w_i (the reply's), same sample B', bound C_l0
    silo = load_silo_data(context, SPEC)
    model = build_model("logreg", info.num_features, info.num_labels)
    set_parameters(model, {k: v.numpy() for k, v in reply.content[msg.UPDATE].items()})
    keys = {"seed": 0, "silo_id": silo.silo_id, "server_round": 1}
    exact = algo.loss_release(
        model,
        silo.train.nonsensitive,
        bound=fedfdp.LOSS_BOUND_INIT,
        sampling_rate=report.sampling_rate,
        batch_size=64,
        noise_multiplier=0.0,
        sample_rng=randomness.numpy_rng(context, stream=randomness.LOSS_SAMPLING, **keys),
        noise_generator=torch.Generator(),
    )
    assert released != pytest.approx(exact, abs=1e-6)
    # the noise is the loss release's: std sigma_l C_l / m; within a few of those of the exact value
    std = fedfdp.LOSS_NOISE_RATIO * report.noise_multiplier * fedfdp.LOSS_BOUND_INIT / 64
    assert abs(released - exact) < 6 * std
    # the next round's bound is the silo's own release, floored
    assert float(context.state[fedfdp_round.BOUND_KEY]["next"]) == pytest.approx(max(1e-3, released), rel=1e-6)
    # and the round is charged with both releases: the ledger's entry has the loss release as its companion
    ledger = PrivacyLedger.from_dict(dict(context.state["silofl.ledger"]))
    assert ledger.entries[0].companion == pytest.approx(fedfdp.LOSS_NOISE_RATIO * report.noise_multiplier)


def test_a_fixed_loss_bound_clips_and_scales_the_noise_of_every_round() -> None:
    """--loss-bound B > 0: C_l = B in every round (not the silo's last release), and the release is clipped at B."""
    context = silo_context()
    info = setup_silo(context)
    silo = load_silo_data(context, SPEC)
    for server_round in (1, 2):
        reply = _train(context, info, server_round, loss_bound=0.3)
        assert not reply.has_error(), reply.error
        report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
        released = float(reply.content[msg.LOSS_RELEASE]["value"].numpy()[0])
        model = build_model("logreg", info.num_features, info.num_labels)
        set_parameters(model, {k: v.numpy() for k, v in reply.content[msg.UPDATE].items()})
        keys = {"seed": 0, "silo_id": silo.silo_id, "server_round": server_round}
        idx = poisson_sample(
            len(silo.train.nonsensitive.labels),
            report.sampling_rate,
            randomness.numpy_rng(context, stream=randomness.LOSS_SAMPLING, **keys),
        )
        data = silo.train.nonsensitive
        losses = per_sample_losses(model, torch.from_numpy(data.features[idx]), torch.from_numpy(data.labels[idx]))
        clipped = float(fedfdp.clipped_loss_sum(losses, 0.3)) / 64
        unclipped = float(losses.double().sum()) / 64
        std = fedfdp.LOSS_NOISE_RATIO * report.noise_multiplier * 0.3 / 64
        assert abs(released - clipped) < 6 * std
        assert abs(unclipped - clipped) > 12 * std  # the clip at 0.3 is visible above the noise
    assert fedfdp_round.BOUND_KEY not in context.state  # no adaptive state: the bound is the configured one


@pytest.mark.parametrize(
    ("loss", "needle"),
    [
        (np.array([np.nan], dtype=np.float32), "NaN"),
        (np.array([0.5, 0.5], dtype=np.float32), "shape"),
        (np.array([0.5], dtype=np.float64), "dtype"),
    ],
)
def test_a_bad_global_loss_is_refused_before_any_charge(loss: np.ndarray, needle: str) -> None:
    context = silo_context()
    info = setup_silo(context)
    reply = _train(context, info, 1, loss=loss)
    assert reply.has_error() and needle in reply.error.reason
    assert "silofl.ledger" not in context.state


def test_the_instruction_is_validated() -> None:
    with pytest.raises(ValueError, match="lambda"):
        msg.TrainInstruction.for_algorithm(
            "fedfdp", server_round=1, total_rounds=2, batch_size=8, lr=0.1, clip=1.0, **{"lambda": -1.0}
        )


# -- through the real entry point ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_through_the_cli_reports_epsilon_within_the_target(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main(
        ["run", "fedfdp", "--epsilon", "2", "--rounds", "4", "--batch-size", "64", "--no-progress", "--out", str(out)]
    )
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    privacy = result["privacy"]
    assert result["config"]["algorithm"] == "fedfdp" and result["federation"]["rounds"] == 4
    assert 0 < privacy["epsilon_spent"] <= 2.0
    assert privacy["epsilon_gradient_only"] < privacy["epsilon_spent"]
    assert math.isfinite(privacy["epsilon_paper_gradient_only"])
    assert "s only" in privacy["caveat"]
    assert math.isfinite(result["server_state"]["global_loss"])
    assert result["final"]["accuracy"] is not None
    assert "result.json" in capsys.readouterr().out


def test_help_lists_only_fedfdps_options(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "fedfdp", "--help"])
    text = capsys.readouterr().out
    for flag in ("--lambda", "--clip", "--epsilon", "--lr", "--batch-size"):
        assert flag in text
    for flag in ("--w-radius", "--rho", "--views", "--dual-lr", "--lr-decay"):
        assert flag not in text
