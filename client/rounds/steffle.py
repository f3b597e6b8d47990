"""SteFFLe round (DP-FERMI with one silo): g in the clear, the fairness gradients noised, both divisions apart.

Also the setup step `query.groups`: the silo's records by (sensitive group, label), released through a Gaussian
histogram whose cost is the first entry of the silo's ledger (`client.group_fairness`, shared with Tran et al.).

Privacy accounting (see `client.algorithms.steffle`): one composed mechanism per silo, under the replace-one relation
on sensitive attributes: the one-off histogram, then T rounds of a Poisson-sampled release of two vectors (theta and W
parts) at the same noise multiplier. With `sampling = shuffle` (`protocols.shuffled_epochs`) the divisions take the
rounds' batches of shuffled epochs instead, and the rounds are accounted without amplification: E_j = ceil(T / B_j)
unsampled releases of the same two vectors, one per epoch, charged at the epoch's first round.

Whole-record privacy (`protect = record`, issue 34; `client.algorithms.steffle.record_gradients`): the relation is
add/remove of one whole record, the histogram's sensitivity 1, and each round makes its releases on ONE Poisson sample:
the loss gradient (radius C), and with lambda > 0 the theta part (C), the s-dependent W part (R_W) and the soft
predictions (radius 1; not for the balanced objective, whose W-gradient follows from its W part). The loss release is
charged every round, lambda = 0 included. Shuffled epochs and separate parties are refused (`ProtectOptions`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from flwr.app import Context, Message
from torch import nn

from silofl.client import batches, group_fairness, randomness
from silofl.client.algorithms import steffle as algo
from silofl.client.data.tabular import SiloData
from silofl.client.gradients import unflatten
from silofl.client.group_fairness import group_prior, open_privacy, protects_record
from silofl.client.round_privacy import RoundPrivacy, digest
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import parameter_spec
from silofl.protocols.privacy.mechanism import Mechanism, Release

#: Under whole-record privacy: the soft predictions' release (radius 1).
OUTPUTS = "outputs"


def mechanism(records: int, instr: msg.TrainInstruction) -> Mechanism:
    """SteFFLe's run (`client.group_fairness.mechanism`): per step two releases of the sensitive division's sample, the
    clipped theta part (radius C) and the s-dependent W part (its radius 2 / sqrt(rho), or per group rows, follows
    from the group prior); under whole-record privacy :func:`record_fairness`'s releases after the loss gradient."""
    if protects_record(instr):
        return group_fairness.mechanism(records, instr, record_fairness(instr))
    return group_fairness.mechanism(records, instr, (Release("theta", radius=instr.clip), Release("w", radius=None)))


def group_counts(silo: SiloData, instr: msg.TrainInstruction, context: Context) -> tuple[np.ndarray, float]:
    """The setup release: the silo's (group, label) counts through the histogram of SteFFLe's mechanism
    (`client.group_fairness.group_counts`)."""
    return group_fairness.group_counts(silo, instr, context, mechanism)


def record_fairness(instr: msg.TrainInstruction) -> tuple[Release, ...]:
    """SteFFLe's fairness releases of a whole-record round: none with lambda = 0; else the theta part (radius C), the
    s-dependent W part (radius from the prior) and, unless the objective is group-balanced, the soft predictions in
    their W blocks (radius 1, `client.algorithms.steffle.OUTPUTS_RADIUS`)."""
    if instr.lam <= 0:
        return ()
    fairness = (Release("theta", radius=instr.clip), Release("w", radius=None))
    if instr.group_weight == "balanced":
        return fairness
    return (*fairness, Release(OUTPUTS, radius=algo.OUTPUTS_RADIUS))


