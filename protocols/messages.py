"""What the server and the silos say to each other, and how each side checks it on receipt.

Every message is a Flower :class:`~flwr.app.RecordDict`. Its scalar parts are pydantic models (extra keys forbidden,
ranges checked); its arrays are checked against the shapes both sides derive from the model (:func:`check_arrays`):
names, shapes, dtypes and finite values. A message that fails any check raises :class:`MessageError`, whose text
names the message, the field and what was expected, so that a bad message is refused before it touches any state.
Scalars are validated strictly (a string, a bool or a float where the protocol has an integer is refused, not coerced)
and must be finite except where infinity has a meaning (epsilon: no noise); arrays are checked from their declared
metadata and their .npy header before a byte of their payload is decoded, so an oversized array costs no copy.

Message types (Flower `message_type`):

* ``query.setup``  server -> silo: :class:`DataSpec` (which data a simulated silo loads); reply :class:`SiloInfo`.
* ``train``        server -> silo: arrays ``model`` + :class:`TrainInstruction`; reply arrays ``update`` +
  :class:`TrainReport`.
* ``query.groups`` (steffle) server -> silo: :class:`TrainInstruction` of round 1; reply arrays ``counts``: the
  silo's records by (group, label), through a Gaussian histogram that spends `counts-share` of the silo's epsilon
  (exact when the run is non-private).
* ``query.correlation`` (fedsc) server -> silo: arrays ``model`` + :class:`TrainInstruction`; reply arrays
  ``correlation`` (the silo's H x H correlation matrix through DP-CalR, float64) + :class:`CorrelationReport`. The
  train message of a FedSC round then carries ``others`` (R_{-j}, the other silos' aggregate) besides the model.
* ``evaluate``     server -> silo: arrays ``model`` + :class:`EvaluateInstruction`; reply arrays ``counts`` +
  :class:`EvaluateReport`.
"""

from __future__ import annotations

import functools
import io
import math
import pickle
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from silofl.protocols.devices import Device
from silofl.protocols.model_names import check_evaluated_model_name

SETUP = "query.setup"
GROUPS = "query.groups"
CORRELATION = "query.correlation"
TRAIN = "train"
EVALUATE = "evaluate"

#: Names of the records inside a message's RecordDict.
CONFIG = "config"
MODEL = "model"
UPDATE = "update"
COUNTS = "counts"
REPORT = "report"
#: FedSC: a silo's DP correlation matrix (reply to query.correlation), the others' aggregate sent with `train`.
CORRELATION_MATRIX = "correlation"
OTHERS = "others"
FAIRNESS = "fairness"  # steffle: W and the group prior, server -> silo
FAIR_UPDATE = "fair-update"  # steffle: the noised fairness gradients h_theta and h_W, silo -> server
PREVIOUS = "previous"  # mu2fl: the previous query point x_{t-1}, server -> silo
GLOBAL_LOSS = "global-loss"  # fedfdp: the global loss F_t, server -> silo (array "value", float32 (1,))
LOSS_RELEASE = "loss-release"  # fedfdp: the silo's noised loss F~_i, silo -> server (array "value", float32 (1,))

ArraySpec = Sequence[tuple[str, tuple[int, ...]]]
M = TypeVar("M", bound=BaseModel)


class MessageError(ValueError):
    """A message that does not follow the protocol. Nothing it carries has been applied."""


#: Bounds a message may not exceed even when the schema has no natural one: each sizes something the receiver
#: allocates (a model layer, a count table) before it can check the sender's arrays against it.
MAX_FEATURES = 10_000_000
MAX_CATEGORIES = 100_000  # labels or sensitive groups
#: The largest magnitude a silo accepts in an array a server sends it to compute with (model parameters, SteFFLe's W,
#: Tran's multipliers, FedFDP's global loss, a feature party's outputs and Jacobians, DP-mu2-FL's query points).
#: No honest run comes near it; a malicious server would use huge finite values to make one record's per-sample
#: term overflow to inf or NaN, which noise cannot hide. The silo refuses such a message before anything is
#: computed (a refusal that depends on the message only), and its computations zero any per-record term that is
#: still not finite (`protocols.models.clip_factors`).
MAX_SERVER_VALUE = 1e6


