"""Message schemas: each side refuses malformed messages with an error naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from protocols import messages as msg

SPEC = [("head.weight", (1, 3)), ("head.bias", (1,))]


def _content(**arrays: np.ndarray) -> RecordDict:
    return RecordDict({msg.MODEL: msg.arrays_record(arrays)})


def _good() -> dict[str, np.ndarray]:
    return {"head.weight": np.zeros((1, 3), np.float32), "head.bias": np.zeros(1, np.float32)}


def test_check_arrays_accepts_the_spec() -> None:
    out = msg.check_arrays(_content(**_good()), msg.MODEL, SPEC)
    assert list(out) == ["head.weight", "head.bias"] and out["head.weight"].shape == (1, 3)


@pytest.mark.parametrize(
    ("arrays", "needle"),
    [
        ({"head.weight": np.zeros((1, 3), np.float32)}, "expected ['head.weight', 'head.bias']"),
        ({"head.weight": np.zeros((3, 1), np.float32), "head.bias": np.zeros(1, np.float32)}, "shape (3, 1)"),
        ({"head.weight": np.zeros((1, 3), np.float64), "head.bias": np.zeros(1, np.float32)}, "dtype float64"),
        ({"head.weight": np.array([[0, np.nan, 0]], np.float32), "head.bias": np.zeros(1, np.float32)}, "NaN"),
        ({"head.weight": np.array([[0, np.inf, 0]], np.float32), "head.bias": np.zeros(1, np.float32)}, "infinite"),
        ({"head.weight": np.zeros((0, 3), np.float32), "head.bias": np.zeros(1, np.float32)}, "shape (0, 3)"),
    ],
)
def test_check_arrays_rejects(arrays: dict[str, np.ndarray], needle: str) -> None:
    with pytest.raises(msg.MessageError) as err:
        msg.check_arrays(_content(**arrays), msg.MODEL, SPEC, what="train reply from silo 2")
    assert needle in str(err.value) and "train reply from silo 2" in str(err.value)


def test_check_arrays_missing_record_and_wrong_record_type() -> None:
    with pytest.raises(msg.MessageError, match="missing array record 'model'"):
        msg.check_arrays(RecordDict(), msg.MODEL, SPEC)
    with pytest.raises(msg.MessageError, match="must be an ArrayRecord"):
        msg.check_arrays(RecordDict({msg.MODEL: ConfigRecord({"a": 1})}), msg.MODEL, SPEC)


def test_read_config_refuses_unknown_and_bad_values() -> None:
    good = msg.TrainInstruction.for_algorithm("fedavg", server_round=1, total_rounds=2, batch_size=8, lr=0.1)
    content = RecordDict({msg.CONFIG: good.to_config_record()})
    assert msg.read_instruction(content) == good
    bad = dict(content[msg.CONFIG])
    bad["server-round"] = 0
    with pytest.raises(msg.MessageError, match="'server-round'"):
        msg.read_instruction(RecordDict({msg.CONFIG: ConfigRecord(bad)}))
    extra = dict(content[msg.CONFIG]) | {"injected": 1}
    with pytest.raises(msg.MessageError, match="'injected'"):
        msg.read_instruction(RecordDict({msg.CONFIG: ConfigRecord(extra)}))
    for name, needle in [("nosuch", "unknown algorithm 'nosuch'"), ("FedAvg", "canonical name 'fedavg'")]:
        other = dict(content[msg.CONFIG]) | {"algorithm": name}
        with pytest.raises(msg.MessageError, match=needle):
            msg.read_instruction(RecordDict({msg.CONFIG: ConfigRecord(other)}))
    with pytest.raises(msg.MessageError, match="'algorithm'"):
        msg.read_instruction(RecordDict({msg.CONFIG: ConfigRecord({k: v for k, v in bad.items() if k != "algorithm"})}))


def test_schemas_roundtrip_through_records() -> None:
    report = msg.TrainReport(
        silo_id=1, server_round=3, num_examples=10, epsilon_spent=float("inf"), noise_multiplier=0.0, sampling_rate=0.5
    )
    content = RecordDict({msg.REPORT: report.to_metric_record()})
    assert msg.read_config(content, msg.TrainReport, record=msg.REPORT) == report
    assert isinstance(msg.arrays_record({"x": np.ones(2, np.int64)}), ArrayRecord)


def test_check_records_refuses_missing_and_unexpected_parts() -> None:
    content = RecordDict({msg.UPDATE: msg.arrays_record(_good()), "smuggled": ConfigRecord({"x": 1})})
    with pytest.raises(msg.MessageError, match=r"unexpected \['smuggled'\].*missing \['report'\]"):
        msg.check_records(content, {msg.UPDATE, msg.REPORT}, what="train reply")
    msg.check_records(RecordDict({msg.REPORT: ConfigRecord({"a": 1})}), {msg.REPORT})