@with_records(msg.FAIRNESS)
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    what = f"train message to silo {silo.silo_id}"
    info = silo.info
    prior_shape = (info.num_groups,) if instr.fairness == "dp" else (info.num_labels, info.num_groups)
    w_shape = (
        (info.num_labels, info.num_groups, info.num_labels)
        if instr.fairness == "eo"
        else (info.num_groups, info.num_labels)
    )
    fair = msg.check_arrays(
        message.content,
        msg.FAIRNESS,
        [("w", w_shape), ("prior", prior_shape)],
        what=what,
        max_abs=msg.MAX_SERVER_VALUE,
    )
    try:
        prior = group_prior(instr.fairness, fair["prior"], info.num_labels, balanced=instr.group_weight == "balanced")
    except ValueError as exc:
        raise msg.MessageError(f"{what}: invalid group prior: {exc}") from None
    w = torch.from_numpy(fair["w"])
    rate = min(1.0, instr.batch_size / len(silo.train))
    privacy = open_privacy(context, silo, instr, mechanism)
    privacy.bind("prior", digest(fair["prior"]))  # the W radius follows from it
    if protects_record(instr):
        return _record_round(model, silo, instr, context, privacy, w=w, prior=prior, rate=rate)
    spent = math.inf
    if instr.lam > 0 and privacy.private:
        # Charged BEFORE anything is computed or released: a refused answer releases nothing.
        spent = privacy.charge()
    elif instr.lam == 0 and privacy.private:
        spent = privacy.spent()  # nothing sensitive is released this round

    # Non-sensitive division: its own sample (or batch); g and the s-independent part of the W-gradient, in the clear.
    sample = functools.partial(batches.round_sample, context, instr, silo_id=silo.silo_id, records=len(silo.train))
    g, w_base = algo.nonsensitive_step(
        model, silo.train.nonsensitive, w=w, prior=prior, rate=rate, sample=sample(division="nonsensitive")
    )
    spec = parameter_spec(model)
    arrays = {msg.UPDATE: _named(g, spec)}
    if instr.lam > 0:
        # Sensitive division: an independent sample (or batch); clipped, noised fairness gradients.
        h_theta, h_w = algo.fairness_gradients(
            model,
            silo.train.nonsensitive,
            silo.train.sensitive,
            w=w,
            prior=prior,
            rate=rate,
            clip=instr.clip,
            noise_multiplier=privacy.noise_multiplier,
            sample=sample(division="sensitive"),
            generator=privacy.generator(randomness.NOISE),
            w_noise=w_noise_of(instr.w_noise),
        )
        fair_arrays = _named(h_theta, spec)
        # Balanced objective: h_w is the whole W-gradient (its -2 W F term depends on s; `algo.balanced_w_base`).
        w_gradient = h_w if prior.balanced else w_base + h_w
        fair_arrays["w"] = w_gradient.detach().numpy().astype(np.float32)
        arrays[msg.FAIR_UPDATE] = fair_arrays
    return arrays, privacy.report(num_examples=len(silo.train), sampling_rate=rate, spent=spent)


def _record_round(
    model: nn.Module,
    silo: SiloData,
    instr: msg.TrainInstruction,
    context: Context,
    privacy: RoundPrivacy,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    rate: float,
) -> RoundResult:
    """A round under whole-record privacy: charged first (every round, lambda = 0 included: the loss gradient is a
    release), then every release noised on one Poisson sample (`client.algorithms.steffle.record_gradients`)."""
    spent = privacy.charge() if privacy.private else math.inf  # BEFORE anything is computed or released
    sample = batches.round_sample(context, instr, silo_id=silo.silo_id, records=len(silo.train), division="sensitive")
    g, h_theta, h_w = algo.record_gradients(
        model,
        silo.train.nonsensitive,
        silo.train.sensitive,
        w=w,
        prior=prior,
        batch_size=instr.batch_size,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        generator=privacy.generator(randomness.NOISE),
        sample=sample,
        w_noise=w_noise_of(instr.w_noise),
        fairness=instr.lam > 0,
    )
    spec = parameter_spec(model)
    arrays = {msg.UPDATE: _named(g, spec)}
    if h_theta is not None and h_w is not None:
        fair_arrays = _named(h_theta, spec)
        fair_arrays["w"] = h_w.detach().numpy().astype(np.float32)
        arrays[msg.FAIR_UPDATE] = fair_arrays
    return arrays, privacy.report(num_examples=len(silo.train), sampling_rate=rate, spent=spent)


def w_noise_of(w_noise: str) -> str:
    """The W noise a silo or a separate sensitive party (`client.rounds.steffle_parties`) applies for the run's
    `w-noise`: "auto", the default, is per-group (it names the default, so a run's config still reads "auto" if the
    default moves)."""
    return "per-group" if w_noise == "auto" else w_noise


def _named(vector: torch.Tensor, spec: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().astype(np.float32) for name, t in unflatten(vector, spec).items()}
