"""What the server and the parties of a topology say to each other (SteFFLe Section 4).

A node's role is data: node config ``role`` (``silo``, the default, both divisions on one node; ``features``: record
ids, features and labels; ``sensitive``: record ids and sensitive groups). In a simulation the role follows from the
node's `partition-id` and the run's topology (:func:`simulated_role`): partitions 0..N-1 are the feature parties,
N..N+S-1 the sensitive ones.

Messages beyond those of :mod:`protocols.messages` (every message goes through the server: Flower is a hub). The setup
exchanges the feature parties' records once, sealed end to end (SECURITY.md, "`steffle` with separate parties": no
record id, feature, label, output or Jacobian reaches the server; `client.sealed_records`, `protocols.party_keys`), and
the rounds carry the model and noised means only (ExchangeSetup: `protocols.messages.ExchangeSetup`):

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

from silofl.protocols.messages import MessageError

ROLE_KEY = "role"
SILO, FEATURES, SENSITIVE = "silo", "features", "sensitive"
ROLES = (SILO, FEATURES, SENSITIVE)

SENSITIVE_QUERY = "query.sensitive"
CONFUSION = "query.confusion"
#: The record exchange of setup, and a feature party's test loss.
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


def boxes_record(boxes: Mapping[str, bytes]) -> ArrayRecord:
    """Sealed boxes as uint8 arrays named by party."""
    from silofl.protocols.messages import arrays_record

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


def int_record(**columns: np.ndarray) -> ArrayRecord:
    """Columns as an int64 ArrayRecord (the exchange's counts)."""
    from silofl.protocols.messages import arrays_record

    return arrays_record({name: np.asarray(value, dtype=np.int64) for name, value in columns.items()})
