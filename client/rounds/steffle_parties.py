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

from client import privacy_state, randomness
from client.algorithms import steffle_parties as algo
from client.data.topology import FeaturePartyData, SensitivePartyData
from client.rounds.steffle import _named, group_prior, w_noise_of
from protocols import messages as msg
from protocols import parties as pm
from protocols.ermi import GroupPrior
from protocols.models import parameter_spec
from protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity

RELEASES_PER_ROUND = 2  # the theta sum and the W sum
#: The most rows one request may carry: every feature party's whole training split (checked against n by the server).
MAX_ROWS = 10_000_000


def plan_for(context: Context, instr: msg.TrainInstruction) -> privacy_state.NoisePlan:
    """The sensitive party's calibrated mechanism: T rounds at sampling rate q_s (its own coins), after the one-off
    histogram; cached in its state, refusing a change of parameters mid-run."""
    return privacy_state.noise_plan(
        context,
        epsilon=instr.epsilon,
        delta=instr.delta,
        sampling_rate=instr.keep_rate,
        steps=instr.total_rounds,
        releases=RELEASES_PER_ROUND,
        accountant=instr.accountant,
        relation="replace_one",
        one_off_share=instr.counts_share,
    )


def _keys(party_id: int, instr: msg.TrainInstruction, server_round: int) -> dict[str, int]:
    return {"seed": instr.seed, "silo_id": party_id, "server_round": server_round}


def _prior(content: RecordDict, info, instr: msg.TrainInstruction, what: str) -> tuple[GroupPrior, torch.Tensor]:
    """W and the group prior of a request (shapes from the fairness notion), as the silo mode reads them."""
    from protocols.ermi import w_shape

    prior_shape = (info.num_groups,) if instr.fairness == "dp" else (info.num_labels, info.num_groups)
    shape = w_shape(instr.fairness, info.num_groups, info.num_labels)
    fair = msg.check_arrays(content, msg.FAIRNESS, [("w", shape), ("prior", prior_shape)], what=what)
    try:
        prior = group_prior(instr.fairness, fair["prior"], info.num_labels)
    except ValueError as exc:
        raise msg.MessageError(f"{what}: invalid group prior: {exc}") from None
    return prior, torch.from_numpy(fair["w"])


def _labels_in_range(labels: np.ndarray, num_labels: int, what: str) -> None:
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_labels):
        raise msg.MessageError(f"{what}: labels must be in 0..{num_labels - 1}")


def feature_train(
    model: torch.nn.Module, party: FeaturePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """Step 1 (Algorithm 1, line 7 at a feature party): the mean loss gradient over a Poisson sample at q_f = m / n_j,
    and the (id, y) and (F(x_i), J_F(x_i)) of the sampled records (or of all its records, `share-rows = all`). Reads
    no sensitive value; adds no noise."""
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
    report = msg.TrainReport(
        silo_id=party.party_id,
        server_round=instr.server_round,
        num_examples=len(party.train_ids),
        epsilon_spent=math.inf,
        noise_multiplier=0.0,
        sampling_rate=rate,
    )
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


def group_counts(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """The (group, label) counts of the requested training ids this party holds (labels from the feature parties,
    sent once in setup); a Gaussian histogram of radius sqrt(2)/2 unless the run is non-private (as a silo's)."""
    what = f"groups message to sensitive party {party.party_id}"
    msg.check_records(message.content, {msg.CONFIG, pm.TRAIN_ROWS}, what=what)
    info = party.info
    rows = pm.read_columns(message.content, pm.TRAIN_ROWS, ("ids", "labels"), max_rows=MAX_ROWS, what=what)
    pm.check_ids(rows["ids"], what)
    _labels_in_range(rows["labels"], info.num_labels, what)
    positions, groups = algo.SensitiveParty(*party.sorted_train).lookup(rows["ids"])
    counts = np.zeros((info.num_groups, info.num_labels), dtype=np.float64)
    np.add.at(counts, (groups, rows["labels"][positions]), 1.0)
    plan = plan_for(context, instr)
    spent = math.inf
    if math.isfinite(plan.epsilon):
        spent = privacy_state.charge_one_off(context, plan, silo=f"sensitive party {party.party_id}")
        generator = randomness.torch_generator(context, stream=randomness.NOISE, **_keys(party.party_id, instr, 0))
        mechanism = GaussianMechanism(sensitivity=histogram_sensitivity("replace_one"), noise_multiplier=plan.one_off)
        counts = mechanism.release(torch.from_numpy(counts), generator).numpy()
    report = msg.GroupsReport(silo_id=party.party_id, epsilon_spent=spent)
    return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})


def sensitive_round(
    party: SensitivePartyData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RecordDict:
    """Step 2 (Algorithm 1, line 8 at a sensitive party; Appendix F): the noised sums of the clipped d psi / d theta
    and of the s-dependent d psi / d W over the requested ids it holds, each kept with its secret coin at q_s. The
    reply has the same shape and noise whether it held none, some or all of the ids (the paper's dummy noise)."""
    what = f"sensitive query to sensitive party {party.party_id} in round {instr.server_round}"
    msg.check_records(message.content, {msg.CONFIG, msg.FAIRNESS, pm.ROWS, pm.OUTPUTS}, what=what)
    info = party.info
    prior, w = _prior(message.content, info, instr, what)
    num_params = _num_params(instr, info)
    rows = pm.read_columns(message.content, pm.ROWS, ("ids", "labels"), max_rows=MAX_ROWS, what=what)
    pm.check_ids(rows["ids"], what)
    _labels_in_range(rows["labels"], info.num_labels, what)
    outputs, jacobians = pm.read_outputs(
        message.content, rows=len(rows["ids"]), num_labels=info.num_labels, num_params=num_params, what=what
    )
    plan = plan_for(context, instr)
    spent = math.inf
    if math.isfinite(plan.epsilon):
        # Charged BEFORE anything is computed or released: a refused answer releases nothing.
        spent = privacy_state.charge(
            context, plan, server_round=instr.server_round, silo=f"sensitive party {party.party_id}"
        )
    keys = _keys(party.party_id, instr, instr.server_round)
    theta, w_sum = algo.sensitive_party_step(
        algo.SensitiveParty(*party.sorted_train),
        algo.FeatureRows(
            rows["ids"], torch.from_numpy(rows["labels"]), torch.from_numpy(outputs), torch.from_numpy(jacobians)
        ),
        w=w,
        prior=prior,
        clip=instr.clip,
        noise_multiplier=plan.noise_multiplier,
        keep_rate=instr.keep_rate,
        rng=randomness.numpy_rng(context, stream=randomness.SENSITIVE_SAMPLING, **keys),
        generator=randomness.torch_generator(context, stream=randomness.NOISE, **keys),
        w_noise=w_noise_of(instr.w_noise),
    )
    report = msg.TrainReport(
        silo_id=party.party_id,
        server_round=instr.server_round,
        num_examples=len(party.train_ids),
        epsilon_spent=spent,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=instr.keep_rate,
    )
    fair = {"theta": theta.numpy().astype(np.float32), "w": w_sum.numpy().astype(np.float32)}
    return RecordDict({msg.FAIR_UPDATE: msg.arrays_record(fair), msg.REPORT: report.to_metric_record()})


def _num_params(instr: msg.TrainInstruction, info) -> int:
    from client.app import _model_shell

    model = _model_shell(instr.model, info.num_features, info.num_labels, getattr(instr, "hidden", 64))
    return sum(p.numel() for p in model.parameters())
