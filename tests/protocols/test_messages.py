"""Message schemas: each side refuses malformed messages with an error naming the field."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from silofl.protocols import messages as msg

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


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(5),
        np.float32(3.5),
        np.zeros((0, 3)),
        np.arange(12.0).reshape(3, 4).T,  # not C-contiguous
        np.array([True, False]),
        np.arange(4, dtype=">f8"),  # big-endian
        np.zeros((2, 3, 4), np.int64),
    ],
)
def test_arrays_record_writes_flowers_own_payload(value: np.ndarray) -> None:
    """arrays_record writes the .npy bytes itself: byte for byte what Flower's Array(ndarray) holds."""
    ours = msg.arrays_record({"a": value})["a"]
    value = np.asarray(value)
    flowers = Array(value if value.flags.c_contiguous else np.ascontiguousarray(value))
    assert (ours.dtype, ours.shape, ours.stype, ours.data) == (
        flowers.dtype,
        flowers.shape,
        flowers.stype,
        flowers.data,
    )


def test_check_arrays_parses_a_header_other_than_numpys_own_in_full() -> None:
    """A payload whose header is not the one numpy writes for the spec (Fortran order, format 2.0) is parsed and
    checked in full, and decodes to the same values; one that lies about its shape is refused."""
    value = np.arange(6, dtype=np.float32).reshape(1, 6)
    fortran = Array(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    out = msg.check_arrays(RecordDict({msg.MODEL: ArrayRecord({"w": fortran})}), msg.MODEL, [("w", (2, 3))])
    assert np.array_equal(out["w"], np.arange(6, dtype=np.float32).reshape(2, 3)) and out["w"].flags.c_contiguous
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, value, version=(2, 0))
    v2 = Array("float32", (1, 6), "numpy.ndarray", buffer.getvalue())
    assert np.array_equal(
        msg.check_arrays(RecordDict({msg.MODEL: ArrayRecord({"w": v2})}), msg.MODEL, [("w", (1, 6))])["w"], value
    )
    lying = Array("float32", (1, 6), "numpy.ndarray", msg.arrays_record({"w": value.reshape(2, 3)})["w"].data)
    with pytest.raises(msg.MessageError, match="decodes to"):
        msg.check_arrays(RecordDict({msg.MODEL: ArrayRecord({"w": lying})}), msg.MODEL, [("w", (1, 6))])
    short = Array("float32", (1, 6), "numpy.ndarray", msg.arrays_record({"w": value})["w"].data[:-4])
    with pytest.raises(msg.MessageError, match="bytes of data"):
        msg.check_arrays(RecordDict({msg.MODEL: ArrayRecord({"w": short})}), msg.MODEL, [("w", (1, 6))])


def test_flower_record_holds_exactly_the_values_and_checks_new_ones() -> None:
    """Records built from a template of the same keys hold the new values with their types (1, True and 1.0 differ;
    0.0 and -0.0 differ), every list anew, and a value Flower refuses is still refused."""
    first = msg.flower_record(ConfigRecord, {"a": 1, "b": 0.0, "c": "x", "d": [1, 2]})
    second = msg.flower_record(ConfigRecord, {"a": True, "b": -0.0, "c": "x", "d": [1, 2]})
    assert type(second["a"]) is bool and math.copysign(1.0, second["b"]) == -1.0 and second["d"] is not first["d"]
    first["d"].append(3)  # a caller changing its record changes no later record
    third = msg.flower_record(ConfigRecord, {"a": 1.0, "b": -0.0, "c": "x", "d": [1, 2]})
    assert dict(third) == {"a": 1.0, "b": -0.0, "c": "x", "d": [1, 2]} and type(third["a"]) is float
    with pytest.raises(TypeError):
        msg.flower_record(ConfigRecord, {"a": 1.0, "b": -0.0, "c": object(), "d": [1, 2]})
    with pytest.raises(TypeError):
        msg.flower_record(ConfigRecord, {"a": 1.0, "b": -0.0, "c": "x", "d": [1, "2"]})
    metric = msg.flower_record(MetricRecord, {"m": 0.5})
    assert isinstance(metric, MetricRecord) and dict(metric) == {"m": 0.5}


def test_record_cache_serves_only_the_very_record_as_it_was() -> None:
    cache: msg.RecordCache[str] = msg.RecordCache()
    record = ConfigRecord({"x": 1, "values": [1.0, 2.0]})
    cache.put(record, "derived")
    assert cache.get(record) == "derived"
    assert cache.get(ConfigRecord({"x": 1, "values": [1.0, 2.0]})) is None  # another record, equal values
    record["values"].append(3.0)  # changed in place
    assert cache.get(record) is None
    record["values"].pop()
    assert cache.get(record) == "derived"
    record["x"] = True  # equal to 1, another type
    assert cache.get(record) is None
    record["x"] = 1
    cache.discard(record)
    assert cache.get(record) is None
