"""Fuzzing of every message decoder (protocols/messages.py): read_config with each schema, check_records, check_arrays.

Hypothesis generates RecordDicts as a silo or a server could receive them: valid ones, which must be accepted and
round-trip, and broken ones (a key missing or unknown, a value of the wrong type, out of range, NaN or infinite; arrays
misnamed, of the wrong shape or dtype, empty, huge, not finite, or whose payload is not a plain .npy array). Every
broken one must raise MessageError (never another exception) whose text names the field, array or record at fault.
The number of generated cases is counted and printed at the end of the module (and checked per test).
"""

from __future__ import annotations

import functools
import io
import math
import pickle
import tracemalloc
import typing
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import BaseModel

from silofl.protocols import algorithms
from silofl.protocols import messages as msg
from silofl.protocols.model_names import check_evaluated_model_name, check_ssl_model_name, check_tabular_model_name
from tests import fuzz_cases

#: Every schema a message is read with, and the record kind it travels in (reports are MetricRecords).
SCHEMAS: dict[type[BaseModel], str] = {
    msg.DataSpec: "config",
    msg.SiloInfo: "config",
    msg.TrainInstruction: "config",
    msg.TrainReport: "metric",
    msg.GroupsReport: "metric",
    msg.CorrelationReport: "metric",
    msg.EvaluateInstruction: "config",
    msg.EvaluateReport: "metric",
    **{spec.instruction_model: "config" for spec in algorithms.specs()},  # each algorithm's own train instruction
}
#: Fields where infinity means something (no noise, nothing spent bounds it): every other float must be finite.
INF_OK = {
    *((schema, "epsilon") for schema in SCHEMAS if issubclass(schema, msg.TrainInstruction)),
    (msg.TrainReport, "epsilon_spent"),
    (msg.GroupsReport, "epsilon_spent"),
    (msg.CorrelationReport, "epsilon_spent"),
}
INT64_MAX = 2**63 - 1


fuzz = fuzz_cases.fuzz


CASES: Counter[str] = Counter()


_report_cases = fuzz_cases.summary_fixture(
    "silofl-fuzz-messages-summary",
    lambda: (
        f"fuzz messages: {CASES.total()} cases: {CASES['rejected']} malformed messages rejected with a "
        f"MessageError naming the field, {CASES['accepted']} valid ones accepted and round-tripped"
    ),
)


_ran = functools.partial(fuzz_cases.run_counted, CASES)


# -- schema fields ------------------------------------------------------------------------------------------------
def _bounds(field: Any) -> dict[str, float | int | None]:
    out: dict[str, float | int | None] = {
        "ge": None,
        "gt": None,
        "le": None,
        "lt": None,
        "min_length": None,
        "max_length": None,
    }
    for meta in field.metadata:
        for key in out:
            if getattr(meta, key, None) is not None:
                out[key] = getattr(meta, key)
    return out


#: The model names a schema accepts (`protocols.model_names`): its validator -> valid names to draw from.
MODEL_NAMES = {
    check_tabular_model_name: ("logreg", "mlp", "pkg.models:tiny", "m:f"),
    check_evaluated_model_name: ("logreg", "mlp", "cnn", "resnet20", "pkg.models:tiny"),
    check_ssl_model_name: ("cnn", "resnet20", "pkg.encoders:small"),
}


def _name_check(field: Any) -> Callable[[str], str] | None:
    """The model-name validator of a field, if it has one (a str field whose values are names, not free text)."""
    return next((m.func for m in field.metadata if getattr(m, "func", None) in MODEL_NAMES), None)


def _is_valid_name(check: Callable[[str], str], value: str) -> bool:
    try:
        check(value)
    except ValueError:
        return False
    return True


def _kind(field: Any) -> str:
    ann = field.annotation
    if typing.get_origin(ann) is typing.Literal:
        return "literal"
    if _name_check(field) is not None:
        return "model-name"
    if typing.get_origin(ann) is tuple:
        return "names"
    return {int: "int", float: "float", str: "str"}[ann]


def _int_range(field: Any) -> tuple[int, int]:
    b = _bounds(field)
    lo = b["ge"] if b["ge"] is not None else (b["gt"] + 1 if b["gt"] is not None else -INT64_MAX)
    hi = b["le"] if b["le"] is not None else (b["lt"] - 1 if b["lt"] is not None else INT64_MAX)
    return int(lo), int(hi)


