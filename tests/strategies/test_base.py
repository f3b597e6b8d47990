"""Strategies: aggregation math and refusal of bad rounds (error replies, strangers, duplicates, stale rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict

from silofl.protocols import messages as msg
from silofl.strategies.dp_fedsgd import DpFedSgdStrategy
from silofl.strategies.fedavg import FedAvg
from silofl.strategies.federation import Federation, RoundError, SiloEntry
from silofl.strategies.lr_schedule import StepSchedule
from tests.factories import silo_info

SPEC = [("head.weight", (1, 2)), ("head.bias", (1,))]


pytestmark = pytest.mark.usefixtures("task_identity")


def _federation(sizes=(100, 300)) -> Federation:
    silos = []
    for i, n in enumerate(sizes):
        silos.append(SiloEntry(node_id=10 + i, info=silo_info(i, n)))
    return Federation(silos=tuple(silos))


def _instruction(algorithm: str) -> msg.TrainInstruction:
    return msg.TrainInstruction.for_algorithm(algorithm, server_round=1, total_rounds=5, batch_size=10, lr=0.5)


def _strategy(kind: str = "fedavg"):
    fed = _federation()
    common = {"eval_instruction": msg.EvaluateInstruction(server_round=0), "instruction": _instruction(kind)}
    if kind == "fedavg":
        return FedAvg(fed, SPEC, **common)
    return DpFedSgdStrategy(fed, SPEC, schedule=StepSchedule(0.5), **common)


def _model(value: float) -> dict[str, np.ndarray]:
    return {"head.weight": np.full((1, 2), value, np.float32), "head.bias": np.full(1, value, np.float32)}


def _reply(instr: Message, silo_id: int, round_: int, value: float, n: int) -> Message:
    report = msg.TrainReport(
        silo_id=silo_id,
        server_round=round_,
        num_examples=n,
        epsilon_spent=0.5 + silo_id,
        noise_multiplier=1.0,
        sampling_rate=0.1,
    )
    content = RecordDict({msg.UPDATE: msg.arrays_record(_model(value)), msg.REPORT: report.to_metric_record()})
    return Message(content, reply_to=instr)


def _round(strategy, values, *, round_=1, ns=(100, 300)):
    instrs = list(strategy.configure_train(round_, msg.arrays_record(_model(1.0)), ConfigRecord(), None))
    return instrs, [_reply(m, i, round_, v, n) for i, (m, v, n) in enumerate(zip(instrs, values, ns, strict=True))]


def test_fedavg_weights_by_records() -> None:
    strategy = _strategy("fedavg")
    _, replies = _round(strategy, [0.0, 4.0])
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["head.weight"].numpy(), 3.0)  # 0.25 * 0 + 0.75 * 4
    assert metrics["epsilon-spent"] == pytest.approx(1.5)


def test_gradient_step_descends_on_weighted_mean_gradient() -> None:
    strategy = _strategy("dp-fedsgd")
    _, replies = _round(strategy, [2.0, 2.0])
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["head.bias"].numpy(), 1.0 - 0.5 * 2.0)


def test_train_messages_go_to_every_silo_with_the_instruction() -> None:
    strategy = _strategy("dp-fedsgd")
    instrs, _ = _round(strategy, [0.0, 0.0], round_=3)
    assert sorted(m.metadata.dst_node_id for m in instrs) == [10, 11]
    read = msg.read_instruction(instrs[0].content)
    assert read.server_round == 3 and read.algorithm == "dp-fedsgd"


def test_error_reply_stops_the_round_naming_the_silo() -> None:
    strategy = _strategy()
    instrs, replies = _round(strategy, [0.0, 1.0])
    replies[1] = Message(Error(code=0, reason="BudgetExceededError: silo 1 is out of budget"), reply_to=instrs[1])
    with pytest.raises(RoundError, match=r"silo 1 \(node 11\) failed in round 1.*out of budget"):
        strategy.aggregate_train(1, replies)


def test_a_node_the_superlink_could_not_reach_is_named() -> None:
    """Flower's SuperLink answers for a SuperNode that stopped sending heartbeats with an error reply of its own
    (source node 1, "Node Unavailable"): the round stops naming the silo it stands for, not "a reply came from node 1,
    which was not asked"."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    strategy = _strategy()
    instrs, replies = _round(strategy, [0.0, 1.0])
    replies[1] = create_message_error_unavailable_res_message(instrs[1].metadata, "node_unavail")
    assert replies[1].metadata.src_node_id == 1
    with pytest.raises(
        RoundError,
        match=r"round 1 \(train\): no reply from silo 1 \(node 11\); the SuperLink reports "
        r"'Error: Node Unavailable.*deploy restart.*resume=true",
    ):
        strategy.aggregate_train(1, replies)


