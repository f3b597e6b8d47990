"""A malicious server against one silo, through the real ClientApp (`client.app.app`), message by message.

What a test needs to check that a silo's differential privacy holds against a server that forges what it sends:

* neighbouring data sets D and D', built exactly (:func:`make_silo`, :func:`replace_record`, :func:`change_attribute`,
  :func:`append_record`, :func:`sensitive_party`) and written as deployed nodes' folders (node config `data-path`,
  `deterministic-noise = true`: both nodes draw the same seeded samples and noise, as `tests/silo_driver.py` does);
  twin sensitive parties receive their feature party's records by :func:`sealed_exchange`, as an honest relay gives
  them;
* :class:`Twins`: the two nodes, each answering through the real ClientApp; every message goes to both, byte for byte
  the same (a copy each, as a transport makes);
* forged messages of every kind a silo or a sensitive party answers (:func:`train`, :func:`groups`,
  :func:`correlation`; a sensitive party's ``query.sensitive`` holds what a SteFFLe silo's ``train`` does), with any
  values the schemas accept and any arrays (:func:`tabular_model`, :func:`ssl_model`);
* :func:`behaviour_difference`: "same behaviour" of two replies. Either both are errors with the same reason, or
  neither is, and then they hold the same records, the same arrays (names, shapes, dtypes), every float finite, and
  the records that carry no noise byte for byte the same (the report always; for steffle and tran also `update`,
  computed without s, unless the job protects whole records). The noised records (:func:`noised_records`) may differ
  in value only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from silofl.client import silo_data
from silofl.client.app import app
from silofl.client.data.party_store import save_party
from silofl.client.data.silo_store import save_silo
from silofl.client.data.tabular import DatasetInfo, SiloData, Split, make_split
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols import party_keys as pk
from silofl.protocols.models import build_model, parameter_spec
from silofl.server.inprocess_grid import copy_content, deliver

Arrays = dict[str, np.ndarray]
Data = SiloData | SensitivePartyData

#: The setup message every node gets first (a deployed node reads its own folder; the spec names no data of it).
SPEC = msg.DataSpec(dataset="synthetic", num_silos=1)


# -- data: a silo whose records the test controls exactly ----------------------------------------------------------
def make_silo(
    n: int,
    *,
    num_features: int = 4,
    num_labels: int = 2,
    num_groups: int = 2,
    seed: int = 0,
    low: float = 0.0,
    high: float = 1.0,
    n_test: int = 4,
) -> SiloData:
    """A silo of `n` training records: features uniform in [low, high] (float32), labels and groups uniform."""
    rng = np.random.default_rng(seed)
    info = DatasetInfo(
        name="malicious-server",
        feature_names=tuple(f"x{i}" for i in range(num_features)),
        label_names=tuple(f"y{i}" for i in range(num_labels)),
        sensitive_columns=("s",),
        group_names=tuple(f"g{i}" for i in range(num_groups)),
    )

    def split(size: int) -> Split:
        x = rng.uniform(low, high, (size, num_features))
        return make_split(x, rng.integers(0, num_labels, size), rng.integers(0, num_groups, size))

    return SiloData(info=info, silo_id=0, num_silos=1, train=split(n), test=split(n_test))


def with_train(silo: SiloData, features: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> SiloData:
    """`silo` with these training records (its test split unchanged)."""
    return dataclasses.replace(silo, train=make_split(features, labels, groups))


def _columns(silo: SiloData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    train = silo.train
    return train.nonsensitive.features.copy(), train.nonsensitive.labels.copy(), train.sensitive.groups.copy()


def replace_record(silo: SiloData, index: int, x: np.ndarray, y: int, s: int) -> SiloData:
    """The record-level neighbour: record `index` replaced by (x, y, s), features, label and attribute."""
    features, labels, groups = _columns(silo)
    features[index], labels[index], groups[index] = x, y, s
    return with_train(silo, features, labels, groups)


def change_attribute(silo: SiloData, index: int, s: int | None = None) -> SiloData:
    """The attribute-level neighbour: only record `index`'s sensitive attribute changed (to `s`, default the next
    group)."""
    features, labels, groups = _columns(silo)
    groups[index] = (groups[index] + 1) % silo.info.num_groups if s is None else s
    return with_train(silo, features, labels, groups)


def append_record(silo: SiloData, x: np.ndarray, y: int, s: int) -> SiloData:
    """The add/remove neighbour: `silo` with (x, y, s) appended after its last training record."""
    features, labels, groups = _columns(silo)
    return with_train(silo, np.vstack([features, x[None]]), np.append(labels, y), np.append(groups, s))


def sensitive_party(silo: SiloData) -> SensitivePartyData:
    """The sensitive division of `silo` as a separate sensitive party (record ids 0..n-1, test ids after them)."""
    n, m = len(silo.train), len(silo.test)
    return SensitivePartyData(
        silo.info,
        0,
        np.arange(n, dtype=np.int64),
        silo.train.sensitive.groups.copy(),
        np.arange(n, n + m, dtype=np.int64),
        silo.test.sensitive.groups.copy(),
    )


def feature_party(silo: SiloData) -> FeaturePartyData:
    """The non-sensitive division of `silo` as feature party 0, the partner of :func:`sensitive_party` (same ids)."""
    n, m = len(silo.train), len(silo.test)
    return FeaturePartyData(
        silo.info,
        0,
        np.arange(n, dtype=np.int64),
        silo.train.nonsensitive,
        np.arange(n, n + m, dtype=np.int64),
        silo.test.nonsensitive,
    )


#: The party secret of twin sensitive parties (node config `party-secret`): the keys :func:`sealed_exchange` uses.
PARTY_SECRET = "22" * 32


# -- nodes ---------------------------------------------------------------------------------------------------------
#: The Flower run id of every node here.
RUN_ID = 7


class Node:
    """One deployed node (a silo, or a sensitive party) on its own folder, answering through the real ClientApp with
    seeded randomness (`deterministic-noise = true`)."""

    def __init__(self, data: Data, folder: Path, **node_config: Any) -> None:
        self.data = data
        config: dict[str, Any] = {"data-path": str(folder), "deterministic-noise": True}
        if isinstance(data, SensitivePartyData):
            save_party(data, folder, num_parties=1)
            config[pm.ROLE_KEY] = pm.SENSITIVE
        else:
            save_silo(data, folder)
        self.context = Context(
            run_id=RUN_ID, node_id=5, node_config={**config, **node_config}, state=RecordDict(), run_config={}
        )

    @contextmanager
    def _data(self) -> Iterator[None]:
        yield

    def send(self, kind: str, content: RecordDict, server_round: int = 1) -> Message:
        """Deliver `content` as a message of type `kind` (an exception in the ClientApp becomes an error reply)."""
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, 1
        message = Message(content, 5, kind, group_id=str(server_round))
        message.metadata.__dict__["_message_id"] = f"{kind}-{server_round}"
        with self._data():
            return deliver(app, message, self.context)

    def setup(self) -> msg.SiloInfo:
        reply = self.send(msg.SETUP, RecordDict({msg.CONFIG: SPEC.to_config_record()}), 0)
        assert not reply.has_error(), reply.error.reason
        return msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)


class SimulatedNode(Node):
    """A simulated silo (node config `partition-id`, no `data-path`: not a deployed node) that holds exactly `data`:
    the partition it derives from the setup message is replaced by `data` while it answers."""

    def __init__(self, data: SiloData, **node_config: Any) -> None:
        self.data = data
        config = {"partition-id": 0, "num-partitions": 1, **node_config}
        self.context = Context(run_id=7, node_id=5, node_config=config, state=RecordDict(), run_config={})

    @contextmanager
    def _data(self) -> Iterator[None]:
        with mock.patch.object(silo_data, "_partitioned", lambda spec: (self.data,)):
            yield


class Twins:
    """Nodes on the neighbouring data sets D and D', sent the same messages (a copy each, byte for byte the same)."""

    def __init__(self, d: Data, d_prime: Data, folder: Path, *, simulated: bool = False, **node_config: Any) -> None:
        if simulated:
            assert isinstance(d, SiloData) and isinstance(d_prime, SiloData)
            self.nodes = (SimulatedNode(d, **node_config), SimulatedNode(d_prime, **node_config))
        else:
            self.nodes = (Node(d, folder / "d", **node_config), Node(d_prime, folder / "d_prime", **node_config))
        infos = [node.setup() for node in self.nodes]
        assert infos[0].num_features == infos[1].num_features
        self.info = infos[0]

    def send(self, kind: str, content: RecordDict, server_round: int = 1) -> tuple[Message, Message]:
        """Both replies to the message `content` of type `kind`."""
        first, second = (node.send(kind, copy_content(content), server_round) for node in self.nodes)
        return first, second