#: The pydantic config of the message schemas and of the run's option groups (`protocols.options.OptionGroup`):
#: kebab-case keys (snake_case names accepted too), unknown keys refused, frozen, and a float finite unless its field
#: says otherwise (epsilon = inf means "no noise").
STRICT_KEBAB_CONFIG = ConfigDict(
    extra="forbid",
    frozen=True,
    populate_by_name=True,
    alias_generator=lambda s: s.replace("_", "-"),
    allow_inf_nan=False,
)


class _Schema(BaseModel):
    model_config = STRICT_KEBAB_CONFIG

    def to_config_record(self) -> ConfigRecord:
        return flower_record(ConfigRecord, _flower_values(self.model_dump(by_alias=True)))

    def to_metric_record(self) -> MetricRecord:
        return flower_record(MetricRecord, _flower_values(self.model_dump(by_alias=True)))


def _flower_values(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


RecordT = TypeVar("RecordT", ConfigRecord, MetricRecord)
T = TypeVar("T")
#: The last record built for each (record type, keys): what :func:`flower_record` starts the next one from.
_RECORD_TEMPLATES: dict[tuple[type, tuple[str, ...]], ConfigRecord | MetricRecord] = {}


def flower_record(kind: type[RecordT], values: Mapping[str, Any]) -> RecordT:
    """A Flower ConfigRecord or MetricRecord holding `values` (Flower checks that each value is of a type it carries).

    Flower's check of a record item is a check of its type (~2.5 us per item: most of the cost of building a 17-key
    instruction every round). The last record built with the same keys serves as a template: an item whose value is
    the template's (:func:`same_value`: same type, equal) is taken from it, already checked; every other item, and
    every list (a list is mutable), is set through Flower's checks. The record holds the same values either way.
    """
    key = (kind, tuple(values))
    template = _RECORD_TEMPLATES.get(key)
    if template is None:
        record = kind(dict(values))
    else:
        record = template.copy()
        for name, value in values.items():
            if not same_value(template[name], value):
                record[name] = value
    if len(_RECORD_TEMPLATES) >= 256:
        _RECORD_TEMPLATES.clear()
    _RECORD_TEMPLATES[key] = record.copy()  # a copy: the caller may change its record (its lists are never reused)
    return record


def same_value(old: Any, new: Any) -> bool:
    """Whether the record scalars `old` and `new` are the same: same type and equal (floats: also the same sign, so
    0.0 and -0.0 differ; NaN differs from everything). Lists are never the same (they are mutable)."""
    if type(old) is not type(new) or isinstance(new, list):
        return False
    if isinstance(new, float):
        return old == new and math.copysign(1.0, old) == math.copysign(1.0, new)
    return bool(old == new)


class RecordCache(Generic[T]):
    """What a receiver derived from a record it keeps (a silo's ledger, its data spec), by the record's identity.

    Re-deriving means re-validating every value (a pydantic model, a ledger's entries) on every message, although a
    silo replaces its state records and never changes them in place. An entry is used only while the very record it
    was derived from still holds the very values it held then: the same pickled bytes (types, float bits, list
    elements; ~2 us, where comparing item by item in Python costs as much as validating again). A record changed in
    place, or a new record, is derived again. Entries keep their record alive (its id is not reused meanwhile); at
    `limit` entries the cache starts afresh.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._entries: dict[int, tuple[ConfigRecord | MetricRecord, bytes, T]] = {}
        self._limit = limit

    def get(self, record: ConfigRecord | MetricRecord) -> T | None:
        """What was derived from `record` as it is now, or None."""
        entry = self._entries.get(id(record))
        if entry is None or entry[0] is not record or entry[1] != _snapshot(record):
            return None
        return entry[2]

    def put(self, record: ConfigRecord | MetricRecord, value: T) -> None:
        """Remember `value` as derived from `record` with its current values."""
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[id(record)] = (record, _snapshot(record), value)

    def discard(self, record: ConfigRecord | MetricRecord) -> None:
        """Forget `record` (its owner replaced it)."""
        self._entries.pop(id(record), None)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()


def _snapshot(record: ConfigRecord | MetricRecord) -> bytes:
    """A record's items as bytes: equal bytes mean equal keys, order, types and values (pickle memoizes by identity,
    so equal values may also give different bytes: then an entry is merely derived again)."""
    return pickle.dumps(list(record.items()), protocol=5)


class DataSpec(_Schema):
    """Which data a silo holds when it is simulated (no `data-path` in its node config)."""

    dataset: str = Field(min_length=1)
    data_dir: str = ""
    target: str = ""
    sensitive: str = ""
    features: str = ""
    missing: Literal["error", "drop"] = "error"
    #: How a .csv dataset is read (`csv-sep`, `csv-encoding`): "" detects them, as the command line's checks did
    #: (`client.data.table_files.csv_format`), so a silo reads the file as they did either way.
    csv_sep: str = Field(default="", max_length=1)
    csv_encoding: str = Field(default="", max_length=64)
    num_silos: int = Field(ge=1, le=1000)
    partition: Literal["iid", "attribute", "classes", "dirichlet"] = "iid"
    heterogeneity: float = Field(default=0.0, ge=0.0, le=1.0)
    classes_per_silo: int = Field(default=2, ge=1)
    dirichlet_alpha: float = Field(default=0.5, gt=0.0)
    max_train_records: int = Field(default=0, ge=0)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    #: Parties (SteFFLe's topologies, `protocols.parties`): `num-silos` feature parties and `sensitive-parties`
    #: sensitive ones; "silos": none apart (every node holds both divisions).
    topology: Literal["silos", "divided", "central-sensitive", "general"] = "silos"
    sensitive_parties: int = Field(default=0, ge=0, le=1000)
    sensitive_by: str = Field(default="", max_length=200)

    @classmethod
    def from_run_config(cls, config: Any) -> DataSpec:
        """The data spec of a run configuration (a `protocols.config.RunConfig`): what the server's setup round sends
        the simulated silos, and the key under which a process's silos share one load (`client.silo_data`), so the
        command line's checks (`client.data.preflight`) load exactly what the in-process silos then use."""
        return cls(
            dataset=config.dataset,
            data_dir=config.data_dir,
            target=config.target,
            sensitive=config.sensitive,
            features=config.features,
            missing=config.missing,
            csv_sep=config.csv_sep,
            csv_encoding=config.csv_encoding,
            num_silos=config.num_silos,
            partition=config.partition,
            heterogeneity=config.heterogeneity,
            classes_per_silo=config.classes_per_silo,
            dirichlet_alpha=config.dirichlet_alpha,
            max_train_records=config.max_train_records,
            seed=config.seed,
            topology=config.topology_name,
            sensitive_parties=config.sensitive_nodes,
            sensitive_by=str(getattr(config, "sensitive_by", "")),
        )