def valid_value(schema: type[BaseModel], name: str) -> st.SearchStrategy[Any]:
    field = schema.model_fields[name]
    kind = _kind(field)
    b = _bounds(field)
    if kind == "int":
        lo, hi = _int_range(field)
        return st.integers(lo, min(hi, 10**6)) | st.integers(lo, hi)
    if kind == "float":
        lo = b["ge"] if b["ge"] is not None else b["gt"]
        hi = b["le"] if b["le"] is not None else b["lt"]
        inf = (schema, name) in INF_OK
        floats = st.floats(
            min_value=lo,
            max_value=hi,
            exclude_min=b["gt"] is not None,
            exclude_max=b["lt"] is not None,
            allow_nan=False,
            allow_infinity=False,
        )
        return floats | st.just(math.inf) if inf else floats
    if kind == "literal":
        return st.sampled_from(typing.get_args(field.annotation))
    if kind == "model-name":
        return st.sampled_from(MODEL_NAMES[_name_check(field)])
    if kind == "str":
        return st.text(min_size=b["min_length"] or 0, max_size=min(20, b["max_length"] or 20))
    return st.lists(st.text(max_size=8), max_size=6).map(tuple)


@st.composite
def valid_values(draw: st.DrawFn, schema: type[BaseModel]) -> dict[str, Any]:
    """A valid instance's values by wire name (optional fields sometimes left to their default)."""
    values: dict[str, Any] = {}
    for name, field in schema.model_fields.items():
        if field.is_required() or draw(st.booleans()):
            values[field.alias or name] = draw(valid_value(schema, name))
    if schema is msg.SiloInfo:  # the names are what a silo sends to claim its label and group counts
        values["label-names"] = tuple(draw(st.lists(st.text(max_size=8), min_size=2, max_size=6)))
        values["group-names"] = tuple(draw(st.lists(st.text(max_size=8), min_size=1, max_size=6)))
        values["num-labels"] = len(values["label-names"])
        values["num-groups"] = len(values["group-names"])
    return values


def _wrong_types(kind: str) -> st.SearchStrategy[Any]:
    """Values of a type the field does not have (Flower ConfigRecord values: int, float, str, bytes, bool, lists)."""
    text = st.text(max_size=5)
    common = st.binary(max_size=5) | st.lists(st.integers(0, 3), min_size=1, max_size=3)
    if kind == "int":
        non_integral = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not float(x).is_integer())
        return common | text | st.booleans() | non_integral | st.integers(-5, 5).map(float)
    if kind == "float":
        return common | text | st.booleans() | st.lists(st.floats(0, 1), min_size=1, max_size=2)
    if kind in ("literal", "str", "model-name"):
        return common | st.integers() | st.floats(allow_nan=False) | st.booleans()
    return st.integers() | st.floats(allow_nan=False) | st.booleans() | st.text(max_size=3) | common


def invalid_value(schema: type[BaseModel], name: str) -> st.SearchStrategy[Any]:
    """Values the field must refuse: wrong types, out-of-range numbers, NaN, infinities it has no use for."""
    field = schema.model_fields[name]
    kind = _kind(field)
    b = _bounds(field)
    options = [_wrong_types(kind)]
    if kind == "int":
        lo, hi = _int_range(field)
        if lo > -INT64_MAX:
            options.append(st.integers(max_value=lo - 1))
        if hi < INT64_MAX:
            options.append(st.integers(min_value=hi + 1))
    elif kind == "float":
        options.append(st.just(math.nan))
        if (schema, name) not in INF_OK:
            options.append(st.sampled_from([math.inf, -math.inf]))
        else:
            options.append(st.just(-math.inf))
        if b["ge"] is not None:
            options.append(st.floats(max_value=b["ge"], exclude_max=True, allow_infinity=False, allow_nan=False))
        if b["gt"] is not None:
            options.append(st.floats(max_value=b["gt"], allow_infinity=False, allow_nan=False))
        if b["le"] is not None:
            options.append(st.floats(min_value=b["le"], exclude_min=True, allow_infinity=False, allow_nan=False))
        if b["lt"] is not None:
            options.append(st.floats(min_value=b["lt"], allow_infinity=False, allow_nan=False))
    elif kind == "literal":
        choices = typing.get_args(field.annotation)
        options.append(st.text(max_size=12).filter(lambda s: s not in choices))
    elif kind == "model-name":
        check = _name_check(field)
        options.append(st.text(max_size=12).filter(lambda v: not _is_valid_name(check, v)))
    elif kind == "str":
        if b["min_length"]:
            options.append(st.just(""))
        if b["max_length"]:
            options.append(st.just("x" * (int(b["max_length"]) + 1)))
    elif kind == "names":
        options.append(st.lists(st.integers(), min_size=1, max_size=3))
    return st.one_of(options)


