"""SteFFLe's server strategy: the SGDA step, the projection, and end-to-end behaviour on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from silofl.protocols import messages as msg
from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job
from silofl.strategies.federation import Federation, SiloEntry
from silofl.strategies.lr_schedule import StepSchedule
from silofl.strategies.steffle import SteffleStrategy
from tests.factories import silo_info

SPEC = [("head.weight", (1, 2)), ("head.bias", (1,))]


pytestmark = pytest.mark.usefixtures("task_identity")


def _strategy(lam: float, radius: float = 10.0) -> SteffleStrategy:
    silos = []
    for i, n in enumerate((100, 300)):
        silos.append(SiloEntry(node_id=10 + i, info=silo_info(i, n, schema_hash="h")))
    instruction = msg.TrainInstruction.for_algorithm(
        "steffle", server_round=1, total_rounds=5, batch_size=8, lr=0.5, lam=lam
    )
    return SteffleStrategy(
        Federation(silos=tuple(silos)),
        SPEC,
        schedule=StepSchedule(0.5),
        prior=np.array([0.4, 0.6]),
        w_shape=(2, 2),
        w_radius=radius,
        w_lr=0.1,
        instruction=instruction,
        eval_instruction=msg.EvaluateInstruction(server_round=0),
    )


def _replies(strategy: SteffleStrategy, g: float, h: float, hw: float) -> list[Message]:
    model = {"head.weight": np.ones((1, 2), np.float32), "head.bias": np.ones(1, np.float32)}
    instrs = list(strategy.configure_train(1, msg.arrays_record(model), ConfigRecord(), None))
    replies = []
    for i, m in enumerate(instrs):
        assert set(m.content.keys()) == {msg.MODEL, msg.FAIRNESS, msg.CONFIG}
        n = strategy.federation.silos[i].info.n_train  # the count the silo declared in the setup round
        report = msg.TrainReport(
            silo_id=i, server_round=1, num_examples=n, epsilon_spent=0.1, noise_multiplier=1.0, sampling_rate=0.1
        )
        content = {
            msg.UPDATE: msg.arrays_record({k: np.full(v.shape, g, np.float32) for k, v in model.items()}),
            msg.REPORT: report.to_metric_record(),
        }
        if strategy.lam > 0:
            fair = {k: np.full(v.shape, h, np.float32) for k, v in model.items()} | {
                "w": np.full((2, 2), hw, np.float32)
            }
            content[msg.FAIR_UPDATE] = msg.arrays_record(fair)
        replies.append(Message(RecordDict(content), reply_to=m))
    return replies


def test_sgda_step_descends_on_theta_and_ascends_on_w() -> None:
    strategy = _strategy(lam=2.0)
    arrays, _ = strategy.aggregate_train(1, _replies(strategy, g=1.0, h=0.5, hw=3.0))
    # theta = 1 - 0.5 * (1 + 2 * 0.5) = 0
    np.testing.assert_allclose(arrays["head.weight"].numpy(), 0.0, atol=1e-7)
    np.testing.assert_allclose(strategy.w, 0.1 * 2.0 * 3.0)  # W = 0 + w_lr * lambda * h_W


def test_w_is_projected_onto_the_ball() -> None:
    strategy = _strategy(lam=1.0, radius=0.5)
    strategy.aggregate_train(1, _replies(strategy, g=0.0, h=0.0, hw=100.0))
    assert np.linalg.norm(strategy.w) == pytest.approx(0.5)


def test_lambda_zero_expects_no_fairness_reply() -> None:
    strategy = _strategy(lam=0.0)
    arrays, _ = strategy.aggregate_train(1, _replies(strategy, g=1.0, h=0.0, hw=0.0))
    np.testing.assert_allclose(arrays["head.bias"].numpy(), 0.5)
    assert not strategy.w.any()


@pytest.mark.slow
def test_lambda_lowers_the_demographic_parity_violation_on_three_silos() -> None:
    results = {}
    for lam in (0.0, 1.0):
        config = RunConfig.parse(
            {
                "algorithm": "steffle",
                "num-silos": 3,
                "epochs": 10,
                "batch-size": 64,
                "lr": 0.5,
                "epsilon": 1.0,
                "lambda": lam,
            }
        )
        results[lam] = run_job(config, progress=False)
    assert results[1.0]["final"]["dp_violation"] < 0.85 * results[0.0]["final"]["dp_violation"]
    assert results[1.0]["final"]["accuracy"] > results[0.0]["final"]["accuracy"] - 0.05
    for result in results.values():
        assert 0 < result["privacy"]["epsilon_spent"] <= 1.0


@pytest.mark.slow
def test_one_silo_is_dp_fermi() -> None:
    config = RunConfig.parse(
        {"algorithm": "steffle", "num-silos": 1, "rounds": 20, "batch-size": 64, "epsilon": 3.0, "fairness": "eo"}
    )
    result = run_job(config, progress=False)
    assert len(result["federation"]["silos"]) == 1
    assert np.asarray(result["server_state"]["w"]).shape == (2, 2, 2)
    assert 0 < result["privacy"]["epsilon_spent"] <= 3.0


@pytest.mark.slow
@pytest.mark.parametrize(("fairness", "model"), [("dp", "mlp"), ("eo", "logreg"), ("eopp", "logreg")])
def test_multiclass_joint_multivalued_attributes_from_a_csv(tmp_path, fairness: str, model: str) -> None:
    """Three labels, two sensitive columns (3 x 2 = 6 joint groups), any notion, logreg or MLP, end to end."""
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 1800
    race = rng.choice(["a", "b", "c"], n)
    sex = rng.choice(["f", "m"], n)
    x1 = rng.normal(size=n) + (race == "a")
    x2 = rng.normal(size=n)
    label = np.digitize(x1 + 0.5 * x2 + 0.3 * (sex == "m"), [-0.3, 0.8])
    path = tmp_path / "people.csv"
    pd.DataFrame(
        {"x1": x1, "x2": x2, "job": rng.choice(["u", "v"], n), "race": race, "sex": sex, "outcome": label}
    ).to_csv(path, index=False)
    config = RunConfig.parse(
        {
            "algorithm": "steffle",
            "dataset": str(path),
            "target": "outcome",
            "sensitive": "race,sex",
            "num-silos": 3,
            "rounds": 30,
            "batch-size": 64,
            "epsilon": 3.0,
            "fairness": fairness,
            "model": model,
            "lambda": 1.0,
        }
    )
    result = run_job(config, progress=False)
    fed = result["federation"]
    assert fed["num_labels"] == 3 and fed["num_groups"] == 6
    expected_w = (3, 6, 3) if fairness == "eo" else (6, 3)
    assert np.asarray(result["server_state"]["w"]).shape == expected_w
    assert 0 < result["privacy"]["epsilon_spent"] <= 3.0
    assert 0.0 <= result["final"]["accuracy"] <= 1.0
