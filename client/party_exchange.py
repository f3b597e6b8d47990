"""A party's side of the sealed record exchange (`client.sealed_records` has the steps and what
each party learns): its keys, its three answers, and the records a sensitive party keeps for the run.

Keys (`protocols.party_keys`): a deployed party's node config names its key file (``party-keys``, written by
`silofl deploy certs`); a simulated party derives its keys from the run's secret (``party-secret``, put in its node
config by the simulation engine, `server.inprocess_grid` or `server.engines` for Ray, never in the ServerApp's). A
party without either refuses the exchange, naming both.

The records a sensitive party received live in its node state (:data:`SEALED_KEY`) for the run: a SuperNode keeps a
node's state between messages, and a simulated run's checkpoint leaves them out (`server.inprocess_grid`); the server
runs the exchange again when a run resumes. Nothing here is charged: the records carry no sensitive attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.app import Context, Message, RecordDict

from silofl.client import sealed_records
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData
from silofl.client.privacy_state import SEALED_RECORDS_KEY
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols import party_keys as pk

PARTY_KEYS_KEY, PARTY_SECRET_KEY = pk.PARTY_KEYS_KEY, pk.PARTY_SECRET_KEY
#: Node state: the records this sensitive party received (`sealed_records.SealedRecords` as arrays); in memory only
#: (`client.privacy_state` leaves it out of the job file).
SEALED_KEY = SEALED_RECORDS_KEY

__all__ = ["PARTY_KEYS_KEY", "PARTY_SECRET_KEY", "SEALED_KEY", "holdings", "party_keys", "receive", "seal", "stored"]


def party_keys(context: Context, name: str, setup: msg.ExchangeSetup, what: str) -> pk.PartyKeys:
    """This party's keys (named `name`), checked to cover every party of `setup`."""
    config = context.node_config
    try:
        if PARTY_KEYS_KEY in config:
            keys = _load(str(config[PARTY_KEYS_KEY]))
        elif PARTY_SECRET_KEY in config:
            names = tuple(pk.party_names(setup.feature_parties, setup.sensitive_parties))
            keys = _simulated(str(config[PARTY_SECRET_KEY]), names)[name]
        else:
            raise pk.PartyKeyError(
                f"this party has no keys: give it node config '{PARTY_KEYS_KEY}' (its key file from `silofl deploy "
                "certs`; `silofl silo start --party-keys FILE`)"
            )
        if keys.name != name:
            raise pk.PartyKeyError(
                f"the key file is {keys.name}'s, but this node is {name}: give each party its own file"
            )
        keys.check_parties(setup.feature_parties, setup.sensitive_parties)
    except pk.PartyKeyError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None
    return keys


@lru_cache(maxsize=8)
def _load(path: str) -> pk.PartyKeys:
    return pk.PartyKeys.load(path)


@lru_cache(maxsize=4)
def _simulated(secret_hex: str, names: tuple[str, ...]) -> dict[str, pk.PartyKeys]:
    try:
        secret = bytes.fromhex(secret_hex)
    except ValueError:
        raise pk.PartyKeyError(f"node config '{PARTY_SECRET_KEY}' must be hexadecimal") from None
    return pk.simulated_keys(secret, names)


def job(context: Context) -> str:
    """What a box is bound to besides its parties and purpose: the run (both parties see Flower's run id)."""
    return f"run:{context.run_id}"


@dataclass(frozen=True)
class _Request:
    """A validated exchange message at a party: the federation's shape, the party's keys, the boxes it carries."""

    setup: msg.ExchangeSetup
    keys: pk.PartyKeys
    boxes: dict[str, bytes]


def _request(context: Context, message: Message, role: str, party_id: int, senders: str | None, what: str) -> _Request:
    """Check `message` (ExchangeSetup, and boxes from every party of role `senders` unless None) at party `party_id`
    of `role` and load its keys."""
    content = message.content
    msg.check_records(content, {msg.CONFIG} | ({pm.SEALED} if senders else set()), what=what)
    setup = msg.read_config(content, msg.ExchangeSetup, what=what)
    count = setup.feature_parties if role == pm.FEATURES else setup.sensitive_parties
    if party_id >= count:
        raise msg.MessageError(
            f"{what}: this is {role} party {party_id}, but the message says the federation has {count}"
        )
    name = pk.feature_name(party_id) if role == pm.FEATURES else pk.sensitive_name(party_id)
    keys = party_keys(context, name, setup, what)
    boxes = {}
    if senders is not None:
        names = pk.party_names(setup.feature_parties, setup.sensitive_parties)
        boxes = pm.read_boxes(content, [n for n in names if n.startswith(senders + "-")], what=what)
    return _Request(setup, keys, boxes)


def holdings(context: Context, party: SensitivePartyData, message: Message) -> RecordDict:
    """Step 1 at a sensitive party: its records' pseudonyms, sealed to each feature party."""
    what = f"holdings query to sensitive party {party.party_id}"
    request = _request(context, message, pm.SENSITIVE, party.party_id, None, what)
    boxes = sealed_records.holdings_boxes(request.keys, party, request.setup.feature_parties, job(context))
    return RecordDict({pm.SEALED: pm.boxes_record(boxes)})


def seal(context: Context, party: FeaturePartyData, message: Message, evaluation: str) -> RecordDict:
    """Step 2 at a feature party: its records, sealed to the sensitive party that holds each; its coverage counts.
    `evaluation`: how its policy answers evaluations (the sensitive parties count its test records under it)."""
    what = f"seal query to feature party {party.party_id}"
    request = _request(context, message, pm.FEATURES, party.party_id, "sensitive", what)
    try:
        sealed, coverage = sealed_records.record_boxes(request.keys, party, request.boxes, job(context), evaluation)
    except pk.SealError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None
    counts = {
        "unheld": np.array([coverage.unheld[s] for s in sealed_records.SPLITS]),
        "held-twice": np.array([coverage.held_twice[s] for s in sealed_records.SPLITS]),
    }
    return RecordDict({pm.SEALED: pm.boxes_record(sealed), msg.COUNTS: pm.int_record(**counts)})


def receive(context: Context, party: SensitivePartyData, message: Message) -> RecordDict:
    """Step 3 at a sensitive party: open, check and keep the feature parties' records (replacing any earlier)."""
    what = f"unseal query to sensitive party {party.party_id}"
    request = _request(context, message, pm.SENSITIVE, party.party_id, "features", what)
    try:
        records = sealed_records.receive_records(
            request.keys, party, request.boxes, request.setup.feature_parties, job(context)
        )
    except pk.SealError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None
    context.state[SEALED_KEY] = msg.arrays_record(records.to_arrays())
    received = np.array([len(records.train), len(records.test)])
    return RecordDict({msg.COUNTS: pm.int_record(received=received)})


def stored(context: Context, what: str) -> sealed_records.SealedRecords:
    """The records this sensitive party received in the run's exchange (a MessageError if it has none)."""
    if SEALED_KEY not in context.state:
        raise msg.MessageError(
            f"{what}: this sensitive party holds no sealed records for this run; the server runs the exchange "
            f"({pm.HOLDINGS_QUERY}, {pm.SEAL_QUERY}, {pm.UNSEAL_QUERY}) before the first round"
        )
    record = context.state[SEALED_KEY]
    return sealed_records.SealedRecords.from_arrays({name: record[name].numpy() for name in record})