def _record(values: dict[str, Any], kind: str) -> ConfigRecord | MetricRecord:
    wire = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    return ConfigRecord(wire) if kind == "config" else MetricRecord(wire)


schemas = st.sampled_from(list(SCHEMAS))


# -- read_config --------------------------------------------------------------------------------------------------
@fuzz(400)
@given(schema=schemas, data=st.data(), record=st.sampled_from(["config", "report", "x"]))
def _valid_configs_roundtrip(schema: type[BaseModel], data: st.DataObject, record: str) -> None:
    values = data.draw(valid_values(schema))
    model = schema.model_validate(values)
    for kind in {"config", SCHEMAS[schema]}:
        content = RecordDict({record: _record(model.model_dump(by_alias=True), kind)})
        assert msg.read_config(content, schema, record=record) == model
    # and through the schema's own serializers
    out = model.to_config_record()
    assert msg.read_config(RecordDict({"c": out}), schema, record="c") == model
    CASES["accepted"] += 1


@pytest.mark.slow
def test_valid_configs_are_accepted_and_roundtrip() -> None:
    _ran(_valid_configs_roundtrip, 400)


def _names_field(text: str, alias: str) -> bool:
    """`text` names the field `alias` (or one of its items, as 'label-names.0')."""
    return f"'{alias}'" in text or f"'{alias}." in text


@fuzz(700)
@given(schema=schemas, data=st.data())
def _invalid_values_rejected(schema: type[BaseModel], data: st.DataObject) -> None:
    values = data.draw(valid_values(schema))
    name = data.draw(st.sampled_from(list(schema.model_fields)))
    alias = schema.model_fields[name].alias or name
    values[alias] = data.draw(invalid_value(schema, name), label=f"bad {alias}")
    kind = data.draw(st.sampled_from(["config", "metric"]))
    try:
        record = _record(values, kind)
    except TypeError:  # a MetricRecord cannot even hold a string: Flower refuses it at the sender
        record = _record(values, "config")
    with pytest.raises(msg.MessageError) as err:
        msg.read_config(RecordDict({"config": record}), schema, what="fuzzed message")
    text = str(err.value)
    assert "fuzzed message" in text and schema.__name__ in text
    assert _names_field(text, alias), f"the error does not name '{alias}': {text}"
    CASES["rejected"] += 1


@pytest.mark.slow
def test_wrong_types_ranges_nan_and_inf_are_rejected_naming_the_field() -> None:
    _ran(_invalid_values_rejected, 700)


@fuzz(300)
@given(schema=schemas, data=st.data())
def _missing_and_unknown_keys_rejected(schema: type[BaseModel], data: st.DataObject) -> None:
    values = data.draw(valid_values(schema))
    required = [f.alias or n for n, f in schema.model_fields.items() if f.is_required()]
    known = {f.alias or n for n, f in schema.model_fields.items()} | set(schema.model_fields)
    dropped = data.draw(st.lists(st.sampled_from(required), unique=True, max_size=3))
    extra = data.draw(
        st.dictionaries(
            st.text(min_size=1, max_size=12).filter(lambda k: k not in known),
            st.integers() | st.floats() | st.text(max_size=4) | st.booleans(),
            max_size=3,
        )
    )
    if not dropped and not extra:
        extra = {"injected": 1}
    for key in dropped:
        del values[key]
    values.update(extra)
    with pytest.raises(msg.MessageError) as err:
        msg.read_config(RecordDict({"config": _record(values, "config")}), schema)
    text = str(err.value)
    for key in [*dropped, *extra]:
        assert key in text, f"'{key}' not named in: {text}"
    CASES["rejected"] += 1