# -- forged messages -----------------------------------------------------------------------------------------------
def instruction(algorithm: str, **values: Any) -> ConfigRecord:
    """The train instruction of `algorithm` with `values` (any the schema accepts)."""
    return msg.TrainInstruction.for_algorithm(algorithm, **values).to_config_record()


def train(
    algorithm: str,
    params: Mapping[str, np.ndarray],
    *,
    records: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    **values: Any,
) -> RecordDict:
    """A train message: the model's arrays `params`, the instruction and the algorithm's other array records (`records`:
    fairness for steffle and tran, previous for mu2fl and noisy-sgd, global-loss for fedfdp, others for fedsc)."""
    content = RecordDict({msg.MODEL: msg.arrays_record(params), msg.CONFIG: instruction(algorithm, **values)})
    for name, arrays in (records or {}).items():
        content[name] = msg.arrays_record(arrays)
    return content


def groups(algorithm: str, **values: Any) -> RecordDict:
    """A silo's `query.groups` (steffle, tran): the instruction of round 1."""
    return RecordDict({msg.CONFIG: instruction(algorithm, **{"server_round": 1, **values})})


def correlation(params: Mapping[str, np.ndarray], **values: Any) -> RecordDict:
    """FedSC's `query.correlation`: the model's arrays `params` and the instruction."""
    return RecordDict({msg.MODEL: msg.arrays_record(params), msg.CONFIG: instruction("fedsc", **values)})