def test_missing_duplicate_and_stale_replies_are_refused() -> None:
    strategy = _strategy()
    _, replies = _round(strategy, [0.0, 1.0])
    with pytest.raises(RoundError, match=r"no reply from silo 1 \(node 11\)"):
        strategy.aggregate_train(1, replies[:1])
    with pytest.raises(RoundError, match="answered twice"):
        strategy.aggregate_train(1, [replies[0], replies[0], replies[1]])
    instrs, _ = _round(strategy, [0.0, 1.0], round_=2)
    stale = [_reply(m, i, 1, 0.0, 100) for i, m in enumerate(instrs)]
    with pytest.raises(RoundError, match="for round 1, expected 2"):
        strategy.aggregate_train(2, stale)


def test_reply_claiming_another_silo_or_bad_array_is_refused() -> None:
    strategy = _strategy()
    instrs, replies = _round(strategy, [0.0, 1.0])
    replies[0] = _reply(instrs[0], 1, 1, 0.0, 100)
    with pytest.raises(RoundError, match="says silo 1"):
        strategy.aggregate_train(1, replies)
    instrs, replies = _round(strategy, [0.0, np.nan])
    with pytest.raises(msg.MessageError, match=r"silo 1 .* NaN"):
        strategy.aggregate_train(1, replies)


def test_a_reply_with_another_record_count_than_setup_stops_the_run_naming_the_silo() -> None:
    # Each reply's count weighs it in FedAvg's average: a silo claiming 10^15 records would take the average over.
    strategy = _strategy("fedavg")
    _, replies = _round(strategy, [0.0, 4.0], ns=(100, 10**15))
    with pytest.raises(
        RoundError, match=r"silo 1 .*num-examples claims 1000000000000000 training records, but silo 1 \(node 11\) "
    ):
        strategy.aggregate_train(1, replies)
    _, replies = _round(strategy, [0.0, 4.0], ns=(99, 300))  # fewer counts too: the setup round's are the truth
    with pytest.raises(RoundError, match=r"silo 0 .*num-examples claims 99 training records.*declared 100"):
        strategy.aggregate_train(1, replies)
    _, replies = _round(strategy, [0.0, 4.0])
    strategy.aggregate_train(1, replies)  # the declared counts pass


def test_an_evaluation_reply_with_another_test_count_than_setup_is_refused() -> None:
    strategy = _strategy()
    instrs = list(strategy.configure_evaluate(4, msg.arrays_record(_model(0.0)), ConfigRecord(), None))
    replies = []
    for i, m in enumerate(instrs):
        counts = np.zeros((2, 2, 2), dtype=np.int64)
        counts[0, 0, 0] = 5  # 5 test records where the setup round declared 4
        report = msg.EvaluateReport(silo_id=i, server_round=4, num_examples=5, loss_sum=1.0, noise_std=0.0)
        content = RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})
        replies.append(Message(content, reply_to=m))
    with pytest.raises(
        RoundError, match=r"silo 0 .*num-examples claims 5 test records, but silo 0 \(node 10\) declared 4"
    ):
        strategy.aggregate_evaluate(4, replies)


def test_evaluation_sums_counts_exactly() -> None:
    strategy = _strategy()
    instrs = list(strategy.configure_evaluate(4, msg.arrays_record(_model(0.0)), ConfigRecord(), None))
    replies = []
    for i, m in enumerate(instrs):
        counts = np.zeros((2, 2, 2), np.int64)
        counts[i, 1, 1] = 3
        counts[i, 0, 1] = 1
        report = msg.EvaluateReport(silo_id=i, server_round=4, num_examples=4, loss_sum=2.0, noise_std=0.0)
        replies.append(
            Message(
                RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()}),
                reply_to=m,
            )
        )
    ev = strategy.aggregate_evaluate(4, replies)
    assert ev["accuracy"] == pytest.approx(0.75) and ev["loss"] == pytest.approx(0.5)
    assert ev["dp_violation"] == pytest.approx(0.0)


def test_federation_refuses_mismatched_schemas() -> None:
    fed = _federation()
    other = fed.silos[1].info.model_copy(update={"schema_hash": "zzz"})
    with pytest.raises(RoundError, match="describes its data differently"):
        Federation(silos=(fed.silos[0], SiloEntry(node_id=11, info=other)))


def test_step_schedule_decays_every_k_epochs() -> None:
    sched = StepSchedule(1.0, decay=0.5, decay_epochs=2, rounds_per_epoch=10)
    assert sched(1) == 1.0 and sched(20) == 1.0 and sched(21) == 0.5 and sched(41) == 0.25