class SiloInfo(_Schema):
    """A silo's public description, sent once in the setup round."""

    silo_id: int = Field(ge=0, description="the silo's id, or the party's id among the parties of its role")
    role: Literal["silo", "features", "sensitive"] = Field(
        description="silo: both divisions; features or sensitive: one party of a topology (protocols/parties.py)"
    )
    dataset: str
    num_features: int = Field(ge=1, le=MAX_FEATURES)
    num_labels: int = Field(ge=2, le=MAX_CATEGORIES)
    num_groups: int = Field(ge=1, le=MAX_CATEGORIES)
    n_train: int = Field(ge=1, lt=2**63)
    n_test: int = Field(ge=0, lt=2**63)
    schema_hash: str = Field(min_length=1, description="hash of feature/label/group names: silos must agree")
    label_names: tuple[str, ...]
    group_names: tuple[str, ...]
    evaluation: Literal["exact", "noised", "refuse"] = Field(
        description="how the node answers evaluations, as its operator's policy says (client.silo_policy): the server "
        "stops a run at setup that would ask a node for an evaluation it refuses",
    )

    @model_validator(mode="after")
    def _names_match_counts(self) -> SiloInfo:
        # the counts size the server's tables; the names are what a silo has to send to claim them
        if len(self.label_names) != self.num_labels:
            raise ValueError(f"'label-names' lists {len(self.label_names)} labels but 'num-labels' = {self.num_labels}")
        if len(self.group_names) != self.num_groups:
            raise ValueError(f"'group-names' lists {len(self.group_names)} groups but 'num-groups' = {self.num_groups}")
        return self