def sealed_exchange(twins: Twins, silo: SiloData) -> None:
    """Give both twin sensitive parties (node config `party-secret` = :data:`PARTY_SECRET`) the records of
    :func:`feature_party` (`silo`), as the honest exchange does: the server asks their holdings, feature party 0 seals
    its records to them (`client.sealed_records.record_boxes`, with its keys), and both unseal the same boxes. The
    records carry no sensitive attribute, so the boxes are the same for D and D'."""
    from silofl.client.sealed_records import record_boxes

    config = msg.ExchangeSetup(feature_parties=1, sensitive_parties=1).to_config_record()
    first, second = twins.send(pm.HOLDINGS_QUERY, RecordDict({msg.CONFIG: config}), 0)
    for reply in (first, second):
        assert not reply.has_error(), reply.error.reason
    keys = pk.simulated_keys(bytes.fromhex(PARTY_SECRET), pk.party_names(1, 1))
    holdings = pm.read_boxes(first.content, [pk.feature_name(0)], what="holdings")[pk.feature_name(0)]
    boxes, _ = record_boxes(
        keys[pk.feature_name(0)], feature_party(silo), {pk.sensitive_name(0): holdings}, f"run:{RUN_ID}"
    )
    relayed = {pk.feature_name(0): boxes[pk.sensitive_name(0)]}  # by sender, as the server relays them
    content = RecordDict({msg.CONFIG: config, pm.SEALED: pm.boxes_record(relayed)})
    for reply in twins.send(pm.UNSEAL_QUERY, content, 0):
        assert not reply.has_error(), reply.error.reason


def tabular_spec(kind: str, num_features: int, num_labels: int, hidden: int = 64) -> list[tuple[str, tuple[int, ...]]]:
    """The parameter names and shapes of the logreg or MLP a silo builds (`protocols.models.build_model`)."""
    return parameter_spec(build_model(kind, num_features, num_labels, hidden=hidden))


def tabular_model(
    kind: str, num_features: int, num_labels: int, *, hidden: int = 64, fill: float = 0.0, dtype: Any = np.float32
) -> Arrays:
    """Every parameter of the logreg or MLP set to `fill` (float32; float64 for mu2fl's query points)."""
    spec = tabular_spec(kind, num_features, num_labels, hidden)
    return {name: np.full(shape, fill, dtype=dtype) for name, shape in spec}


def ssl_model(num_features: int, *, projection_dim: int, width: int = 1, kind: str = "cnn") -> Arrays:
    """Zeros for every parameter of FedSC's SSL model (`protocols.ssl_models.build_ssl_model`)."""
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    model = build_ssl_model(kind, image_shape(num_features), projection_dim=projection_dim, width=width, seed=0)
    return {name: np.zeros(shape, np.float32) for name, shape in parameter_spec(model)}


