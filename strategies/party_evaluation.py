"""The server's side of the parties' protocol beyond a round: their records (setup) and the grouped evaluation.

Setup (`server.parties`): :func:`feature_records` asks every feature party for its training ids and labels and its
test ids (``query.records``).

Evaluation when a feature party's policy answers evaluations noised (`SiloInfo.evaluation`): the feature parties do
not send their test predictions per record (as in the exact evaluation, where the sensitive parties count them by
group, `strategies.steffle_parties`). Instead

1. every sensitive party answers ``query.testgroups`` with the permanent randomized response of the group of each
   test record it holds, at the eps its policy names (:func:`randomized_groups`; `protocols.randomized_response`);
2. every feature party receives the model and the randomized groups of its own test records (ids from its setup
   records, :func:`grouped_messages`) and answers its counts by (source, randomized group, label, prediction) and its
   loss sum: exact, or a Gaussian histogram charged to its lifetime ledger, as its policy says;
3. the server sums them and undoes the randomized response per source (:func:`debiased_counts`), then computes the
   metrics from the estimated counts.

No per-record value leaves a party: the feature parties release histograms, the sensitive parties randomized groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from protocols import messages as msg
from protocols import parties as pm
from protocols.randomized_response import debias
from strategies.base import Federation, RoundError, collect_replies

__all__ = ["debiased_counts", "feature_records", "grouped_messages", "randomized_groups", "send_to"]


def send_to(grid: Grid, federation: Federation, entries, records: dict, kind: str, timeout: float):
    messages = [Message(RecordDict(dict(records)), e.node_id, kind, group_id=kind) for e in entries]
    return collect_replies(federation, 0, grid.send_and_receive(messages, timeout=timeout), kind, timeout, entries)


def feature_records(
    grid: Grid, federation: Federation, instruction: msg.TrainInstruction | msg.EvaluateInstruction, timeout: float
) -> list[dict[str, dict[str, np.ndarray]]]:
    """Step 1: per feature party (in id order), its train (ids, labels) and test (ids), checked against its setup."""
    out = []
    content = {msg.CONFIG: instruction.to_config_record()}
    for entry, reply in send_to(grid, federation, federation.silos, content, pm.RECORDS, timeout):
        what = f"records reply from {entry.name}"
        msg.check_records(reply.content, {pm.TRAIN_ROWS, pm.TEST_ROWS}, what=what)
        info = entry.info
        train = pm.read_columns(reply.content, pm.TRAIN_ROWS, ("ids", "labels"), max_rows=info.n_train, what=what)
        test = pm.read_columns(reply.content, pm.TEST_ROWS, ("ids",), max_rows=info.n_test, what=what)
        if len(train["ids"]) != info.n_train or len(test["ids"]) != info.n_test:
            raise RoundError(
                f"{what}: {len(train['ids'])} train and {len(test['ids'])} test ids, but its setup said "
                f"{info.n_train} and {info.n_test}"
            )
        for split, rows in (("train", train), ("test", test)):
            pm.check_ids(rows["ids"], f"{what} ({split})")
        labels = train["labels"]
        if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= info.num_labels):
            raise RoundError(f"{what}: training labels outside 0..{info.num_labels - 1}")
        out.append({"train": train, "test": test})
    return out


def randomized_groups(
    grid: Grid, federation: Federation, instruction: msg.EvaluateInstruction, timeout: float
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Step 1: every sensitive party's randomized groups of the test records it holds, as rows (ids, groups, sources:
    the index of the sensitive party in `federation.sensitive`), and each source's eps."""
    content = {msg.CONFIG: instruction.to_config_record()}
    columns, epsilons = [], []
    messages = [
        Message(RecordDict(dict(content)), e.node_id, pm.TEST_GROUPS, group_id=f"eval-{instruction.server_round}")
        for e in federation.sensitive
    ]
    sent = grid.send_and_receive(messages, timeout=timeout)
    replies = collect_replies(federation, instruction.server_round, sent, pm.TEST_GROUPS, timeout, federation.sensitive)
    num_groups = federation.info.num_groups
    for source, (entry, reply) in enumerate(replies):
        what = f"test groups reply from {entry.name} in round {instruction.server_round}"
        msg.check_records(reply.content, {pm.ROWS, msg.REPORT}, what=what)
        report = msg.read_config(reply.content, msg.TestGroupsReport, record=msg.REPORT, what=what)
        if report.silo_id != entry.info.silo_id or report.server_round != instruction.server_round:
            raise RoundError(f"{what}: the report is for party {report.silo_id}, round {report.server_round}")
        rows = pm.read_columns(reply.content, pm.ROWS, ("ids", "groups"), max_rows=entry.info.n_test, what=what)
        if len(rows["ids"]) != report.num_examples or report.num_examples != entry.info.n_test:
            raise RoundError(
                f"{what}: {len(rows['ids'])} rows, num-examples={report.num_examples}, but its setup said "
                f"{entry.info.n_test} test records"
            )
        pm.check_ids(rows["ids"], what)
        groups = rows["groups"]
        if groups.size and (int(groups.min()) < 0 or int(groups.max()) >= num_groups):
            raise RoundError(f"{what}: groups outside 0..{num_groups - 1}")
        columns.append({**rows, "sources": np.full(len(groups), source, dtype=np.int64)})
        epsilons.append(report.epsilon)
    rows = {key: np.concatenate([c[key] for c in columns]) for key in ("ids", "groups", "sources")}
    pm.check_ids(rows["ids"], f"round {instruction.server_round}: the sensitive parties' test records")
    return rows, epsilons


def grouped_messages(
    federation: Federation,
    test_ids: list[np.ndarray],
    rows: dict[str, np.ndarray],
    arrays: ArrayRecord,
    instruction: ConfigRecord,
    server_round: int,
) -> list[Message]:
    """Step 2: to each feature party, the model and the randomized groups of its own test records (RoundError if
    one of them is held by no sensitive party)."""
    grouped = msg.GroupedEvaluation(sources=len(federation.sensitive)).to_config_record()
    messages = []
    for entry, ids in zip(federation.silos, test_ids, strict=True):
        picked = pm.locate(rows["ids"], ids)
        if (picked < 0).any():
            raise RoundError(
                f"round {server_round}: {int((picked < 0).sum())} test records of {entry.name} have no randomized "
                "group from a sensitive party"
            )
        content: dict[str, Any] = {
            msg.MODEL: arrays,
            msg.CONFIG: instruction,
            pm.ROWS: pm.int_record(ids=ids, groups=rows["groups"][picked], sources=rows["sources"][picked]),
            pm.GROUPED: grouped,
        }
        messages.append(Message(RecordDict(content), entry.node_id, msg.EVALUATE, group_id=f"eval-{server_round}"))
    return messages


def debiased_counts(total: np.ndarray, epsilons: list[float]) -> np.ndarray:
    """Step 3: the counts by (true group, label, prediction) estimated from `total`, the feature parties' summed
    counts by (source, randomized group, label, prediction): the randomized response undone per source at its eps,
    summed, rounded and clipped at 0 (int64)."""
    if total.shape[0] != len(epsilons):
        raise ValueError(f"{total.shape[0]} sources of counts for {len(epsilons)} eps")
    estimate = sum(debias(total[s], eps) for s, eps in enumerate(epsilons))
    return np.clip(np.rint(estimate), 0, None).astype(np.int64)