@pytest.mark.slow
def test_missing_and_unknown_keys_are_rejected_naming_each() -> None:
    _ran(_missing_and_unknown_keys_rejected, 300)


@fuzz(100)
@given(schema=schemas, record=st.text(min_size=1, max_size=10), present=st.sampled_from(["none", "array", "other"]))
def _missing_or_wrong_record_rejected(schema: type[BaseModel], record: str, present: str) -> None:
    if present == "none":
        content = RecordDict({f"{record}-other": ConfigRecord({"a": 1})})
    elif present == "array":  # the record is there but holds arrays
        content = RecordDict({record: msg.arrays_record({"a": np.zeros(2, np.float32)})})
    else:
        content = RecordDict()
    with pytest.raises(msg.MessageError) as err:
        msg.read_config(content, schema, record=record)
    assert f"'{record}'" in str(err.value)
    CASES["rejected"] += 1


def test_missing_or_wrong_kind_of_record_is_rejected() -> None:
    _ran(_missing_or_wrong_record_rejected, 100)


def _instruction_of(algorithm: str) -> msg.TrainInstruction:
    """The train instruction the server sends for `algorithm` with its defaults."""
    from silofl.protocols.config import RunConfig
    from silofl.server.orchestrator import train_instruction

    return train_instruction(RunConfig.parse({"algorithm": algorithm, "rounds": 2}), rounds=2, delta=1e-5)


def _read(values: dict) -> msg.TrainInstruction:
    return msg.read_instruction(RecordDict({"config": ConfigRecord(values)}))


def test_lax_coercions_are_refused() -> None:
    """Regression for the coercions fuzzing found accepted: "3", True and 3.0 for an integer, b"0.1" for a float."""
    good = _instruction_of("fedavg")
    for key, value in [("server-round", "3"), ("server-round", True), ("server-round", 3.0), ("lr", b"0.1")]:
        values = dict(good.to_config_record()) | {key: value}
        with pytest.raises(msg.MessageError, match=f"'{key}'"):
            _read(values)
    # infinity means nothing here (epsilon = inf is "no noise"); each key checked in each algorithm that sends it
    for key in ["lr", "clip", "mu", "lambda", "grad-clip"]:
        owners = [s.name for s in algorithms.specs() if key in _instruction_of(s.name).to_config_record()]
        assert owners, key
        for algorithm in owners:
            values = dict(_instruction_of(algorithm).to_config_record()) | {key: math.inf}
            with pytest.raises(msg.MessageError, match=f"'{key}'.*finite"):
                _read(values)
    values = dict(good.to_config_record()) | {"epsilon": math.inf}
    assert math.isinf(_read(values).epsilon)


def test_an_instruction_carries_only_its_algorithms_fields() -> None:
    """A key of another algorithm's instruction (clip for fedavg) is refused, naming it: a silo runs what it is told."""
    values = dict(_instruction_of("fedavg").to_config_record()) | {"clip": 1.0}
    with pytest.raises(msg.MessageError, match="'clip'"):
        _read(values)


def test_silo_info_names_must_match_its_counts() -> None:
    info = dict(
        silo_id=0,
        role="silo",
        dataset="d",
        num_features=3,
        num_labels=2,
        num_groups=1,
        n_train=5,
        n_test=1,
        schema_hash="h",
        label_names=("a", "b"),
        group_names=("g",),
        evaluation="exact",
    )
    msg.SiloInfo(**info)
    for key, value in [("num_labels", 100_000), ("num_groups", 7)]:
        record = msg.SiloInfo(**info).to_config_record()
        record[key.replace("_", "-")] = value
        with pytest.raises(msg.MessageError, match=key.replace("_", "-")):
            msg.read_config(RecordDict({"report": record}), msg.SiloInfo, record="report")


# -- check_records ------------------------------------------------------------------------------------------------
NAMES = st.sampled_from(["config", "model", "update", "report", "counts", "fairness", "others", "x"])


@fuzz(200)
@given(present=st.sets(NAMES, max_size=5), expected=st.sets(NAMES, max_size=4))
def _check_records_fuzz(present: set[str], expected: set[str]) -> None:
    content = RecordDict({name: ConfigRecord({"a": 1}) for name in present})
    if present == expected:
        msg.check_records(content, expected, what="fuzzed")
        CASES["accepted"] += 1
        return
    with pytest.raises(msg.MessageError) as err:
        msg.check_records(content, expected, what="fuzzed")
    text = str(err.value)
    assert "fuzzed" in text
    for name in present ^ expected:
        assert f"'{name}'" in text
    CASES["rejected"] += 1


