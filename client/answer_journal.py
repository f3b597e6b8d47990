"""A silo's journal of its answers: each round of a job is answered once, and a round asked again gets that answer.

A silo with a `state-dir` (`client.privacy_state`) keeps, per message kind, the last answer it computed, in its job
file, written to disk BEFORE the answer is released (:func:`answered`, which also clears the pending charge). When a
round is asked again (a restarted server, a lost reply), :func:`replay` compares the request with the journaled one
(:func:`request_digest`): the same request gets the journaled answer byte for byte (a second copy of one release
costs no privacy); a different request for an answered round of a private job is refused (a second answer would be a
second release of the silo's data). A silo without `state-dir` journals nothing and computes every answer.

The journal lives in `context.state`, next to the ledger: ``silofl.journal.<kind>`` (round, request digest, record
names) and ``silofl.journal.<kind>/<record>`` (the reply's records).
"""

from __future__ import annotations

import hashlib
import json

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict

from silofl.client.privacy_state import PENDING_KEY, persist, persistent, private_job
from silofl.protocols.messages import MessageError, TrainInstruction
from silofl.protocols.record_codec import encode_value

#: The last answer of each message kind: `silofl.journal.<kind>` (round, request digest, record names) and
#: `silofl.journal.<kind>/<record>` (the reply's records).
JOURNAL_KEY = "silofl.journal"


def request_digest(content: RecordDict) -> str:
    """SHA-256 of a request's records (names, array bytes, config values): what a replayed answer must match."""
    h = hashlib.sha256()
    for name in sorted(content.keys()):
        record = content[name]
        h.update(f"\x00{name}\x00{type(record).__name__}\x00".encode())
        if isinstance(record, ArrayRecord):
            for key, array in record.items():
                h.update(f"{key}\x00{array.dtype}\x00{tuple(array.shape)}\x00".encode())
                h.update(array.data)
        else:
            h.update(json.dumps({k: encode_value(v) for k, v in record.items()}, sort_keys=True).encode())
    return h.hexdigest()


def replay(context: Context, kind: str, instr: TrainInstruction, digest: str, *, what: str) -> RecordDict | None:
    """The journaled answer to this very request, if the silo already answered it (None: compute it).

    A different request for a round the silo answered is refused in a private job (a second answer would be a
    second release of its data); in a non-private one the answer is simply computed again.
    """
    name = f"{JOURNAL_KEY}.{kind}"
    if not persistent(context) or name not in context.state:
        return None
    meta = context.state[name]
    if int(meta["round"]) != instr.server_round:
        return None
    if meta["digest"] != digest:
        if not private_job(instr):
            return None
        raise MessageError(
            f"{what}: this silo already answered round {instr.server_round} ({kind}) of this job, to a different "
            "request; a second answer would be a second release of its data, so it refuses (a resumed server "
            "sends the same request again; a new job needs another seed)"
        )
    return RecordDict({rec: _copy_record(context.state[f"{name}/{rec}"]) for rec in meta["records"]})


def answered(context: Context, kind: str, server_round: int, digest: str, content: RecordDict) -> None:
    """The answer is computed and about to be released: clear the pending charge; with a state-dir, journal the
    answer and write everything to disk first."""
    if PENDING_KEY in context.state:
        del context.state[PENDING_KEY]
    if not persistent(context):
        return
    name = f"{JOURNAL_KEY}.{kind}"
    for old in [key for key in context.state if key.startswith(name + "/")]:
        del context.state[old]
    for rec, record in content.items():
        context.state[f"{name}/{rec}"] = _copy_record(record)
    context.state[name] = ConfigRecord({"round": server_round, "digest": digest, "records": list(content.keys())})
    persist(context)


def _copy_record(record: ConfigRecord | MetricRecord | ArrayRecord) -> ConfigRecord | MetricRecord | ArrayRecord:
    """A copy sharing nothing mutable (array payloads are immutable bytes)."""
    if isinstance(record, ArrayRecord):
        return ArrayRecord({key: Array(a.dtype, tuple(a.shape), a.stype, a.data) for key, a in record.items()})
    values = {k: list(v) if isinstance(v, list) else v for k, v in record.items()}
    return MetricRecord(values) if isinstance(record, MetricRecord) else ConfigRecord(values)
