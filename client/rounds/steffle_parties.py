"""SteFFLe's answers at separate parties (../shared/specs/steffle-hybrid.md; SteFFLe Section 4 and Appendix F): the
transport side of :mod:`client.algorithms.steffle_parties`, named by the `steffle` registry entry per role.

* feature party, ``train``: :func:`feature_train` (step 1 of a round: the loss-gradient SUM over its Poisson sample
  at q_f = m / n_j, and the rows (id, y, F, J_F) of the sampled records). Nothing it sends depends on any s.
* sensitive party, ``query.groups``: :func:`group_counts` (the (group, label) histogram of the requested training
  ids it holds, noised as a silo's; its one-off ledger entry).
* sensitive party, ``query.sensitive``: :func:`sensitive_round` (step 2: the noised sums over the requested ids it
  holds, each kept with its own secret coin at q_s). Charged to its ledger BEFORE anything is computed, whatever it
  holds of the request: a party over its budget refuses, releasing nothing.

Privacy accounting of a sensitive party (spec, "Privacy (decisions)"): one composed mechanism under the replace-one
relation on s: the one-off histogram (radius sqrt(2)/2, `counts-share` of the budget), then T rounds of two Gaussian
releases (theta and W sums, radii C and R_W = 2 / sqrt(rho), or the W rows scaled to radius 1 with per-group W
noise) at one noise multiplier, amplified by its own secret sampling at rate q_s only (q_s = 1: un-amplified). The
feature parties chose which records were requested, so their sampling gives no amplification here; the bound holds
for any request, even the same ids every round.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from client import party_exchange, randomness
from client.algorithms import steffle_parties as algo
from client.data.topology import FeaturePartyData, SensitivePartyData
from client.round_privacy import RoundPrivacy, digest
from client.rounds.steffle import GROUP_COUNTS, _named, group_prior, w_noise_of
from protocols import messages as msg
from protocols import parties as pm
from protocols.ermi import GroupPrior
from protocols.models import parameter_spec
from protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity
from protocols.privacy.mechanism import Mechanism, Release, SetupRelease

#: The most rows one request may carry: every feature party's whole training split (checked against n by the server).
MAX_ROWS = 10_000_000


def mechanism(instr: msg.TrainInstruction, rate: float | None = None) -> Mechanism:
    """The sensitive party's run under the replace-one relation on s: the one-off histogram (`counts-share` of the
    budget), then T steps of two releases (the clipped theta sum, radius C; the W sum, whose radii follow from the
    group prior, bound at its first round) amplified by its own secret coins at `rate` only: q_s (keep-rate; 1:
    un-amplified) for rows the feature parties sent, or with sealed records the rate of its own Poisson sample of
    them (`SealedRecords.sampling_rate`, the silos' q)."""
    return Mechanism(
        relation="replace_one",
        sampling="poisson",
        sampling_rate=instr.keep_rate if rate is None else rate,
        steps=instr.total_rounds,
        releases=(Release("theta", radius=instr.clip), Release("w", radius=None)),
        setup=(SetupRelease(GROUP_COUNTS, share=instr.counts_share, radius=histogram_sensitivity("replace_one")),),
    )


def open_privacy(
    context: Context, party: SensitivePartyData, instr: msg.TrainInstruction, rate: float | None = None
) -> RoundPrivacy:
    """The party's bound, calibrated mechanism for this run (`rate`: its sampling rate with sealed records)."""
    return RoundPrivacy(
        context, instr, mechanism(instr, rate), who=f"sensitive party {party.party_id}", node_id=party.party_id
    )


def sealed(instr: msg.TrainInstruction) -> bool:
    """Whether the run's parties exchanged their records sealed at setup (`share-rows sealed`)."""
    return instr.share_rows == "sealed"


def _keys(party_id: int, instr: msg.TrainInstruction, server_round: int) -> dict[str, int]:
    return {"seed": instr.seed, "silo_id": party_id, "server_round": server_round}


def _prior(content: RecordDict, info, instr: msg.TrainInstruction, what: str) -> tuple[GroupPrior, torch.Tensor, str]:
    """The group prior, W and the prior's digest (`RoundPrivacy.bind`) of a request (shapes from the fairness
    notion), as the silo mode reads them."""
    from protocols.ermi import w_shape

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


def _labels_in_range(labels: np.ndarray, num_labels: int, what: str) -> None:
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_labels):
        raise msg.MessageError(f"{what}: labels must be in 0..{num_labels - 1}")


