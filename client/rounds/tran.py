"""Tran et al. 2021 (PF-LD) on a silo: the SteFFLe paper's Lagrangian-dual baseline with the noise added in each silo.

What leaves the silo, and what depends on the sensitive attribute s (SteFFLe's threat model: DP of the sensitive
attributes, replace-one neighbours; features and labels are not protected, as for `steffle`):

- setup, ``query.groups``: the silo's (group, label) counts. Depend on s: released through a Gaussian histogram
  (radius sqrt(2)/2) that spends `counts-share` of the silo's epsilon, as in SteFFLe (`client.group_fairness`). The
  server builds the prior p.
- every round, the non-sensitive division, on its own Poisson sample (rate q = m / n_j): the loss gradient g_j. It
  never reads s and does not depend on it: sent as is.
- every round, the sensitive division, on an independent Poisson sample (so that g_j reveals nothing about who it
  sampled, which amplification by sampling needs):

  1. ``h_j``: the gradient of the constraint term ``sum c (.) nu`` of the Lagrangian, c the signed multipliers the
     server sent (`protocols.tran`). Record i's gradient ``J_F(x_i)^T a_i`` depends on s_i through ``a_i``: clipped to
     norm C (`clip`) as a whole, summed, Gaussian noise sigma * C added;
  2. the group mass: ``sum_i [b_i = b] [s_i = a] F(x_i)``, from which the server estimates the violations nu for the
     dual step and the next signs. Depends on s: record i's contribution has norm ``||F(x_i)||_2 <= 1``; Gaussian noise
     sigma * 1 added.

  Both are sums over the same Poisson sample of per-record contributions in a ball around 0 (what an unsampled record
  contributes) whatever s_i: two releases of one Poisson-subsampled Gaussian step under the replace-one relation,
  accounted as ONE composed mechanism (noise multiplier sigma / sqrt(2), `protocols.privacy.accountant`), after the
  histogram, by PLD. The silo calibrates sigma for its budget over the announced rounds and charges its ledger before
  it computes anything. When every signed multiplier is 0 (the first round, or lambda = 0), h_j is exactly 0 whatever
  the data and is sent without noise (a constant needs none); the round is charged in full all the same.

With `sampling = shuffle` both divisions take the rounds' batches of their own shuffled epochs instead of Poisson
samples (`client.batches`), the sums are still divided by q n_j = min(m, n_j), and the silo accounts each epoch as one
unsampled release of the two (no amplification; `protocols.shuffled_epochs`), charged at the epoch's first round.

Nothing else the silo sends (its number of records, its report) depends on s. The primal and dual steps are the
server's (`strategies.tran`).

Whole-record privacy (`protect = record`, issue 34): neighbours differ by one whole record added or removed, so g_j
is a release too. The silo draws ONE Poisson sample per round and releases on it the per-record loss gradients
clipped to C (`client.noisy_gradient.loss_release`), then h_j and the group mass as above, all at one noise
multiplier (three releases of one Poisson-subsampled Gaussian under add/remove, after the histogram of sensitivity 1),
each sum divided by the public batch size m. Charged every round before anything is computed.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from flwr.app import Context, Message
from torch import nn

from silofl.client import batches, group_fairness, randomness
from silofl.client.batches import step_batch, step_sample
from silofl.client.data.tabular import SiloData
from silofl.client.gradients import mean_gradient, unflatten
from silofl.client.noisy_gradient import loss_release
from silofl.client.round_privacy import digest
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols import tran
from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import model_device, parameter_spec
from silofl.protocols.privacy.gaussian import GaussianMechanism
from silofl.protocols.privacy.mechanism import Mechanism, Release

MASS_RADIUS = 1.0  # ||F(x_i)||_2 <= ||F(x_i)||_1 = 1: the ball record i's group-mass contribution lies in
MASS = "mass"  # name of the group mass in the fair-update record


def mechanism(records: int, instr: msg.TrainInstruction) -> Mechanism:
    """The silo's run (`client.group_fairness.mechanism`: the one-off histogram, then the steps of the sensitive
    division's sampler under the replace-one relation), with this algorithm's two releases per step: the clipped
    constraint gradient (radius C) and the group mass (radius 1). Under whole-record privacy the same two after the
    loss gradient, under add/remove."""
    releases = (Release("constraint", radius=instr.clip), Release(MASS, radius=MASS_RADIUS))
    return group_fairness.mechanism(records, instr, releases)


def group_counts(silo: SiloData, instr: msg.TrainInstruction, context: Context) -> tuple[np.ndarray, float]:
    """The setup release: the silo's (group, label) counts through the histogram of this run's mechanism
    (`client.group_fairness.group_counts`)."""
    return group_fairness.group_counts(silo, instr, context, mechanism)


def fairness_release(
    model: nn.Module,
    silo: SiloData,
    *,
    c: torch.Tensor,
    prior: GroupPrior,
    rate: float,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator | None = None,
    generator: torch.Generator,
    sample: np.ndarray | None = None,
    divisor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sensitive division's noised ``(h, group mass)``, each a sum over its own Poisson sample (or the given
    `sample`, a shuffled epoch's batch, or a whole-record round's one sample) / (q n_j), or / `divisor` (whole-record
    privacy: the public batch size)."""
    data, sensitive = silo.train.nonsensitive, silo.train.sensitive
    idx = step_sample(len(sensitive.groups), rate, rng, sample)
    # the features on the model's device (forward and per-sample backward passes); groups, labels, the multipliers,
    # the group mass and the noise on the CPU (`protocols.devices`)
    x = torch.from_numpy(data.features[idx]).to(model_device(model))
    y = torch.from_numpy(data.labels[idx])
    s = torch.from_numpy(sensitive.groups[idx])
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1).cpu() if len(idx) else torch.zeros(0, silo.info.num_labels)
    mass = tran.group_mass_sum(probs, s, prior, labels=y)
    active = bool(c.abs().sum() > 0)
    if active:
        h = tran.clipped_constraint_gradient_sum(model, x, s, c, prior, clip, labels=y).cpu()
    else:  # sum c (.) nu with c = 0: exactly 0 whatever the data, released as is
        h = torch.zeros(sum(p.numel() for p in model.parameters()))
    if noise_multiplier > 0:
        mass = GaussianMechanism(sensitivity=MASS_RADIUS, noise_multiplier=noise_multiplier).release(mass, generator)
        if active:
            h = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier).release(h, generator)
    expected = rate * len(sensitive.groups) if divisor is None else divisor
    return h / expected, mass / expected


