"""SteFFLe's answers at separate parties (SteFFLe Section 4 and Appendix F; the sealed records of SECURITY.md,
"`steffle` with separate parties"), named by the `steffle` registry entry per role. Each sensitive party received, at
setup, the features and labels of the records whose sensitive attribute it holds (`client.party_exchange`, sealed end to
end), so a round is a silo's round split between two nodes:

* feature party, ``train``: :func:`feature_train` (a silo's non-sensitive division: the mean loss gradient and the
  mean s-independent part of the W-gradient over its Poisson sample at q = m / n_j). Nothing it sends depends on s.
* sensitive party, ``query.groups``: :func:`group_counts` (the (group, label) histogram of the records it received,
  noised as a silo's; its one-off ledger entry).
* sensitive party, ``query.sensitive``: :func:`sensitive_round` (a silo's sensitive division over the records it
  received: its own secret Poisson sample at the silos' rate, F and J_F computed from the broadcast model, the noised
  fairness gradients). Charged to its ledger BEFORE anything is computed: a party over its budget refuses, releasing
  nothing.

Privacy accounting of a sensitive party (SECURITY.md, "`steffle` with separate parties"): the silos' composed mechanism
under the replace-one relation on s: the one-off histogram (radius sqrt(2)/2, `counts-share` of the budget), then T
rounds of two Gaussian releases (theta and W, radii C and R_W = 2 / sqrt(rho), or the W rows scaled to radius 1 with
per-group W noise) at one noise multiplier, amplified by its secret Poisson sampling at rate q = min(1, m N / n)
(`SealedRecords.sampling_rate`): nobody else knows the sample.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from silofl.client import party_exchange, randomness
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData
from silofl.client.group_fairness import GROUP_COUNTS, group_prior, protects_record
from silofl.client.round_privacy import RoundPrivacy, digest
from silofl.client.rounds.steffle import _named, w_noise_of
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols.models import parameter_spec
from silofl.protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity
from silofl.protocols.privacy.mechanism import Mechanism, Release, SetupRelease
from silofl.protocols.steffle import GroupPrior


def mechanism(instr: msg.TrainInstruction, rate: float) -> Mechanism:
    """The sensitive party's run under the replace-one relation on s: the one-off histogram (`counts-share` of the
    budget), then T steps of two releases (the clipped theta gradients, radius C; the W gradients, whose radii follow
    from the group prior, bound at its first round) amplified by its own secret Poisson sample at `rate`
    (`SealedRecords.sampling_rate`, the silos' q)."""
    return Mechanism(
        relation="replace_one",
        sampling="poisson",
        sampling_rate=rate,
        steps=instr.total_rounds,
        releases=(Release("theta", radius=instr.clip), Release("w", radius=None)),
        setup=(SetupRelease(GROUP_COUNTS, share=instr.counts_share, radius=histogram_sensitivity("replace_one")),),
    )


def refuse_record(instr: msg.TrainInstruction, what: str) -> None:
    """Refuse whole-record privacy (`protect = record`, which the run config refuses with separate parties): a feature
    party's loss gradient would leave it un-noised, and a record's releases would be split between two ledgers. From
    the message alone, before anything is computed."""
    if protects_record(instr):
        raise msg.MessageError(
            f"{what}: the server asked for 'protect' = 'record', which separate feature and sensitive parties do not "
            "implement (a feature party sends its loss gradient un-noised); this party refuses (use topology silos "
            "for whole-record privacy)"
        )


def open_privacy(context: Context, party: SensitivePartyData, instr: msg.TrainInstruction, rate: float) -> RoundPrivacy:
    """The party's bound, calibrated mechanism for this run (`rate`: its sampling rate)."""
    return RoundPrivacy(
        context, instr, mechanism(instr, rate), who=f"sensitive party {party.party_id}", node_id=party.party_id
    )


def _keys(party_id: int, instr: msg.TrainInstruction, server_round: int) -> dict[str, int]:
    return {"seed": instr.seed, "silo_id": party_id, "server_round": server_round}


def _prior(content: RecordDict, info, instr: msg.TrainInstruction, what: str) -> tuple[GroupPrior, torch.Tensor, str]:
    """The group prior, W and the prior's digest (`RoundPrivacy.bind`) of a request (shapes from the fairness
    notion), as the silo mode reads them."""
    from silofl.protocols.steffle import w_shape

    prior_shape = (info.num_groups,) if instr.fairness == "dp" else (info.num_labels, info.num_groups)
    shape = w_shape(instr.fairness, info.num_groups, info.num_labels)
    fair = msg.check_arrays(
        content, msg.FAIRNESS, [("w", shape), ("prior", prior_shape)], what=what, max_abs=msg.MAX_SERVER_VALUE
    )
    try:
        prior = group_prior(instr.fairness, fair["prior"], info.num_labels)
    except ValueError as exc:
        raise msg.MessageError(f"{what}: invalid group prior: {exc}") from None
    return prior, torch.from_numpy(fair["w"]), digest(fair["prior"])


def _feature_report(party: FeaturePartyData, instr: msg.TrainInstruction, rate: float) -> msg.TrainReport:
    """A feature party's round report: its public size and sampling rate; no noise, no budget spent."""
    return msg.TrainReport(
        silo_id=party.party_id,
        server_round=instr.server_round,
        num_examples=len(party.train_ids),
        epsilon_spent=math.inf,
        noise_multiplier=0.0,
        sampling_rate=rate,
    )


def feature_train(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """A feature party's round: a silo's non-sensitive division (`client.algorithms.steffle`
    `nonsensitive_step`): on its Poisson sample at q = m / n_j, the mean loss gradient g_j and the mean
    s-independent part of the W-gradient, -2 W (.) F_i. No row leaves it; it reads no sensitive value."""
    from silofl.client.algorithms.steffle import nonsensitive_step

    what = f"train message to feature party {party.party_id} in round {instr.server_round}"
    refuse_record(instr, what)
    msg.check_records(message.content, {msg.CONFIG, msg.MODEL, msg.FAIRNESS}, what=what)
    prior, w, _ = _prior(message.content, party.info, instr, what)
    rate = min(1.0, instr.batch_size / len(party.train_ids))
    rng = randomness.numpy_rng(context, stream=randomness.SAMPLING, **_keys(party.party_id, instr, instr.server_round))
    g, w_base = nonsensitive_step(model, party.train, w=w, prior=prior, rate=rate, rng=rng)
    report = _feature_report(party, instr, rate)
    return RecordDict(
        {
            msg.UPDATE: msg.arrays_record(_named(g, parameter_spec(model))),
            pm.W_BASE: msg.arrays_record({"w": w_base.detach().numpy().astype(np.float32)}),
            msg.REPORT: report.to_metric_record(),
        }
    )


feature_train.records_for = lambda instr: frozenset({msg.FAIRNESS})  # type: ignore[attr-defined]


def group_counts(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """The (group, label) counts of the training records this party received in the sealed exchange; a Gaussian
    histogram of radius sqrt(2)/2 unless the run is non-private (as a silo's)."""
    what = f"groups message to sensitive party {party.party_id}"
    refuse_record(instr, what)
    info = party.info
    msg.check_records(message.content, {msg.CONFIG}, what=what)
    records = party_exchange.stored(context, what)
    rate = records.sampling_rate(instr.batch_size)
    counts = np.zeros((info.num_groups, info.num_labels), dtype=np.float64)
    np.add.at(counts, (records.train_groups.groups, records.train.labels), 1.0)
    privacy = open_privacy(context, party, instr, rate)
    spent = math.inf
    if privacy.private:
        spent = privacy.charge_setup()
        release = GaussianMechanism(
            sensitivity=histogram_sensitivity("replace_one"), noise_multiplier=privacy.setup_multiplier
        )
        counts = release.release(torch.from_numpy(counts), privacy.generator(server_round=0)).numpy()
    report = msg.GroupsReport(silo_id=party.party_id, epsilon_spent=spent)
    return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})


def sensitive_round(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """A sensitive party's round (Algorithm 1, line 8; Appendix F): a silo's sensitive division
    (`client.algorithms.steffle` `fairness_gradients`) over the records it received: its own secret Poisson sample at
    the silos' rate q, F and J_F computed here from the broadcast model, per-record clipped d psi / d theta and the
    s-dependent W-gradient, noised, divided by q n_c. Charged BEFORE anything is computed (a party over its budget
    refuses). The mechanism is the silos' amplified one: nobody else knows the sample."""
    from silofl.client.algorithms.steffle import fairness_gradients
    from silofl.client.app import _model_from_arrays

    what = f"sensitive query to sensitive party {party.party_id} in round {instr.server_round}"
    refuse_record(instr, what)
    msg.check_records(message.content, {msg.CONFIG, msg.FAIRNESS, msg.MODEL}, what=what)
    info = party.info
    prior, w, prior_digest = _prior(message.content, info, instr, what)
    records = party_exchange.stored(context, what)
    model = _model_from_arrays(message, info, instr, what, context)  # checked first
    rate = records.sampling_rate(instr.batch_size)
    privacy = open_privacy(context, party, instr, rate)
    privacy.bind("prior", prior_digest)
    spent = math.inf
    if privacy.private:
        spent = privacy.charge()  # once the message passed every check, before anything is computed or released
    h_theta, h_w = fairness_gradients(
        model,
        records.train,
        records.train_groups,
        w=w,
        prior=prior,
        rate=rate,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        rng=privacy.rng(randomness.SENSITIVE_SAMPLING),
        generator=privacy.generator(randomness.NOISE),
        w_noise=w_noise_of(instr.w_noise),
    )
    report = privacy.report(num_examples=len(records.train), sampling_rate=rate, spent=spent)
    fair = {"theta": h_theta.detach().numpy().astype(np.float32), "w": h_w.detach().numpy().astype(np.float32)}
    return RecordDict({msg.FAIR_UPDATE: msg.arrays_record(fair), msg.REPORT: report.to_metric_record()})