def feature_train(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """Step 1 (Algorithm 1, line 7 at a feature party): the mean loss gradient over a Poisson sample at q_f = m / n_j,
    and the (id, y) and (F(x_i), J_F(x_i)) of the sampled records (or of all its records, `share-rows = all`). Reads
    no sensitive value; adds no noise. With sealed records: :func:`feature_train_sealed`."""
    if sealed(instr):
        return feature_train_sealed(model, party, instr, context, message)
    rate = min(1.0, instr.batch_size / len(party.train_ids))
    rng = randomness.numpy_rng(context, stream=randomness.SAMPLING, **_keys(party.party_id, instr, instr.server_round))
    grad_sum, sampled, rows = algo.feature_party_step(
        model,
        party.train_ids,
        party.train.features,
        party.train.labels,
        rate=rate,
        rng=rng,
        all_rows=instr.share_rows == "all",
    )
    g = grad_sum / max(sampled, 1)  # the mean over the sample: the silo mode's g_j (zeros for an empty sample)
    spec = parameter_spec(model)
    report = _feature_report(party, instr, rate)
    return RecordDict(
        {
            msg.UPDATE: msg.arrays_record(_named(g, spec)),
            pm.ROWS: pm.int_record(ids=rows.ids, labels=rows.labels.numpy()),
            pm.OUTPUTS: msg.arrays_record(
                {
                    "outputs": rows.outputs.numpy().astype(np.float32),
                    "jacobians": rows.jacobians.numpy().astype(np.float32),
                }
            ),
            msg.REPORT: report.to_metric_record(),
        }
    )


feature_train.records_for = lambda instr: frozenset({msg.FAIRNESS}) if sealed(instr) else frozenset()  # type: ignore[attr-defined]


def feature_train_sealed(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """A feature party's round with sealed records: a silo's non-sensitive division (`client.algorithms.steffle`
    `nonsensitive_step`): on its Poisson sample at q = m / n_j, the mean loss gradient g_j and the mean
    s-independent part of the W-gradient, -2 W (.) F_i. No row leaves it; it reads no sensitive value."""
    from client.algorithms.steffle import nonsensitive_step

    what = f"train message to feature party {party.party_id} in round {instr.server_round}"
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


def group_counts(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """The (group, label) counts of the requested training ids this party holds (labels from the feature parties,
    sent once in setup); a Gaussian histogram of radius sqrt(2)/2 unless the run is non-private (as a silo's)."""
    what = f"groups message to sensitive party {party.party_id}"
    info = party.info
    counts = np.zeros((info.num_groups, info.num_labels), dtype=np.float64)
    rate = None
    if sealed(instr):  # the labels of the records it received
        msg.check_records(message.content, {msg.CONFIG}, what=what)
        records = party_exchange.stored(context, what)
        rate = records.sampling_rate(instr.batch_size)
        np.add.at(counts, (records.train_groups.groups, records.train.labels), 1.0)
    else:
        msg.check_records(message.content, {msg.CONFIG, pm.TRAIN_ROWS}, what=what)
        rows = pm.read_columns(message.content, pm.TRAIN_ROWS, ("ids", "labels"), max_rows=MAX_ROWS, what=what)
        pm.check_ids(rows["ids"], what)
        _labels_in_range(rows["labels"], info.num_labels, what)
        positions, groups = algo.SensitiveParty(*party.sorted_train).lookup(rows["ids"])
        np.add.at(counts, (groups, rows["labels"][positions]), 1.0)
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
    """Step 2 (Algorithm 1, line 8 at a sensitive party; Appendix F): the noised sums of the clipped d psi / d theta
    and of the s-dependent d psi / d W over the requested ids it holds, each kept with its secret coin at q_s. The
    reply has the same shape and noise whether it held none, some or all of the ids (the paper's dummy noise).
    With sealed records: :func:`sensitive_round_sealed`."""
    if sealed(instr):
        return sensitive_round_sealed(party, instr, context, message)
    what = f"sensitive query to sensitive party {party.party_id} in round {instr.server_round}"
    msg.check_records(message.content, {msg.CONFIG, msg.FAIRNESS, pm.ROWS, pm.OUTPUTS}, what=what)
    info = party.info
    prior, w, prior_digest = _prior(message.content, info, instr, what)
    num_params = _num_params(instr, info)
    rows = pm.read_columns(message.content, pm.ROWS, ("ids", "labels"), max_rows=MAX_ROWS, what=what)
    pm.check_ids(rows["ids"], what)
    _labels_in_range(rows["labels"], info.num_labels, what)
    outputs, jacobians = pm.read_outputs(
        message.content,
        rows=len(rows["ids"]),
        num_labels=info.num_labels,
        num_params=num_params,
        what=what,
        max_abs=msg.MAX_SERVER_VALUE,
    )
    outputs = outputs_as_probabilities(outputs, what)
    privacy = open_privacy(context, party, instr)
    privacy.bind("prior", prior_digest)
    spent = math.inf
    if privacy.private:
        # Charged BEFORE anything is computed or released: a refused answer releases nothing.
        spent = privacy.charge()
    theta, w_sum = algo.sensitive_party_step(
        algo.SensitiveParty(*party.sorted_train),
        algo.FeatureRows(
            rows["ids"], torch.from_numpy(rows["labels"]), torch.from_numpy(outputs), torch.from_numpy(jacobians)
        ),
        w=w,
        prior=prior,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        keep_rate=instr.keep_rate,
        rng=privacy.rng(randomness.SENSITIVE_SAMPLING),
        generator=privacy.generator(randomness.NOISE),
        w_noise=w_noise_of(instr.w_noise),
    )
    report = privacy.report(num_examples=len(party.train_ids), sampling_rate=instr.keep_rate, spent=spent)
    fair = {"theta": theta.numpy().astype(np.float32), "w": w_sum.numpy().astype(np.float32)}
    return RecordDict({msg.FAIR_UPDATE: msg.arrays_record(fair), msg.REPORT: report.to_metric_record()})


def sensitive_round_sealed(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """A sensitive party's round with sealed records: a silo's sensitive division (`client.algorithms.steffle`
    `fairness_gradients`) over the records it received: its own secret Poisson sample at the silos' rate q, F and
    J_F computed here from the broadcast model, per-record clipped d psi / d theta and the s-dependent W-gradient,
    noised, divided by q n_c. Charged BEFORE anything is computed (a party over its budget refuses). The mechanism
    is the silos' amplified one: nobody else knows the sample."""
    from client.algorithms.steffle import fairness_gradients
    from client.app import _model_from_arrays

    what = f"sensitive query to sensitive party {party.party_id} in round {instr.server_round}"
    msg.check_records(message.content, {msg.CONFIG, msg.FAIRNESS, msg.MODEL}, what=what)
    info = party.info
    prior, w, prior_digest = _prior(message.content, info, instr, what)
    records = party_exchange.stored(context, what)
    rate = records.sampling_rate(instr.batch_size)
    privacy = open_privacy(context, party, instr, rate)
    privacy.bind("prior", prior_digest)
    spent = math.inf
    if privacy.private:
        spent = privacy.charge()  # before anything is computed or released
    model = _model_from_arrays(message, info, instr.model, getattr(instr, "hidden", 64), what)
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


#: How far a row of outputs F may sum above 1 (float32 rounding of a softmax) before the message is refused.
PROBABILITY_SLACK = 1e-4


def outputs_as_probabilities(outputs: np.ndarray, what: str) -> np.ndarray:
    """The outputs F(x_i) a feature party sent, as probability vectors: every entry in [0, 1] and each row's sum at
    most 1 (a row that sums to more, by float rounding within `PROBABILITY_SLACK`, is scaled down to sum 1, up to
    float32 rounding).

    The W release's radius 2 / sqrt(rho) holds because ||F_i||_2 <= ||F_i||_1 <= 1 (Lemma D.1's W part is
    2 e_(s_i) F_i^T / sqrt(p(s_i))). Outputs are the feature party's, relayed by the server: a forged row of large
    entries would put record i's attribute outside the ball the noise covers. A message with any other outputs is
    refused (that depends on the message only), and the scaling keeps the bound exact."""
    if outputs.size and (float(outputs.min()) < 0.0 or float(outputs.max()) > 1.0):
        raise msg.MessageError(f"{what}: 'outputs' must be probabilities in [0, 1] (a softmax), got entries outside")
    sums = outputs.sum(axis=1, dtype=np.float64)
    if sums.size and float(sums.max()) > 1.0 + PROBABILITY_SLACK:
        raise msg.MessageError(f"{what}: each row of 'outputs' must sum to 1 (a softmax), got {sums.max():.6g}")
    over = sums > 1.0
    if over.any():
        outputs = outputs.copy()
        outputs[over] = (outputs[over] / sums[over, None]).astype(outputs.dtype)  # sum 1 up to float32 rounding
    return outputs


def _num_params(instr: msg.TrainInstruction, info) -> int:
    from client.app import _model_shell

    model = _model_shell(instr.model, info.num_features, info.num_labels, getattr(instr, "hidden", 64))
    return sum(p.numel() for p in model.parameters())
