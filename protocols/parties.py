"""What the server and the parties of a topology say to each other (../shared/specs/steffle-hybrid.md).

A node's role is data: node config ``role`` (``silo``, the default, both divisions on one node; ``features``: record
ids, features and labels; ``sensitive``: record ids and sensitive groups). In a simulation the role follows from the
node's `partition-id` and the run's topology (:func:`simulated_role`): partitions 0..N-1 are the feature parties,
N..N+S-1 the sensitive ones.

Messages beyond those of :mod:`protocols.messages` (every message goes through the server: Flower is a hub):

* ``query.records`` server -> feature party: reply int64 records ``train-rows`` (ids, labels of its training records)
  and ``test-rows`` (ids of its test records). Ids and labels are non-sensitive in this model.
* ``query.coverage`` server -> sensitive party: ``train-rows`` / ``test-rows`` (ids, owner: the feature party of each
  id); reply int64 ``counts`` (train, test): per feature party, how many of its ids this party holds. Nothing is
  charged: whether a party holds an id is not its sensitive value. The server refuses a federation where some id is
  held by no sensitive party or by two, before anything private is computed.
* ``query.groups`` server -> sensitive party: ``train-rows`` (ids, labels) + the train instruction; reply as a silo's
  (noised (group, label) counts over the ids it holds).
* ``train`` server -> feature party: ``model`` + instruction; reply ``update`` (the SUM of the loss gradients over its
  Poisson sample), ``rows`` (ids, labels of the sampled records) and ``outputs`` (F(x_i), J_F(x_i)) + TrainReport.
* ``query.sensitive`` server -> every sensitive party, every round: ``fairness`` (W, prior), ``rows``, ``outputs``
  + instruction; reply ``fair-update`` (theta: the noised sum of clipped d psi / d theta, w: the noised sum of the
  s-dependent d psi / d W) + TrainReport, whatever it held of the requested ids.
* ``evaluate`` server -> feature party: ``model`` + EvaluateInstruction; reply ``rows`` (ids, labels, predictions of
  its test records) + EvaluateReport (summed loss).
* ``query.confusion`` server -> sensitive party: ``rows`` (ids, labels, predictions) + EvaluateInstruction; reply
  ``counts`` (group, label, prediction) over the ids it holds + EvaluateReport (num-examples: how many it held).

With ``share-rows sealed`` (the spec's "Revision": no record id, feature, label, output or Jacobian reaches the
server; `client.sealed_records`, `protocols.party_keys`) the setup exchanges sealed records once, and the rounds
carry the model and noised sums only (ExchangeSetup: `protocols.messages.ExchangeSetup`):

* ``query.holdings`` server -> sensitive party: ExchangeSetup; reply ``sealed``: one uint8 box per feature
  party (``features-<j>``), the pseudonyms of the records it holds, sealed to that party.
* ``query.seal`` server -> feature party: ExchangeSetup + ``sealed`` (the boxes addressed to it, by sender
  ``sensitive-<c>``); reply ``sealed`` (one box per sensitive party: the (pseudonym, x, y) of the records that party
  holds) + int64 ``counts`` (``unheld``, ``held-twice``: per split (train, test), the coverage check's counts).
* ``query.unseal`` server -> sensitive party: ExchangeSetup + ``sealed`` (by sender ``features-<j>``); reply
  int64 ``counts`` (``received``: train, test).
* ``query.groups`` to a sensitive party: the instruction only (it counts the records it received).
* ``train`` server -> feature party: ``model``, ``fairness`` + instruction; reply ``update`` (its mean loss gradient)
  and ``w-base`` (the s-independent part of the W-gradient, a mean over its sample) + TrainReport.
* ``query.sensitive`` server -> sensitive party: ``model``, ``fairness`` + instruction; reply ``fair-update`` (theta,
  w: the noised means over its own secret Poisson sample) + TrainReport (num-examples: the records it received).
* ``query.loss`` server -> feature party: ``model`` + EvaluateInstruction; reply EvaluateReport (its summed test loss,
  exact or noised as its policy says; no counts).
* ``query.confusion`` server -> sensitive party: ``model`` + EvaluateInstruction; reply ``counts`` of the test
  records it received, predicted by the model, + EvaluateReport.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from protocols.messages import MessageError, check_arrays

ROLE_KEY = "role"
SILO, FEATURES, SENSITIVE = "silo", "features", "sensitive"
ROLES = (SILO, FEATURES, SENSITIVE)

RECORDS = "query.records"
COVERAGE = "query.coverage"
SENSITIVE_QUERY = "query.sensitive"
CONFUSION = "query.confusion"
#: A sensitive party's randomized response of its test records' groups (a feature party's noised evaluation).
TEST_GROUPS = "query.testgroups"
#: The record of a grouped evaluate message (`protocols.messages.GroupedEvaluation`).
GROUPED = "grouped"

#: `share-rows sealed`: the record exchange of setup, and a feature party's test loss.
HOLDINGS_QUERY = "query.holdings"
SEAL_QUERY = "query.seal"
UNSEAL_QUERY = "query.unseal"
LOSS_QUERY = "query.loss"
#: The record of sealed boxes (uint8 arrays named by the party they are from or for) and of a feature party's
#: s-independent W-gradient part.
SEALED = "sealed"
W_BASE = "w-base"
#: The most bytes of one sealed box (a feature party's records for one sensitive party).
MAX_BOX_BYTES = 2**31 - 1

TRAIN_ROWS = "train-rows"
TEST_ROWS = "test-rows"
ROWS = "rows"
OUTPUTS = "outputs"


def boxes_record(boxes: Mapping[str, bytes]) -> ArrayRecord:
    """Sealed boxes as uint8 arrays named by party."""
    from protocols.messages import arrays_record

    return arrays_record({name: np.frombuffer(box, dtype=np.uint8) for name, box in boxes.items()})


def read_boxes(content: RecordDict, names: Sequence[str], *, what: str) -> dict[str, bytes]:
    """The sealed boxes of record ``sealed``: exactly one uint8 array per party of `names`."""
    rec = content.get(SEALED) if SEALED in content else None
    if not isinstance(rec, ArrayRecord):
        raise MessageError(f"{what}: missing array record '{SEALED}'")
    if sorted(rec.keys()) != sorted(names):
        raise MessageError(
            f"{what}: '{SEALED}' must hold one box from or for each of {', '.join(names)}, got {sorted(rec.keys())}"
        )
    out = {}
    for name in names:
        array = rec[name]
        if array.dtype != "uint8" or len(array.shape) != 1 or not 0 < array.shape[0] <= MAX_BOX_BYTES:
            raise MessageError(
                f"{what}: '{SEALED}.{name}' must be a non-empty 1-D uint8 array, got {array.dtype} {array.shape}"
            )
        out[name] = array.numpy().tobytes()
    return out


def simulated_role(partition_id: int, feature_parties: int, sensitive_parties: int) -> tuple[str, int]:
    """(role, party id) of simulated node `partition_id` (0..N-1 feature parties, then the sensitive ones)."""
    if sensitive_parties == 0:
        return SILO, partition_id
    if partition_id < feature_parties:
        return FEATURES, partition_id
    if partition_id < feature_parties + sensitive_parties:
        return SENSITIVE, partition_id - feature_parties
    raise MessageError(
        f"partition-id {partition_id} is outside the {feature_parties} feature and {sensitive_parties} sensitive "
        "parties of this run"
    )


def read_columns(
    content: RecordDict, record: str, names: Sequence[str], *, max_rows: int, what: str
) -> dict[str, np.ndarray]:
    """The int64 columns `names` of `record`, all of one length n <= `max_rows` (checked as `check_arrays` does)."""
    n = _rows_of(content, record, names[0], max_rows, what)
    return check_arrays(content, record, [(name, (n,)) for name in names], dtype="int64", what=what)


def read_outputs(
    content: RecordDict, *, rows: int, num_labels: int, num_params: int, what: str, max_abs: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(F (n, l), J_F (n, l, P)) of record ``outputs``, float32, for `rows` rows (entries at most `max_abs` in
    magnitude when given: a sensitive party's bound on what it computes with)."""
    arrays = check_arrays(
        content,
        OUTPUTS,
        [("outputs", (rows, num_labels)), ("jacobians", (rows, num_labels, num_params))],
        what=what,
        max_abs=max_abs,
    )
    return arrays["outputs"], arrays["jacobians"]


