"""The server's setup steps of a run with separate feature and sensitive parties (protocols/parties.py; the sealed
records of SECURITY.md, "`steffle` with separate parties"; P_S and P_{S|Y} from the sensitive parties' DP histograms).

1. :func:`sealed_exchange` (at every start of a job, a resumed one too: the sensitive parties keep the records for
   the run only): the feature parties' records reach the sensitive parties that hold their attributes, sealed end to
   end and joined by pseudonym; the server relays bytes it cannot read and refuses the run, before anything private
   is computed, when a feature party's record is held by no sensitive party or by two (naming the party and split);
2. `server.orchestrator.groups_round`: every sensitive party's noised (group, label) counts over the records it
   received; the server sums them into the prior's counts, as it sums silos' counts.

No record id, pseudonym, feature or label reaches the server.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols import party_keys as pk
from silofl.strategies.federation import Federation, RoundError
from silofl.strategies.replies import collect_replies


def send_to(grid: Grid, federation: Federation, entries, records: dict, kind: str, timeout: float):
    """One message of `records` to each of `entries`, the replies matched to the entries in id order."""
    messages = [Message(RecordDict(dict(records)), e.node_id, kind, group_id=kind) for e in entries]
    return collect_replies(federation, 0, grid.send_and_receive(messages, timeout=timeout), kind, timeout, entries)


def _individual(grid: Grid, federation: Federation, entries, contents: list[dict], kind: str, timeout: float):
    """One message per entry (its own content), the replies matched to the entries in id order."""
    messages = [
        Message(RecordDict(content), e.node_id, kind, group_id=kind)
        for e, content in zip(entries, contents, strict=True)
    ]
    return collect_replies(federation, 0, grid.send_and_receive(messages, timeout=timeout), kind, timeout, entries)


def sealed_exchange(grid: Grid, federation: Federation, timeout: float) -> dict[str, np.ndarray]:
    """The sealed record exchange (`client.sealed_records`): the server relays boxes it cannot open and learns the
    coverage counts and how many records each sensitive party received (train, test; returned by party name).
    RoundError, before anything private is computed, when a feature party's record is held by no sensitive party or
    by two (naming the feature party and the split), or a box is missing or malformed."""
    features, sensitive = federation.silos, federation.sensitive
    f_names = [pk.feature_name(e.info.silo_id) for e in features]
    s_names = [pk.sensitive_name(e.info.silo_id) for e in sensitive]
    if sorted(f_names) != pk.party_names(len(features), 0) or sorted(s_names) != [
        pk.sensitive_name(c) for c in range(len(sensitive))
    ]:
        raise RoundError(
            f"the parties' ids must be 0..{len(features) - 1} (feature) and 0..{len(sensitive) - 1} (sensitive) to "
            f"exchange sealed records, got {', '.join(f_names + s_names)}"
        )
    config = msg.ExchangeSetup(feature_parties=len(features), sensitive_parties=len(sensitive)).to_config_record()
    holdings = {}
    for entry, reply in send_to(grid, federation, sensitive, {msg.CONFIG: config}, pm.HOLDINGS_QUERY, timeout):
        what = f"holdings reply from {entry.name}"
        msg.check_records(reply.content, {pm.SEALED}, what=what)
        holdings[pk.sensitive_name(entry.info.silo_id)] = pm.read_boxes(reply.content, f_names, what=what)
    contents = [{msg.CONFIG: config, pm.SEALED: pm.boxes_record({s: holdings[s][f] for s in s_names})} for f in f_names]
    records = {}
    for entry, reply in _individual(grid, federation, features, contents, pm.SEAL_QUERY, timeout):
        what = f"seal reply from {entry.name}"
        msg.check_records(reply.content, {pm.SEALED, msg.COUNTS}, what=what)
        records[pk.feature_name(entry.info.silo_id)] = pm.read_boxes(reply.content, s_names, what=what)
        counts = msg.check_arrays(
            reply.content, msg.COUNTS, [("unheld", (2,)), ("held-twice", (2,))], dtype="int64", what=what
        )
        _check_sealed_coverage(entry, counts)
    contents = [{msg.CONFIG: config, pm.SEALED: pm.boxes_record({f: records[f][s] for f in f_names})} for s in s_names]
    received = {}
    for entry, reply in _individual(grid, federation, sensitive, contents, pm.UNSEAL_QUERY, timeout):
        what = f"unseal reply from {entry.name}"
        msg.check_records(reply.content, {msg.COUNTS}, what=what)
        counts = msg.check_arrays(reply.content, msg.COUNTS, [("received", (2,))], dtype="int64", what=what)
        received[pk.sensitive_name(entry.info.silo_id)] = counts["received"]
    for k, split in enumerate(("train", "test")):
        want = sum(e.info.n_train if split == "train" else e.info.n_test for e in features)
        got = int(sum(int(r[k]) for r in received.values()))
        if got != want:
            raise RoundError(
                f"the sensitive parties received {got} {split} records of the feature parties' {want}; every record "
                "must reach the one sensitive party that holds its attribute"
            )
    return received


def _check_sealed_coverage(entry, counts: dict[str, np.ndarray]) -> None:
    """A feature party's coverage counts of the sealed exchange: none of its records unheld or held twice."""
    for k, split in enumerate(("train", "test")):
        n = entry.info.n_train if split == "train" else entry.info.n_test
        if counts["unheld"][k]:
            raise RoundError(
                f"{entry.name}: {counts['unheld'][k]} of its {n} {split} records are held by no sensitive party, so "
                "their sensitive attributes are unknown; give every record's sensitive value to one sensitive party "
                "(silofl data split --topology writes matching folders)"
            )
        if counts["held-twice"][k]:
            raise RoundError(
                f"{entry.name}: {counts['held-twice'][k]} of its {n} {split} records are held by two or more "
                "sensitive parties; each record's sensitive value must be held by one sensitive party only"
            )