#: The fields of a train instruction that a server may change between the rounds of one job: the round number, the
#: learning rate (a schedule) and FedSC's alpha_t. Every other field is bound by the silo at the job's first message
#: (`client.privacy_state.bind_instruction`): the noise and the accounting depend on them.
PER_ROUND_FIELDS = frozenset({"server_round", "lr", "alpha"})


class TrainInstruction(_Schema):
    """Server -> silo, every training round: what every algorithm's instruction has.

    Each algorithm's silos receive its own subclass (`protocols.algorithms.get(name).instruction_model`), which adds
    the algorithm's options marked for the silos and its per-round fields; :func:`read_instruction` picks it from the
    message's `algorithm`. Bounds are those of the run configuration (the same field declarations): a silo builds
    its model from these before it can check the message's arrays against it, so an absurd size is refused here.
    """

    algorithm: str = Field(min_length=1, max_length=100)
    server_round: int = Field(ge=1)
    total_rounds: int = Field(ge=1)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    # the privacy target: every instruction has it (an algorithm that adds no noise sends epsilon = inf)
    epsilon: float = Field(default=math.inf, gt=0.0, allow_inf_nan=True, description="inf: no noise")
    delta: float = Field(default=0.0, ge=0.0, lt=1.0)
    accountant: Literal["rdp", "pld", "best"] = "best"

    @classmethod
    def for_algorithm(cls, algorithm: str, **values: Any) -> TrainInstruction:
        """The instruction of `algorithm` (its registry entry's model) with `values`."""
        from silofl.protocols import algorithms

        return algorithms.get(algorithm).instruction_model(algorithm=algorithms.get(algorithm).name, **values)


def read_instruction(content: RecordDict, *, what: str = "message") -> TrainInstruction:
    """The train instruction of `content`, validated with its algorithm's model (strictly, as :func:`read_config`)."""
    from silofl.protocols import algorithms

    rec = content.get(CONFIG) if CONFIG in content else None
    name = rec.get("algorithm") if isinstance(rec, ConfigRecord | MetricRecord) else None
    if not isinstance(name, str):
        return read_config(content, TrainInstruction, what=what)  # names what is missing or wrong
    try:
        spec = algorithms.get(name)
    except KeyError as exc:
        raise MessageError(f"{what}: invalid TrainInstruction in record '{CONFIG}': {exc.args[0]}") from None
    if name != spec.name:
        raise MessageError(f"{what}: 'algorithm' must be the canonical name {spec.name!r}, got {name!r}")
    return read_config(content, spec.instruction_model, what=what)


class TrainReport(_Schema):
    """Silo -> server with each update. Only public quantities: no count or loss that depends on the sampled data."""

    silo_id: int = Field(ge=0)
    server_round: int = Field(ge=1)
    num_examples: int = Field(ge=0, description="fedavg: local records; private algorithms: n_j (public, from setup)")
    epsilon_spent: float = Field(
        ge=0.0, allow_inf_nan=True, description="the silo's ledger after this answer (inf: no noise)"
    )
    noise_multiplier: float = Field(ge=0.0)
    sampling_rate: float = Field(ge=0.0, le=1.0)