def int_record(**columns: np.ndarray) -> ArrayRecord:
    """Columns as an int64 ArrayRecord (ids, labels, predictions, owners)."""
    from protocols.messages import arrays_record

    return arrays_record({name: np.asarray(value, dtype=np.int64) for name, value in columns.items()})


def locate(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of `wanted`, its index in `ids` (unique record ids), or -1 where `ids` does not hold it."""
    if not len(ids):
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    where = np.minimum(np.searchsorted(ids[order], wanted), len(ids) - 1)
    return np.where(ids[order[where]] == wanted, order[where], -1).astype(np.int64)


def check_ids(ids: np.ndarray, what: str) -> None:
    """Record ids are >= 0 and each appears once."""
    if ids.size and int(ids.min()) < 0:
        raise MessageError(f"{what}: record ids must be >= 0, found {int(ids.min())}")
    if np.unique(ids).size != ids.size:
        raise MessageError(f"{what}: a record id appears twice; each record appears once")


def _rows_of(content: RecordDict, record: str, first: str, max_rows: int, what: str) -> int:
    rec = content.get(record) if record in content else None
    if not isinstance(rec, ArrayRecord) or first not in rec:
        raise MessageError(f"{what}: missing int64 array '{record}.{first}'")
    shape = tuple(rec[first].shape)
    if len(shape) != 1 or not 0 <= shape[0] <= max_rows:
        raise MessageError(f"{what}: '{record}.{first}' must have shape (n,) with n <= {max_rows}, got {shape}")
    return int(shape[0])