def fairness_shapes(info: msg.SiloInfo, fairness: str = "dp") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(W or multipliers shape, prior shape) for the fairness notion (`protocols.steffle.w_shape`)."""
    k, labels = info.num_groups, info.num_labels
    prior = (k,) if fairness == "dp" else (labels, k)
    w = (labels, k, labels) if fairness == "eo" else (k, labels)
    return w, prior


# -- "same behaviour" ----------------------------------------------------------------------------------------------
def noised_records(algorithm: str, kind: str, protect: str = "sensitive") -> frozenset[str]:
    """The records of a reply to a message of type `kind` that carry the algorithm's noise (they may differ between
    D and D' in value); every other record must be byte for byte the same. `protect`: the job's mode (steffle and
    tran with ``record`` noise their loss gradient `update` too)."""
    if kind in (msg.GROUPS,):
        return frozenset({msg.COUNTS})
    if kind == msg.CORRELATION:
        return frozenset({msg.CORRELATION_MATRIX})
    if algorithm in ("steffle", "tran") and protect == "record":
        return frozenset({msg.UPDATE, msg.FAIR_UPDATE})
    if kind == pm.SENSITIVE_QUERY or algorithm in ("steffle", "tran"):
        return frozenset({msg.FAIR_UPDATE})
    if algorithm == "fedfdp":
        return frozenset({msg.UPDATE, msg.LOSS_RELEASE})
    return frozenset({msg.UPDATE})


def _record_text(record: Any) -> str:
    """A config or metric record's items, exactly (float bits through repr; -0.0 and 0.0 differ)."""
    return repr(sorted((key, _exact(value)) for key, value in dict(record).items()))


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return value.hex() if math.isfinite(value) else repr(value)
    if isinstance(value, list):
        return [_exact(v) for v in value]
    return value


def behaviour_difference(first: Message, second: Message, noised: Collection[str]) -> str | None:
    """What makes the two replies behave differently (None: the same behaviour, see the module docstring)."""
    if first.has_error() or second.has_error():
        if first.has_error() and second.has_error():
            a, b = first.error.reason, second.error.reason
            return None if a == b else f"both refuse, for different reasons: D {a!r}; D' {b!r}"
        who, other = ("D", second) if first.has_error() else ("D'", first)
        reason = (first if first.has_error() else second).error.reason
        return f"only {who} refuses ({reason!r}); the other answers {sorted(other.content.keys())}"
    a, b = first.content, second.content
    if sorted(a.keys()) != sorted(b.keys()):
        return f"records differ: D {sorted(a.keys())}, D' {sorted(b.keys())}"
    for name in sorted(a.keys()):
        ra, rb = a[name], b[name]
        if type(ra) is not type(rb):
            return f"record {name!r} is a {type(ra).__name__} for D, a {type(rb).__name__} for D'"
        if isinstance(ra, ConfigRecord | MetricRecord):
            if _record_text(ra) != _record_text(rb):
                return f"record {name!r} differs: D {dict(ra)}, D' {dict(rb)}"
            continue
        assert isinstance(ra, ArrayRecord)
        if list(ra.keys()) != list(rb.keys()):
            return f"arrays of {name!r} differ: D {list(ra.keys())}, D' {list(rb.keys())}"
        for key in ra:
            va, vb = ra[key].numpy(), rb[key].numpy()
            if va.shape != vb.shape or va.dtype != vb.dtype:
                return f"{name}.{key}: D {va.dtype}{va.shape}, D' {vb.dtype}{vb.shape}"
            for who, value in (("D", va), ("D'", vb)):
                if value.dtype.kind == "f" and not np.isfinite(value).all():
                    bad = int((~np.isfinite(value)).sum())
                    return f"{name}.{key} of {who} holds {bad} non-finite values of {value.size} ({_sample(value)})"
            if name not in noised and va.tobytes() != vb.tobytes():
                gap = float(np.max(np.abs(va.astype(np.float64) - vb.astype(np.float64)))) if va.size else 0.0
                return f"{name}.{key} carries no noise but differs between D and D' (max gap {gap:.3g})"
    return None


def _sample(value: np.ndarray) -> str:
    flat = value.ravel()
    return "[" + ", ".join(f"{v:.3g}" for v in flat[:4]) + (", ...]" if flat.size > 4 else "]")


def assert_same_behaviour(first: Message, second: Message, noised: Collection[str], what: str = "") -> None:
    """Fail, saying how, unless the two replies behave the same."""
    problem = behaviour_difference(first, second, noised)
    assert problem is None, f"{what}: {problem}" if what else problem


def error_reason(reply: Message) -> str:
    """The error reason of a refused reply (fails if the node answered)."""
    assert reply.has_error(), f"the node answered (records {sorted(reply.content.keys())}) where a refusal was expected"
    return reply.error.reason


def arrays_of(reply: Message, record: str) -> Arrays:
    """The arrays of one record of an answered reply."""
    assert not reply.has_error(), reply.error.reason
    return {key: array.numpy() for key, array in reply.content[record].items()}