def test_check_records_refuses_exactly_the_mismatches() -> None:
    _ran(_check_records_fuzz, 200)


# -- check_arrays -------------------------------------------------------------------------------------------------
DTYPES = ["float32", "float64", "int64"]
OTHER_DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8", "bool", "complex64", ">f4", ">f8"]
array_names = st.text(alphabet="abcdefghij._", min_size=1, max_size=8)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


@st.composite
def specs(draw: st.DrawFn) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    names = draw(st.lists(array_names, min_size=1, max_size=4, unique=True))
    return [(name, draw(shapes)) for name in names], draw(st.sampled_from(DTYPES))


def _values(draw: st.DrawFn, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "int64":
        elements = st.integers(-(2**62), 2**62)
    else:
        elements = st.floats(allow_nan=False, allow_infinity=False, width=32 if dtype == "float32" else 64)
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))


def _npy(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=False)
    return buf.getvalue()


def _payload(value: np.ndarray, dtype: str, shape: tuple[int, ...], data: bytes, stype: str = "numpy.ndarray"):
    return Array(dtype, shape, stype, data)


MUTATIONS = [
    "rename",
    "reorder",
    "drop",
    "extra",
    "shape",
    "empty",
    "huge-declared",
    "dtype",
    "nonfinite",
    "truncated",
    "trailing",
    "garbage",
    "npz",
    "pickle",
    "header-shape",
    "header-dtype",
    "object",
    "stype",
    "not-array-record",
    "missing-record",
]


