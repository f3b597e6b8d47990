"""DP-mu2-FL through the real ServerApp and ClientApp equals the single-machine reference, untrusted and trusted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from silofl.client import randomness
from silofl.client.data.federate import load_federation
from silofl.client.rounds.mu2fl import _order
from silofl.protocols import mu2fl
from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job


def _streams(seed: int, silos: int):
    _, parts = load_federation("digits", silos, seed=seed)
    xs, ys = [], []
    for silo in parts:
        ctx = Context(
            run_id=1, node_id=1, node_config={"partition-id": silo.silo_id}, state=RecordDict(), run_config={}
        )
        order_seed = randomness.round_seed(
            ctx, seed=seed, silo_id=silo.silo_id, server_round=0, stream=randomness.SHUFFLE
        )
        order = _order(order_seed, len(silo.train))
        xs.append(silo.train.nonsensitive.features[order].astype(np.float64))
        ys.append(silo.train.nonsensitive.labels[order])
    return xs, ys, parts[0].info.num_labels


@pytest.mark.parametrize(("trust", "rho"), [("untrusted", 4.0), ("trusted", 8.0), ("untrusted", math.inf)])
def test_flower_run_matches_the_reference_implementation(trust: str, rho: float) -> None:
    seed, silos, rounds, batch = 3, 2, 25, 2
    values = {
        "algorithm": "mu2fl",
        "dataset": "digits",
        "num-silos": silos,
        "rounds": rounds,
        "batch-size": batch,
        "trust": trust,
        "delta": 1e-5,
        "seed": seed,
        "eval-every": rounds,
    }
    if math.isfinite(rho):
        values["rho"] = rho
    result = run_job(RunConfig.parse(values), progress=False)
    xs, ys, classes = _streams(seed, silos)
    reference = mu2fl.run_mu2_reference(
        xs, ys, silos, rounds, rho, trust == "trusted", seed, num_classes=classes, batch_size=batch, delta=1e-5
    )
    ours = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in result["model"].values()])
    np.testing.assert_allclose(ours, reference.output, rtol=0, atol=1e-12)
    if math.isfinite(rho):
        assert result["server_state"]["sigma"] == pytest.approx(reference.calibration.sigma)


def test_untrusted_silos_spend_at_most_the_closed_form_epsilon() -> None:
    config = RunConfig.parse(
        {
            "algorithm": "mu2fl",
            "dataset": "digits",
            "num-silos": 2,
            "epochs": 1.0,
            "batch-size": 4,
            "rho": 4.0,
            "delta": 1e-5,
        }
    )
    result = run_job(config, progress=False)
    closed = mu2fl.rho_to_epsilon(4.0, 1e-5)
    assert 0 < result["privacy"]["epsilon_spent"] <= closed
    assert result["federation"]["rounds"] == min(s["n_train"] for s in result["federation"]["silos"]) // 4


def test_rho_and_epsilon_are_exclusive_and_model_must_be_logreg() -> None:
    from silofl.protocols.config import ConfigError

    with pytest.raises(ConfigError, match="either 'rho' or 'epsilon'"):
        RunConfig.parse({"algorithm": "mu2fl", "rounds": 3, "rho": 4.0, "epsilon": 1.0})
    with pytest.raises(ConfigError, match=r"key 'model' = 'mlp'.*allowed: one of 'logreg'"):
        RunConfig.parse({"algorithm": "mu2fl", "rounds": 3, "model": "mlp"})


@pytest.mark.slow
def test_noisy_sgd_baseline_runs_with_one_charge_per_record_and_is_worse_than_mu2() -> None:
    common = {
        "dataset": "digits",
        "num-silos": 2,
        "epochs": 1.0,
        "batch-size": 1,
        "rho": 1.0,
        "delta": 1e-5,
        "eval-every": 1000,
    }
    sgd = run_job(RunConfig.parse({"algorithm": "noisy-sgd", **common}), progress=False)
    mu = run_job(RunConfig.parse({"algorithm": "mu2fl", **common}), progress=False)
    # parallel composition: one Gaussian release per record, so the ledger's epsilon is one mechanism's
    assert 0 < sgd["privacy"]["epsilon_spent"] <= mu2fl.rho_to_epsilon(1.0, 1e-5)
    assert sgd["final"]["loss"] > mu["final"]["loss"]


def test_a_silo_refuses_a_replayed_or_skipped_round() -> None:
    from flwr.app import Message

    from silofl.client.app import app
    from silofl.protocols import messages as msg
    from silofl.protocols.models import build_model, parameter_spec
    from silofl.server.inprocess_grid import deliver

    ctx = Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(), run_config={}
    )
    spec = msg.DataSpec(dataset="digits", num_silos=2)
    setup = Message(RecordDict({msg.CONFIG: spec.to_config_record()}), 5, msg.SETUP, group_id="s")
    assert not deliver(app, setup, ctx).has_error()
    zeros = {n: np.zeros(s) for n, s in parameter_spec(build_model("logreg", 64, 10))}

    def train(t: int):
        instr = msg.TrainInstruction.for_algorithm(
            "noisy-sgd", server_round=t, total_rounds=10, batch_size=1, rho=2.0, delta=1e-5
        )
        content = RecordDict(
            {
                msg.MODEL: msg.arrays_record(zeros),
                msg.PREVIOUS: msg.arrays_record(zeros),
                msg.CONFIG: instr.to_config_record(),
            }
        )
        return deliver(app, Message(content, 5, msg.TRAIN, group_id=str(t)), ctx)

    assert not train(1).has_error()
    assert "once each, in order" in train(1).error.reason
    assert "once each, in order" in train(3).error.reason
    assert not train(2).has_error()


def test_trusted_run_reports_the_servers_privacy() -> None:
    config = RunConfig.parse(
        {
            "algorithm": "mu2fl",
            "dataset": "digits",
            "num-silos": 2,
            "rounds": 20,
            "batch-size": 2,
            "rho": 4.0,
            "trust": "trusted",
            "delta": 1e-5,
        }
    )
    privacy = run_job(config, progress=False)["privacy"]
    assert privacy["rho"] == 4.0 and "trusted server" in privacy["trust"]
    assert (
        0 < privacy["epsilon_spent"] <= privacy["epsilon_closed_form"] == pytest.approx(mu2fl.rho_to_epsilon(4, 1e-5))
    )
    assert all(s["epsilon_spent"] == "inf" for s in privacy["per_silo"].values())  # the silos' messages: not private