class GroupsReport(_Schema):
    """Silo -> server with its (group, label) counts (array `counts`, noised unless the run is non-private)."""

    silo_id: int = Field(ge=0)
    epsilon_spent: float = Field(
        ge=0.0, allow_inf_nan=True, description="the silo's ledger after the histogram (inf: no noise)"
    )


class CorrelationReport(_Schema):
    """Silo -> server with its DP correlation matrix (array record `correlation`, FedSC's DP-CalR)."""

    silo_id: int = Field(ge=0)
    server_round: int = Field(ge=1)
    num_examples: int = Field(ge=1, description="n_j (public, from setup): the weight q_j = n_j / n")
    epsilon_spent: float = Field(
        ge=0.0, allow_inf_nan=True, description="the silo's ledger after this share (inf: no noise)"
    )
    shares: int = Field(ge=1, description="correlation matrices this silo has released in the run, this one included")
    noise_std: float = Field(ge=0.0, description="sigma of the Gaussian noise on every entry")


class ExchangeSetup(_Schema):
    """Server -> party, the sealed record exchange of separate parties (`protocols.parties`):
    the federation's shape, whose boxes a party makes and expects."""

    feature_parties: int = Field(ge=1, le=1000)
    sensitive_parties: int = Field(ge=1, le=1000)


class EvaluateInstruction(_Schema):
    """Server -> silo: evaluate this model on the silo's local test split (on the run's `device`, resolved by the
    silo; a message without it, from an older server, evaluates on the CPU)."""

    server_round: int = Field(ge=0)
    model: Annotated[str, AfterValidator(check_evaluated_model_name)] = Field(default="logreg", max_length=300)
    hidden: int = Field(default=64, ge=1, le=65536)
    device: Device = "cpu"


class EvaluateReport(_Schema):
    """Silo -> server with the confusion counts (array `counts`)."""

    silo_id: int = Field(ge=0)
    server_round: int = Field(ge=0)
    num_examples: int = Field(ge=0)
    loss_sum: float = Field(ge=0.0)
    #: std of the Gaussian noise on each count and on the loss sum over its bound (0: exact counts); a silo whose
    #: policy answers evaluations noised (`client.noised_evaluation`). Required: a report that leaves it out is refused
    noise_std: float = Field(ge=0.0)


def evaluation_content(
    silo_id: int, server_round: int, num_examples: int, counts: np.ndarray, loss_sum: float, noise_std: float
) -> RecordDict:
    """An evaluate reply's content: the counts (int64) and the :class:`EvaluateReport`."""
    report = EvaluateReport(
        silo_id=silo_id, server_round=server_round, num_examples=num_examples, loss_sum=loss_sum, noise_std=noise_std
    )
    return RecordDict({COUNTS: arrays_record({"counts": counts}), REPORT: report.to_metric_record()})


def check_records(content: RecordDict, expected: set[str], *, what: str = "message") -> None:
    """Refuse a message whose records are not exactly `expected` (a missing part, or something nobody asked for)."""
    names = set(content.keys())
    if names != expected:
        raise MessageError(
            f"{what}: records {sorted(names)} where the protocol has {sorted(expected)}"
            + (f"; unexpected {sorted(names - expected)}" if names - expected else "")
            + (f"; missing {sorted(expected - names)}" if expected - names else "")
        )


