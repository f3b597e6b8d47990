"""What every feature or sensitive party answers, whatever the algorithm (protocols/parties.py lists the messages).

* feature party: ``query.records`` (:func:`records`: the ids and labels of its training records, the ids of its test
  records) and ``evaluate`` (:func:`feature_evaluate`: predictions on its test records, its summed loss; or, given
  the sensitive parties' randomized groups, :func:`grouped_evaluate`: its counts by (source, group, label,
  prediction), exact or noised);
* sensitive party: ``query.coverage`` (:func:`coverage`: how many of each feature party's ids it holds),
  ``query.confusion`` (:func:`confusion`: the (group, label, prediction) counts of the test records it holds, exact
  or noised) and ``query.testgroups`` (:func:`test_groups`: the permanent randomized response of its test records'
  groups).

The fairness metrics need s, which only sensitive parties hold. Exactly: the feature parties send test predictions
(id, yhat, y) and the sensitive parties count them by group. Under a feature party's ``evaluation = "noised"``
nothing per record leaves a party: the sensitive parties send randomized groups, the feature parties noised counts
(`strategies.party_evaluation` on the server's side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import Message, RecordDict

from client.data.topology import FeaturePartyData, SensitivePartyData
from protocols import messages as msg
from protocols import parties as pm
from protocols.fairness_metrics import confusion_counts

if TYPE_CHECKING:
    from client.noised_evaluation import NoisedRelease
    from client.sealed_records import SealedRecords

MAX_ROWS = 10_000_000
MAX_PARTIES = 1000


def records(party: FeaturePartyData, message: Message) -> RecordDict:
    """The feature party's record ids (and training labels), for the server's coverage check and the sensitive
    parties' group counts."""
    msg.check_records(message.content, {msg.CONFIG}, what=f"records query to feature party {party.party_id}")
    return RecordDict(
        {
            pm.TRAIN_ROWS: pm.int_record(ids=party.train_ids, labels=party.train.labels),
            pm.TEST_ROWS: pm.int_record(ids=party.test_ids),
        }
    )


def coverage(party: SensitivePartyData, message: Message) -> RecordDict:
    """Per feature party, how many of its train and test ids this party holds (ids are public; s is not read)."""
    what = f"coverage query to sensitive party {party.party_id}"
    msg.check_records(message.content, {msg.CONFIG, pm.TRAIN_ROWS, pm.TEST_ROWS}, what=what)
    rows = {
        split: pm.read_columns(message.content, record, ("ids", "owner"), max_rows=MAX_ROWS, what=what)
        for split, record in (("train", pm.TRAIN_ROWS), ("test", pm.TEST_ROWS))
    }
    owners = np.concatenate([r["owner"] for r in rows.values()])
    if owners.size and not 0 <= int(owners.min()) <= int(owners.max()) < MAX_PARTIES:
        raise msg.MessageError(f"{what}: 'owner' must be a feature party index in 0..{MAX_PARTIES - 1}")
    width = int(owners.max()) + 1 if owners.size else 0
    held = {"train": party.train_ids, "test": party.test_ids}
    counts = {
        split: np.bincount(r["owner"][np.isin(r["ids"], held[split])], minlength=width) for split, r in rows.items()
    }
    return RecordDict({msg.COUNTS: pm.int_record(**counts)})


def feature_evaluate(model: torch.nn.Module, party: FeaturePartyData, instr: msg.EvaluateInstruction) -> RecordDict:
    """Predictions on the party's test records (id, y, yhat) and the summed loss; the sensitive parties count them."""
    from protocols.models import test_outputs

    predictions, loss_sum, _ = test_outputs(model, party.test.features, party.test.labels)
    report = msg.EvaluateReport(
        silo_id=party.party_id,
        server_round=instr.server_round,
        num_examples=len(party.test_ids),
        loss_sum=loss_sum,
        noise_std=0.0,
    )
    return RecordDict(
        {
            pm.ROWS: pm.int_record(ids=party.test_ids, labels=party.test.labels, predictions=predictions),
            msg.REPORT: report.to_metric_record(),
        }
    )


def grouped_evaluate(
    model: torch.nn.Module,
    party: FeaturePartyData,
    message: Message,
    instr: msg.EvaluateInstruction,
    noised: NoisedRelease | None = None,
) -> RecordDict:
    """Counts of the party's test records by (source, randomized group, label, prediction), the randomized groups
    those the sensitive parties answered (`protocols.randomized_response`), sent in the message's rows, and the summed
    loss: exact, or `noised` (charged once the message is validated, before anything is computed). Every test record
    of the party must have exactly one row; rows of other records are ignored. No per-record value leaves the party."""
    from protocols.models import test_outputs

    what = f"evaluate message to feature party {party.party_id}"
    grouped = msg.read_config(message.content, msg.GroupedEvaluation, record=pm.GROUPED, what=what)
    rows = pm.read_columns(message.content, pm.ROWS, ("ids", "groups", "sources"), max_rows=MAX_ROWS, what=what)
    pm.check_ids(rows["ids"], what)
    info = party.info
    for name, bound in (("groups", info.num_groups), ("sources", grouped.sources)):
        values = rows[name]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= bound):
            raise msg.MessageError(f"{what}: '{pm.ROWS}.{name}' must be in 0..{bound - 1}")
    picked = pm.locate(rows["ids"], party.test_ids)
    if (picked < 0).any():
        raise msg.MessageError(
            f"{what}: {int((picked < 0).sum())} of its {len(picked)} test records have no row (id, randomized group); "
            "every test record must be counted under the group its sensitive party answered"
        )
    if noised is not None:
        noised.charge(instr.server_round)
    predictions, loss_sum, losses = test_outputs(model, party.test.features, party.test.labels)
    L = info.num_labels
    cells = ((rows["sources"][picked] * info.num_groups + rows["groups"][picked]) * L + party.test.labels) * L
    shape = (grouped.sources, info.num_groups, L, L)
    counts = np.bincount(cells + predictions, minlength=int(np.prod(shape))).astype(np.int64).reshape(shape)
    noise_std = 0.0
    if noised is not None:
        counts, loss_sum = noised.counts_and_loss(counts, losses, instr.server_round)
        noise_std = noised.std
    return msg.evaluation_content(party.party_id, instr.server_round, len(party.test_ids), counts, loss_sum, noise_std)


