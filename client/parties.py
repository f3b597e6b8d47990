"""What every feature or sensitive party answers in an evaluation, whatever the algorithm (protocols/parties.py
lists the messages).

* feature party: ``query.loss`` (:func:`feature_loss`: its summed test loss under the broadcast model, exact or
  noised);
* sensitive party: ``query.confusion`` (:func:`confusion`: the (group, label, prediction) counts of the test records
  it received in the sealed exchange, predicted here by the broadcast model, exact or noised).

The fairness metrics need s, which only sensitive parties hold; they received the test records' features and labels
sealed at setup, so no per-record value leaves any party in an evaluation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from flwr.app import RecordDict

from silofl.client.data.topology import FeaturePartyData, SensitivePartyData
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols.fairness_metrics import confusion_counts

if TYPE_CHECKING:
    from silofl.client.noised_evaluation import NoisedRelease
    from silofl.client.sealed_records import SealedRecords


def feature_loss(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.EvaluateInstruction, noised: NoisedRelease | None = None
) -> RecordDict:
    """A feature party's summed test loss (its predictions are counted by the sensitive parties, which received its
    test records): exact, or `noised` (charged first). No per-record value leaves it."""
    from silofl.protocols.models import test_outputs

    if noised is not None:
        noised.charge(instr.server_round)
    _, loss_sum, losses = test_outputs(model, party.test.features, party.test.labels)
    if noised is not None:
        loss_sum = noised.loss(losses, instr.server_round)
    report = _report(party.party_id, instr.server_round, len(party.test_ids), loss_sum, noised)
    return RecordDict({msg.REPORT: report.to_metric_record()})


def confusion(
    model: torch.nn.Module,
    party: SensitivePartyData,
    records: SealedRecords,
    instr: msg.EvaluateInstruction,
    noised: NoisedRelease | None = None,
) -> RecordDict:
    """A sensitive party's counts by (group, label, prediction) of the test records it received, predicted here by
    the broadcast model: exact, or `noised` (charged first)."""
    from silofl.protocols.models import test_outputs

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
        pm.FEATURES: "query.setup, query.seal, train, query.loss",
        pm.SENSITIVE: "query.setup, query.holdings, query.unseal, query.groups, query.sensitive, query.confusion",
        pm.SILO: "the silo messages (query.setup, query.groups, query.correlation, train, evaluate)",
    }[role]
    return msg.MessageError(f"{node} has role {role!r} and does not answer {kind!r} messages; it answers {answers}")
