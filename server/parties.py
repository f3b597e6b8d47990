"""The server's setup steps of a run with separate feature and sensitive parties (protocols/parties.py; spec
../shared/specs/steffle-hybrid.md, "Privacy (decisions)": P_S and P_{S|Y} from the sensitive parties' DP histograms,
the feature parties' (id, y) sent to them once, in setup).

1. ``query.records``: every feature party's training ids and labels, and its test ids;
2. ``query.coverage``: every sensitive party counts, per feature party, the ids it holds. The server refuses the run,
   before anything private is computed, when some feature party's id is held by no sensitive party or by two (naming
   the feature party and the split);
3. ``query.groups``: every sensitive party's noised (group, label) counts over the training ids it holds; the server
   sums them into the prior's counts, as it sums silos' counts.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from protocols import messages as msg
from protocols import parties as pm
from strategies.base import Federation, RoundError
from strategies.party_evaluation import feature_records, send_to


def check_coverage(
    grid: Grid, federation: Federation, records: list[dict[str, dict[str, np.ndarray]]], timeout: float
) -> None:
    """Step 2: every feature party's ids are held by exactly one sensitive party, else a RoundError naming it."""
    content: dict[str, ArrayRecord | ConfigRecord] = {msg.CONFIG: ConfigRecord({})}
    for split, record in (("train", pm.TRAIN_ROWS), ("test", pm.TEST_ROWS)):
        ids = np.concatenate([r[split]["ids"] for r in records])
        owner = np.concatenate([np.full(len(r[split]["ids"]), j, dtype=np.int64) for j, r in enumerate(records)])
        content[record] = pm.int_record(ids=ids, owner=owner)
    held = {"train": np.zeros(len(records), dtype=np.int64), "test": np.zeros(len(records), dtype=np.int64)}
    for entry, reply in send_to(grid, federation, federation.sensitive, content, pm.COVERAGE, timeout):
        what = f"coverage reply from {entry.name}"
        msg.check_records(reply.content, {msg.COUNTS}, what=what)
        counts = msg.check_arrays(
            reply.content, msg.COUNTS, [("train", (len(records),)), ("test", (len(records),))], dtype="int64", what=what
        )
        for split in held:
            held[split] += counts[split]
    for j, (entry, rows) in enumerate(zip(federation.silos, records, strict=True)):
        for split in ("train", "test"):
            n = len(rows[split]["ids"])
            if held[split][j] < n:
                raise RoundError(
                    f"{entry.name}: {n - held[split][j]} of its {n} {split} record ids are held by no sensitive "
                    "party, so their sensitive attributes are unknown; give every id's sensitive value to one "
                    "sensitive party (silofl data split --topology writes matching folders)"
                )
            if held[split][j] > n:
                raise RoundError(
                    f"{entry.name}: its {split} record ids are held {held[split][j]} times by the sensitive parties "
                    f"for {n} records; each record's sensitive value must be held by one sensitive party only"
                )


def groups_round(grid: Grid, federation: Federation, instruction: msg.TrainInstruction, timeout: float) -> np.ndarray:
    """Steps 1-3: the sum of the sensitive parties' noised (group, label) counts over the feature parties' records."""
    records = feature_records(grid, federation, instruction, timeout)
    check_coverage(grid, federation, records, timeout)
    train = pm.int_record(
        ids=np.concatenate([r["train"]["ids"] for r in records]),
        labels=np.concatenate([r["train"]["labels"] for r in records]),
    )
    from server.orchestrator import groups_round as ask_groups

    return ask_groups(
        grid, federation, instruction, timeout, entries=federation.sensitive, records={pm.TRAIN_ROWS: train}
    )