def test_groups(party: SensitivePartyData, message: Message, secret: bytes, epsilon: float) -> RecordDict:
    """The randomized response of the group of every test record this party holds (ids, groups), permanent for
    `secret` and `epsilon` (`protocols.randomized_response`); the caller charged it first."""
    from protocols.randomized_response import permanent_groups

    what = f"test groups query to sensitive party {party.party_id}"
    msg.check_records(message.content, {msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    groups = permanent_groups(secret, party.test_ids, party.test_groups, epsilon, party.info.num_groups)
    report = msg.TestGroupsReport(
        silo_id=party.party_id, server_round=instr.server_round, num_examples=len(groups), epsilon=epsilon
    )
    return RecordDict(
        {pm.ROWS: pm.int_record(ids=party.test_ids, groups=groups), msg.REPORT: report.to_config_record()}
    )


def confusion(party: SensitivePartyData, message: Message, noised: NoisedRelease | None = None) -> RecordDict:
    """Counts by (group, label, prediction) of the requested test ids this party holds (num-examples: how many);
    exact, or `noised` (charged once the query is validated, before the counts are computed)."""
    what = f"confusion query to sensitive party {party.party_id}"
    msg.check_records(message.content, {msg.CONFIG, pm.ROWS}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    info = party.info
    rows = pm.read_columns(message.content, pm.ROWS, ("ids", "labels", "predictions"), max_rows=MAX_ROWS, what=what)
    pm.check_ids(rows["ids"], what)
    for name in ("labels", "predictions"):
        values = rows[name]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= info.num_labels):
            raise msg.MessageError(f"{what}: '{pm.ROWS}.{name}' must be in 0..{info.num_labels - 1}")
    if noised is not None:
        noised.charge(instr.server_round)
    index = pm.locate(party.test_ids, rows["ids"])
    held = np.flatnonzero(index >= 0)
    groups = party.test_groups[index[held]]
    counts = confusion_counts(groups, rows["labels"][held], rows["predictions"][held], info.num_groups, info.num_labels)
    if noised is not None:
        counts = noised.counts(counts, instr.server_round)
    report = msg.EvaluateReport(
        silo_id=party.party_id,
        server_round=instr.server_round,
        num_examples=len(held),
        loss_sum=0.0,
        noise_std=0.0 if noised is None else noised.std,
    )
    return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})


def feature_loss(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.EvaluateInstruction, noised: NoisedRelease | None = None
) -> RecordDict:
    """A feature party's summed test loss with sealed records (its predictions are counted by the sensitive parties,
    which received its test records): exact, or `noised` (charged first). No per-record value leaves it."""
    from protocols.models import test_outputs

    if noised is not None:
        noised.charge(instr.server_round)
    _, loss_sum, losses = test_outputs(model, party.test.features, party.test.labels)
    if noised is not None:
        loss_sum = noised.loss(losses, instr.server_round)
    report = _report(party.party_id, instr.server_round, len(party.test_ids), loss_sum, noised)
    return RecordDict({msg.REPORT: report.to_metric_record()})


def confusion_sealed(
    model: torch.nn.Module,
    party: SensitivePartyData,
    records: SealedRecords,
    instr: msg.EvaluateInstruction,
    noised: NoisedRelease | None = None,
) -> RecordDict:
    """A sensitive party's counts by (group, label, prediction) of the test records it received, predicted here by
    the broadcast model: exact, or `noised` (charged first)."""
    from protocols.models import test_outputs

    if noised is not None:
        noised.charge(instr.server_round)
    info = party.info
    predictions, _, _ = test_outputs(model, records.test.features, records.test.labels)
    counts = confusion_counts(
        records.test_groups.groups, records.test.labels, predictions, info.num_groups, info.num_labels
    )
    if noised is not None:
        counts = noised.counts(counts, instr.server_round)
    report = _report(party.party_id, instr.server_round, len(records.test), 0.0, noised)
    return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})


def _report(
    party_id: int, server_round: int, num_examples: int, loss_sum: float, noised: NoisedRelease | None
) -> msg.EvaluateReport:
    return msg.EvaluateReport(
        silo_id=party_id,
        server_round=server_round,
        num_examples=num_examples,
        loss_sum=loss_sum,
        noise_std=0.0 if noised is None else noised.std,
    )


def role_error(role: str, kind: str, node: str) -> msg.MessageError:
    """A message a node of `role` does not answer (the server sent it to the wrong party)."""
    answers = {
        pm.FEATURES: "query.setup, query.records, query.seal, train, evaluate, query.loss",
        pm.SENSITIVE: "query.setup, query.coverage, query.holdings, query.unseal, query.groups, query.sensitive, "
        "query.confusion, query.testgroups",
        pm.SILO: "the silo messages (query.setup, query.groups, query.correlation, train, evaluate)",
    }[role]
    return msg.MessageError(f"{node} has role {role!r} and does not answer {kind!r} messages; it answers {answers}")