def read_config(content: RecordDict, schema: type[M], *, record: str = CONFIG, what: str = "message") -> M:
    """Validate the ConfigRecord (or MetricRecord) `record` of `content` against `schema`.

    Strict: a value of the wrong type is refused rather than coerced (the string "3", a bool or 3.0 is not the
    integer 3; an integer is a valid float). Flower carries sequences as lists; they are read as tuples.
    """
    if record not in content:
        raise MessageError(f"{what}: missing record '{record}' (has: {sorted(content.keys())})")
    rec = content[record]
    if not isinstance(rec, ConfigRecord | MetricRecord):
        raise MessageError(
            f"{what}: record '{record}' must be a ConfigRecord or MetricRecord with the {schema.__name__} fields, "
            f"got {type(rec).__name__}"
        )
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in rec.items()}
    try:
        return schema.model_validate(values, strict=True)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise MessageError(f"{what}: invalid {schema.__name__} in record '{record}': {problems}") from None


def _problem(error: Any) -> str:
    """One pydantic error as "'field': what is wrong (got value)"; a model-level check names its fields itself."""
    where = ".".join(map(str, error["loc"]))
    text = error["msg"].removeprefix("Value error, ")
    if not where:
        return text
    if error["type"] == "missing":
        return f"'{where}': {text}"
    got = repr(error.get("input"))
    return f"'{where}': {text} (got {got[:60] + '...' if len(got) > 60 else got})"


#: The serialization Flower's `Array(ndarray)` uses (`numpy.save` bytes): the only one silofl sends or accepts.
NUMPY_STYPE = "numpy.ndarray"
#: Array kinds whose .npy bytes silofl writes itself (booleans, integers, floats, complex): plain fixed-size values.
_PLAIN_KINDS = frozenset("biufc")


def arrays_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named numpy arrays as an ArrayRecord (order kept).

    Each payload is byte for byte what Flower's `Array(ndarray)` holds (`numpy.save`'s .npy bytes), built here from
    a cached header and the array's C-ordered bytes: `numpy.save` into a buffer costs ~15 us per array and the
    record's constructor copies every Array once more, which made building records a tenth of a small model's round.
    The record is filled item by item, so Flower still checks every key and value.
    """
    record = ArrayRecord()
    for name, value in arrays.items():
        record[name] = _array(value)
    return record


def _array(value: np.ndarray) -> Array:
    value = np.asarray(value)  # C order; np.ascontiguousarray alone would turn a 0-d array into shape (1,)
    if not value.flags.c_contiguous:
        value = np.ascontiguousarray(value)
    header = _npy_header(value.dtype, value.shape) if value.dtype.kind in _PLAIN_KINDS else None
    if header is None:  # anything else takes Flower's own path (which refuses object arrays: no pickles)
        return Array(value)
    return Array(_dtype_name(value.dtype), value.shape, NUMPY_STYPE, header + value.tobytes())


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """`str(dtype)`, the dtype name Flower's `Array(ndarray)` records (~1.5 us uncached)."""
    return str(dtype)


@functools.lru_cache(maxsize=512)
def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    """The .npy format 1.0 header `numpy.save` writes for a C-ordered array of `dtype` and `shape` (None when that
    header would not fit format 1.0: such arrays take `numpy.save` itself).

    Used both ways: to write a payload without `numpy.save`, and on receipt, where a payload that starts with exactly
    these bytes declares this dtype and shape in C order without its header being parsed (`ast.literal_eval`, ~40
    us). Any other header is parsed and checked in full (:func:`_decode`).
    """
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    buffer = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buffer, header)
    except ValueError:
        return None
    return buffer.getvalue()