@with_records(msg.FAIRNESS)
def train_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    what = f"train message to silo {silo.silo_id}"
    info = silo.info
    prior_shape = (info.num_groups,) if instr.fairness == "dp" else (info.num_labels, info.num_groups)
    c_shape = (
        (info.num_labels, info.num_groups, info.num_labels)
        if instr.fairness == "eo"
        else (info.num_groups, info.num_labels)
    )
    fair = msg.check_arrays(
        message.content, msg.FAIRNESS, [("multipliers", c_shape), ("prior", prior_shape)], what=what
    )
    try:
        prior = group_fairness.group_prior(instr.fairness, fair["prior"], info.num_labels)
    except ValueError as exc:
        raise msg.MessageError(f"{what}: invalid group prior: {exc}") from None
    rate = min(1.0, instr.batch_size / len(silo.train))
    privacy = group_fairness.open_privacy(context, silo, instr, mechanism)
    privacy.bind("prior", digest(fair["prior"]))
    spent = math.inf
    if privacy.private:
        # Charged BEFORE anything is computed or released: a refused answer releases nothing.
        spent = privacy.charge()
    sample = functools.partial(batches.round_sample, context, instr, silo_id=silo.silo_id, records=len(silo.train))

    data = silo.train.nonsensitive
    divisor = None
    if group_fairness.protects_record(instr):
        # Whole-record privacy: one sample for every release, the loss gradient clipped and noised first.
        idx = sample(division="sensitive")
        generator = privacy.generator(randomness.NOISE)
        loss_sum = loss_release(
            model, data, idx, clip=instr.clip, noise_multiplier=privacy.noise_multiplier, generator=generator
        )
        g, divisor, fair_sample = loss_sum / instr.batch_size, float(instr.batch_size), idx
    else:
        # Non-sensitive division: the loss gradient on its own sample or batch (never reads s), in the clear.
        idx = sample(division="nonsensitive")
        if len(idx):
            g = mean_gradient(model, *step_batch(model, data, idx)).cpu()
        else:
            g = torch.zeros(sum(p.numel() for p in model.parameters()))
        generator, fair_sample = privacy.generator(randomness.NOISE), sample(division="sensitive")
    # Sensitive division: an independent sample or batch (whole-record privacy: the same one); the clipped, noised
    # constraint gradient and group mass.
    h, mass = fairness_release(
        model,
        silo,
        c=torch.from_numpy(fair["multipliers"]),
        prior=prior,
        rate=rate,
        clip=instr.clip,
        noise_multiplier=privacy.noise_multiplier,
        sample=fair_sample,
        generator=generator,
        divisor=divisor,
    )
    spec = parameter_spec(model)
    fair_arrays = _named(h, spec)
    fair_arrays[MASS] = mass.detach().numpy().astype(np.float32)
    report = privacy.report(num_examples=len(silo.train), sampling_rate=rate, spent=spent)
    return {msg.UPDATE: _named(g, spec), msg.FAIR_UPDATE: fair_arrays}, report


def _named(vector: torch.Tensor, spec: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().astype(np.float32) for name, t in unflatten(vector, spec).items()}