@fuzz(900)
@given(spec_dtype=specs(), data=st.data(), mutation=st.sampled_from(["valid", "fortran", *MUTATIONS]))
def _check_arrays_fuzz(spec_dtype, data: st.DataObject, mutation: str) -> None:
    spec, dtype = spec_dtype
    arrays = {name: _values(data.draw, shape, dtype) for name, shape in spec}
    record = "model"
    items = {name: Array(value) for name, value in arrays.items()}
    target = data.draw(st.sampled_from([name for name, _ in spec]))
    value, shape = arrays[target], dict(spec)[target]
    needle = f"'{record}.{target}'"  # what the error must name
    if mutation in ("valid", "fortran"):
        if mutation == "fortran":
            items[target] = Array(np.asfortranarray(value))
        out = msg.check_arrays(RecordDict({record: ArrayRecord(items)}), record, spec, dtype=dtype)
        assert list(out) == [n for n, _ in spec]
        for name, got in out.items():
            assert got.dtype == np.dtype(dtype) and got.shape == dict(spec)[name] and got.flags.writeable
            np.testing.assert_array_equal(got, arrays[name])
        CASES["accepted"] += 1
        return
    content_record: Any = None
    if mutation == "rename":
        new = data.draw(array_names.filter(lambda n: n not in arrays))
        items = {new if n == target else n: a for n, a in items.items()}
        needle = f"'{new}'"
    elif mutation == "reorder":
        if len(items) < 2:
            mutation, needle = "drop", f"'{target}'"
        else:
            items = dict(reversed(list(items.items())))
            needle = f"'{record}'"
    if mutation == "drop":
        del items[target]
        needle = f"'{target}'"
    elif mutation == "extra":
        new = data.draw(array_names.filter(lambda n: n not in arrays))
        items[new] = Array(np.zeros(2, dtype))
        needle = f"'{new}'"
    elif mutation == "shape":
        bad = data.draw(shapes.filter(lambda s: s != shape))
        items[target] = Array(np.zeros(bad, dtype))
    elif mutation == "empty":
        bad = (0,) if shape != (0,) else (0, 1)
        items[target] = Array(np.zeros(bad, dtype))
    elif mutation == "huge-declared":  # 10^7+ elements declared, a few bytes sent: refused by the declared shape
        bad = data.draw(st.sampled_from([(10**7,), (10**4, 10**4), (2**40,), (*shape, 10**7)]))
        items[target] = _payload(value, dtype, bad, _npy(value))
    elif mutation == "dtype":
        other = data.draw(st.sampled_from([d for d in OTHER_DTYPES if np.dtype(d) != np.dtype(dtype)]))
        items[target] = Array(np.zeros(shape, other))
    elif mutation == "nonfinite":
        if dtype == "int64" or value.size == 0:
            items[target] = Array(np.zeros(shape, "float16"))  # falls back to a dtype error
        else:
            bad = value.copy()
            index = data.draw(st.integers(0, bad.size - 1))
            bad.flat[index] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            items[target] = Array(bad)
    elif mutation == "truncated":
        raw = _npy(value)
        items[target] = _payload(value, dtype, shape, raw[: data.draw(st.integers(0, len(raw) - 1))])
    elif mutation == "trailing":
        items[target] = _payload(value, dtype, shape, _npy(value) + data.draw(st.binary(min_size=1, max_size=64)))
    elif mutation == "garbage":
        items[target] = _payload(value, dtype, shape, data.draw(st.binary(max_size=200)))
    elif mutation == "npz":  # np.load would return an NpzFile for a zip payload
        buf = io.BytesIO()
        np.savez(buf, **{"a": value})
        items[target] = _payload(value, dtype, shape, buf.getvalue())
    elif mutation == "pickle":
        items[target] = _payload(value, dtype, shape, pickle.dumps(value))
    elif mutation == "header-shape":  # the header claims more (or other) elements than the metadata
        bad = data.draw(shapes.filter(lambda s: s != shape))
        items[target] = _payload(value, dtype, shape, _npy(np.zeros(bad, dtype)))
    elif mutation == "header-dtype":
        other = data.draw(st.sampled_from([d for d in OTHER_DTYPES if np.dtype(d) != np.dtype(dtype)]))
        items[target] = _payload(value, dtype, shape, _npy(np.zeros(shape, other)))
    elif mutation == "object":
        header = f"{{'descr': '|O', 'fortran_order': False, 'shape': {shape}, }}".encode()
        raw = b"\x93NUMPY\x01\x00" + len(header + b"\n").to_bytes(2, "little") + header + b"\n" + pickle.dumps([1])
        items[target] = _payload(value, dtype, shape, raw)
    elif mutation == "stype":
        items[target] = _payload(value, dtype, shape, _npy(value), stype=data.draw(st.sampled_from(["torch", ""])))
    elif mutation == "not-array-record":
        content_record = data.draw(st.sampled_from([ConfigRecord({target: 1}), MetricRecord({target: 1.0})]))
        needle = f"'{record}'"
    if mutation == "missing-record":
        content = RecordDict({"other": ArrayRecord(items)})
        needle = f"'{record}'"
    else:
        content = RecordDict({record: content_record if content_record is not None else ArrayRecord(items)})
    with pytest.raises(msg.MessageError) as err:
        msg.check_arrays(content, record, spec, dtype=dtype, what="fuzzed reply")
    text = str(err.value)
    assert "fuzzed reply" in text and needle in text, f"{mutation}: {needle} not in {text}"
    CASES["rejected"] += 1


@pytest.mark.slow
def test_check_arrays_accepts_the_spec_and_rejects_every_mutation_naming_the_array() -> None:
    _ran(_check_arrays_fuzz, 900)


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("lie", ["declared", "header"])
def test_huge_array_is_refused_before_any_copy(lie: str) -> None:
    """10^7 float32 (40 MB) where 10 are expected: refused from the metadata or the .npy header, nothing decoded."""
    huge = np.ones(10**7, np.float32)
    raw = _npy(huge)
    declared = (10**7,) if lie == "declared" else (10,)
    content = RecordDict({"model": ArrayRecord({"w": Array("float32", declared, "numpy.ndarray", raw)})})

    def check() -> None:
        with pytest.raises(msg.MessageError, match=r"'model\.w'.*10000000"):
            msg.check_arrays(content, "model", [("w", (10,))])

    assert _peak_bytes(check) < 1_000_000  # a decode would allocate 40 MB
    CASES["rejected"] += 1


def test_valid_array_costs_one_copy() -> None:
    value = np.arange(10**6, dtype=np.float32)
    content = RecordDict({"model": msg.arrays_record({"w": value})})
    peak = _peak_bytes(lambda: msg.check_arrays(content, "model", [("w", (10**6,))]))
    assert peak < 2.5 * value.nbytes
