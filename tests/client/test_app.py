"""The real ClientApp, driven message by message: setup, private training, ledger refusal, bad messages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from silofl.protocols import messages as msg
from silofl.protocols.models import build_model, get_parameters
from tests.factories import deliver_to_silo, setup_silo, silo_context

SPEC = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0)


pytestmark = pytest.mark.usefixtures("task_identity")


def _train(context: Context, info: msg.SiloInfo, server_round: int, **overrides) -> Message:
    model = build_model("logreg", info.num_features, info.num_labels)
    values = {
        "server_round": server_round,
        "total_rounds": 10,
        "batch_size": 64,
        "lr": 0.1,
        "epsilon": 1.0,
        "delta": 1e-6,
        "clip": 1.0,
    } | overrides
    instruction = msg.TrainInstruction.for_algorithm("dp-fedsgd", **values)
    content = RecordDict(
        {msg.MODEL: msg.arrays_record(get_parameters(model)), msg.CONFIG: instruction.to_config_record()}
    )
    return deliver_to_silo(context, content, msg.TRAIN)


def test_setup_describes_the_silo_without_sensitive_counts() -> None:
    info = setup_silo(silo_context())
    assert info.silo_id == 0 and info.num_labels == 2 and info.n_train > 0
    assert set(info.model_dump()) == set(msg.SiloInfo.model_fields)  # nothing else leaves the silo at setup


def test_dp_fedsgd_reply_holds_only_the_noised_update_and_public_report() -> None:
    context = silo_context()
    info = setup_silo(context)
    reply = _train(context, info, 1)
    assert not reply.has_error()
    assert set(reply.content.keys()) == {msg.UPDATE, msg.REPORT}
    report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
    assert 0 < report.epsilon_spent <= 1.0 and report.noise_multiplier > 0
    assert report.sampling_rate == pytest.approx(64 / info.n_train)
    # the same round without noise: the noise is visible at the scale sigma * C / (q n) per coordinate
    quiet = silo_context()
    setup_silo(quiet)
    reply_inf = _train(quiet, info, 1, epsilon=math.inf)
    noisy = reply.content[msg.UPDATE]["head.weight"].numpy()
    clean = reply_inf.content[msg.UPDATE]["head.weight"].numpy()
    expected_std = report.noise_multiplier * 1.0 / 64
    assert np.std(noisy - clean) == pytest.approx(expected_std, rel=0.8)
    assert not np.allclose(noisy, clean)


def test_operator_cap_means_more_noise_and_refusal_past_the_budget() -> None:
    capped = silo_context(**{"epsilon-budget": 0.4})  # the operator's cap, below the run's epsilon = 1
    free = silo_context()
    info = setup_silo(capped)
    setup_silo(free)
    first = msg.read_config(_train(capped, info, 1).content, msg.TrainReport, record=msg.REPORT)
    uncapped = msg.read_config(_train(free, info, 1).content, msg.TrainReport, record=msg.REPORT)
    assert first.noise_multiplier > uncapped.noise_multiplier
    spent = [first.epsilon_spent]
    for server_round in range(2, 41):  # the run announced 10 rounds; a server that keeps asking is refused
        reply = _train(capped, info, server_round)
        if reply.has_error():
            assert "BudgetExceededError" in reply.error.reason and "silo 0" in reply.error.reason
            break
        spent.append(msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT).epsilon_spent)
    else:
        pytest.fail("the silo answered 40 rounds on a budget calibrated for 10")
    assert len(spent) >= 10 and max(spent) <= 0.4 * (1 + 1e-9)
    ledger_before = dict(capped.state["silofl.ledger"])
    again = _train(capped, info, server_round + 1)
    assert again.has_error() and dict(capped.state["silofl.ledger"]) == ledger_before


def test_changing_privacy_parameters_mid_run_is_refused() -> None:
    context = silo_context()
    info = setup_silo(context)
    assert not _train(context, info, 1).has_error()
    reply = _train(context, info, 2, epsilon=5.0)
    assert reply.has_error() and "changed 'epsilon'" in reply.error.reason


def test_replayed_round_is_not_charged_twice() -> None:
    context = silo_context()
    info = setup_silo(context)
    assert not _train(context, info, 1).has_error()
    reply = _train(context, info, 1)
    assert reply.has_error() and "already charged" in reply.error.reason


def test_malformed_model_is_refused_before_any_charge() -> None:
    context = silo_context()
    info = setup_silo(context)
    instruction = msg.TrainInstruction.for_algorithm(
        "dp-fedsgd", server_round=1, total_rounds=10, batch_size=64, lr=0.1, epsilon=1.0, delta=1e-6
    )
    bad = {"head.weight": np.zeros((1, info.num_features + 1), np.float32), "head.bias": np.zeros(1, np.float32)}
    reply = deliver_to_silo(
        context, RecordDict({msg.MODEL: msg.arrays_record(bad), msg.CONFIG: instruction.to_config_record()}), msg.TRAIN
    )
    assert reply.has_error() and "shape" in reply.error.reason
    assert "silofl.ledger" not in context.state


def test_train_before_setup_and_bad_instruction_are_clear_errors() -> None:
    context = silo_context()
    reply = deliver_to_silo(context, RecordDict({msg.CONFIG: ConfigRecord({"x": 1})}), msg.TRAIN)
    assert reply.has_error() and "query.setup" in reply.error.reason
    info = setup_silo(context)
    model = build_model("logreg", info.num_features, info.num_labels)
    content = RecordDict(
        {
            msg.MODEL: msg.arrays_record(get_parameters(model)),
            msg.CONFIG: ConfigRecord({"algorithm": "dp-fedsgd", "server-round": -1}),
        }
    )
    reply = deliver_to_silo(context, content, msg.TRAIN)
    assert reply.has_error() and "server-round" in reply.error.reason
    instruction = msg.TrainInstruction.for_algorithm("dp-fedsgd", server_round=1, total_rounds=2, batch_size=8, lr=0.1)
    reply = deliver_to_silo(context, RecordDict({msg.CONFIG: instruction.to_config_record()}), msg.TRAIN)
    assert reply.has_error() and "missing ['model']" in reply.error.reason
    assert info.silo_id == 0


def test_simulated_federation_size_must_match_the_run() -> None:
    context = Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config={}
    )
    reply = deliver_to_silo(context, RecordDict({msg.CONFIG: SPEC.to_config_record()}), msg.SETUP)
    assert reply.has_error() and "num-silos=3" in reply.error.reason


def test_evaluate_returns_counts_that_add_up() -> None:
    context = silo_context(partition=1)
    info = setup_silo(context)
    model = build_model("logreg", info.num_features, info.num_labels)
    content = RecordDict(
        {
            msg.MODEL: msg.arrays_record(get_parameters(model)),
            msg.CONFIG: msg.EvaluateInstruction(server_round=3).to_config_record(),
        }
    )
    reply = deliver_to_silo(context, content, msg.EVALUATE)
    counts = reply.content[msg.COUNTS]["counts"].numpy()
    report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT)
    assert counts.shape == (info.num_groups, info.num_labels, info.num_labels)
    assert counts.sum() == report.num_examples == info.n_test and report.silo_id == 1


def test_ledger_kept_between_messages_is_the_one_in_the_state() -> None:
    """The silo reuses the ledger it saved only while its state holds that very record unchanged: a ledger record
    put in its place (a restored checkpoint) or changed in place is what the next charge starts from."""
    from silofl.client import privacy_state
    from silofl.protocols.privacy.ledger import PrivacyLedger

    context = silo_context()
    info = setup_silo(context)
    assert not _train(context, info, 1).has_error()
    assert not _train(context, info, 2).has_error()
    saved = context.state[privacy_state.LEDGER_KEY]
    assert PrivacyLedger.from_dict(dict(saved)).rounds() == [1, 2]
    # the state's record changed in place (as a hand-edited state would be): round 3 then counts as charged
    saved["round_run_length"] = [3]
    saved["entry_steps"] = [3]
    saved["entry_rounds"] = [3]
    reply = _train(context, info, 3)
    assert reply.has_error() and "already charged" in reply.error.reason
    # a record put in its place: the ledger starts from it
    context.state[privacy_state.LEDGER_KEY] = ConfigRecord(PrivacyLedger.from_dict(dict(saved)).to_dict())
    assert not _train(context, info, 4).has_error()
    after = PrivacyLedger.from_dict(dict(context.state[privacy_state.LEDGER_KEY]))
    assert after.rounds() == [1, 2, 3, 4]
    privacy_state.clear_caches()  # what benchmarks do between runs: the ledger is read back from the state
    assert not _train(context, info, 5).has_error()
    assert PrivacyLedger.from_dict(dict(context.state[privacy_state.LEDGER_KEY])).rounds() == [1, 2, 3, 4, 5]