def check_arrays(
    content: RecordDict,
    record: str,
    spec: ArraySpec,
    *,
    dtype: str = "float32",
    what: str = "message",
    max_abs: float | None = None,
) -> dict[str, np.ndarray]:
    """Return the arrays of `record`, after checking names, shapes, dtype and finite values against `spec`; with
    `max_abs`, also that no entry's magnitude exceeds it (a silo passes :data:`MAX_SERVER_VALUE` for what a server
    sends it to compute with).

    Each array's declared dtype and shape, then the dtype, shape and byte count in its .npy header, are checked
    before its payload is decoded: an array larger than the spec, or a payload that is not a plain .npy array (a
    zip archive, a pickle, a header that lies about the size), is refused without copying it.
    """
    if record not in content:
        raise MessageError(f"{what}: missing array record '{record}' (has: {sorted(content.keys())})")
    rec = content[record]
    if not isinstance(rec, ArrayRecord):
        raise MessageError(f"{what}: record '{record}' must be an ArrayRecord, got {type(rec).__name__}")
    expected = [name for name, _ in spec]
    names = list(rec.keys())
    if names != expected:
        missing = [n for n in expected if n not in names]
        unexpected = [n for n in names if n not in expected]
        raise MessageError(
            f"{what}: arrays in '{record}' are {_listing(names)}, expected {_listing(expected)} in that order"
            + (f"; missing {_listing(missing)}" if missing else "")
            + (f"; unexpected {_listing(unexpected)}" if unexpected else "")
        )
    want = np.dtype(dtype)
    out: dict[str, np.ndarray] = {}
    for name, shape in spec:
        where = f"{what}: array '{record}.{name}'"
        arr = rec[name]
        shape = tuple(shape)
        if arr.dtype != want.str and arr.dtype != dtype:
            raise MessageError(f"{where} has dtype {arr.dtype}, expected {dtype}")
        declared = arr.shape if isinstance(arr.shape, tuple) else None
        if declared != shape:
            raise MessageError(f"{where} has shape {arr.shape}, expected {shape}")
        value = _decode(arr, shape, want, where)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise MessageError(f"{where} contains NaN or infinite values")
        if max_abs is not None and value.size and (largest := float(np.abs(value).max())) > max_abs:
            raise MessageError(
                f"{where} has an entry of magnitude {largest:.6g}, above the {max_abs:g} this silo accepts from a "
                "server (values that large only serve to make a record's computation overflow)"
            )
        out[name] = value
    return out


def _listing(names: Sequence[str], limit: int = 20) -> str:
    if len(names) <= limit:
        return str(list(names))
    return f"{list(names[:limit])} and {len(names) - limit} more"


def _decode(arr: Array, shape: tuple[int, ...], dtype: np.dtype, where: str) -> np.ndarray:
    """The payload of `arr` as a writable C-ordered array, after checking its .npy header against (shape, dtype)."""
    if arr.stype != NUMPY_STYPE:
        raise MessageError(f"{where} is serialized as {arr.stype!r}, expected 'numpy.ndarray' (.npy bytes)")
    data = arr.data
    if not isinstance(data, bytes):
        raise MessageError(f"{where} has a payload of type {type(data).__name__}, expected bytes")
    expected = _npy_header(dtype, shape)
    if expected is not None and data.startswith(expected):  # exactly the header numpy writes for (dtype, shape)
        offset, fortran_order = len(expected), False
    else:
        stream = io.BytesIO(data)
        try:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(stream)
            elif version == (2, 0):
                header = np.lib.format.read_array_header_2_0(stream)
            else:
                raise ValueError(f".npy format version {version} (expected 1.0 or 2.0)")
        except Exception as exc:  # not .npy bytes: a zip archive (np.load would open it as .npz), a pickle, garbage
            raise MessageError(f"{where} cannot be decoded: not a .npy array payload ({exc})") from None
        header_shape, fortran_order, header_dtype = header
        if header_dtype != dtype or tuple(header_shape) != shape:
            raise MessageError(
                f"{where} decodes to {header_dtype}{tuple(header_shape)} although it declares {dtype}{shape}"
            )
        offset = stream.tell()
    size = math.prod(shape) * dtype.itemsize
    if len(data) - offset != size:
        raise MessageError(f"{where} holds {len(data) - offset} bytes of data, expected {size} for {dtype}{shape}")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return np.array(flat.reshape(shape, order="F" if fortran_order else "C"), order="C")
