"""SteFFLe round (DP-FERMI with one silo): g in the clear, the fairness gradients noised, both divisions apart.

Also the setup step `query.groups`: the silo's records by (sensitive group, label), released through a Gaussian
histogram (SteFFLe Algorithm 1, line 2: P_S; P_{S|Y} for equalized odds), whose cost is the first entry of the silo's
ledger. Changing one record's sensitive attribute moves one count from (r, y) to (r', y): an L2 change of sqrt(2), so
the histogram is a replace-one Gaussian mechanism of radius sqrt(2)/2 around the midpoint.

Privacy accounting (see `client.algorithms.steffle`): one composed mechanism per silo, under the replace-one relation
on sensitive attributes: the one-off histogram, then T rounds of a Poisson-sampled release of two vectors (theta and W
parts) at the same noise multiplier. With `sampling = shuffle` (`protocols.shuffled_epochs`) the divisions take the
rounds' batches of shuffled epochs instead, and the rounds are accounted without amplification: E_j = ceil(T / B_j)
unsampled releases of the same two vectors, one per epoch, charged at the epoch's first round.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from flwr.app import Context, Message
from torch import nn

from client import batches, privacy_state, randomness
from client.algorithms import steffle as algo
from client.data.tabular import SiloData
from client.gradients import unflatten
from client.rounds import RoundResult, with_records
from protocols import messages as msg
from protocols import shuffled_epochs
from protocols.ermi import GroupPrior
from protocols.models import parameter_spec
from protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity

RELEASES_PER_ROUND = 2  # h_theta and h_W


def plan_for(context: Context, silo: SiloData, instr: msg.TrainInstruction) -> privacy_state.NoisePlan:
    """The silo's calibrated mechanism for this run (cached in its state; refuses a change of parameters).

    Poisson sampling: T steps at q = min(1, m / n_j). Shuffled epochs: E_j = ceil(T / B_j) unsampled steps (q = 1),
    one per epoch, no amplification (`protocols.shuffled_epochs`)."""
    records = len(silo.train)
    sampling_rate, steps, batches = min(1.0, instr.batch_size / records), instr.total_rounds, 0
    if instr.sampling == "shuffle":
        batches = shuffled_epochs.batches_per_epoch(records, instr.batch_size)
        sampling_rate, steps = 1.0, shuffled_epochs.accounted_steps(instr.total_rounds, records, instr.batch_size)
    return privacy_state.noise_plan(
        context,
        epsilon=instr.epsilon,
        delta=instr.delta,
        sampling_rate=sampling_rate,
        steps=steps,
        releases=RELEASES_PER_ROUND,
        accountant=instr.accountant,
        relation="replace_one",
        one_off_share=instr.counts_share,
        batches_per_epoch=batches,
        epoch_seed=instr.seed,
    )


def group_counts(silo: SiloData, instr: msg.TrainInstruction, context: Context) -> tuple[np.ndarray, float]:
    """The silo's (group, label) counts, noised unless the run is non-private; and the epsilon spent after them."""
    counts = algo.group_label_counts(
        silo.train.nonsensitive, silo.train.sensitive, silo.info.num_groups, silo.info.num_labels
    )
    plan = plan_for(context, silo, instr)
    if math.isinf(plan.epsilon):
        return counts, math.inf
    spent = privacy_state.charge_one_off(context, plan, silo=f"silo {silo.silo_id}")
    generator = randomness.torch_generator(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=0, stream=randomness.NOISE
    )
    mechanism = GaussianMechanism(sensitivity=histogram_sensitivity("replace_one"), noise_multiplier=plan.one_off)
    noisy = mechanism.release(torch.from_numpy(counts), generator).numpy()
    return noisy, spent


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
    fair = msg.check_arrays(message.content, msg.FAIRNESS, [("w", w_shape), ("prior", prior_shape)], what=what)
    try:
        prior = group_prior(instr.fairness, fair["prior"], info.num_labels, balanced=instr.group_weight == "balanced")
    except ValueError as exc:
        raise msg.MessageError(f"{what}: invalid group prior: {exc}") from None
    w = torch.from_numpy(fair["w"])
    rate = min(1.0, instr.batch_size / len(silo.train))
    plan = plan_for(context, silo, instr)
    keys = {"seed": instr.seed, "silo_id": silo.silo_id, "server_round": instr.server_round}
    spent = math.inf
    if instr.lam > 0 and math.isfinite(plan.epsilon):
        # Charged BEFORE anything is computed or released: a refused answer releases nothing.
        spent = privacy_state.charge(context, plan, server_round=instr.server_round, silo=f"silo {silo.silo_id}")
    elif instr.lam == 0 and math.isfinite(plan.epsilon):
        spent = privacy_state.spent(context)  # nothing sensitive is released this round

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
            noise_multiplier=plan.noise_multiplier,
            sample=sample(division="sensitive"),
            generator=randomness.torch_generator(context, stream=randomness.NOISE, **keys),
            w_noise=w_noise_of(instr.w_noise),
        )
        fair_arrays = _named(h_theta, spec)
        # Balanced objective: h_w is the whole W-gradient (its -2 W F term depends on s; `algo.balanced_w_base`).
        w_gradient = h_w if prior.balanced else w_base + h_w
        fair_arrays["w"] = w_gradient.detach().numpy().astype(np.float32)
        arrays[msg.FAIR_UPDATE] = fair_arrays
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=len(silo.train),
        epsilon_spent=spent,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=rate,
    )
    return arrays, report


def w_noise_of(w_noise: str) -> str:
    """The W noise a silo or a separate sensitive party (`client.rounds.steffle_parties`) applies for the run's
    `w-noise`: "auto", the default, is per-group (it names the default, so a run's config still reads "auto" if the
    default moves)."""
    return "per-group" if w_noise == "auto" else w_noise


def group_prior(notion: str, probs: np.ndarray, num_labels: int, *, balanced: bool = False) -> GroupPrior:
    """The validated group prior of a train message (raises ValueError for an invalid one); ``balanced``: the
    group-balanced objective (the run's `group-weight`, `protocols.ermi`).

    The server sends the same prior every round: a prior is validated once per distinct (notion, bytes, shape,
    number of labels, balanced) and the (immutable) GroupPrior reused."""
    probs = np.ascontiguousarray(probs, dtype=np.float64)
    return _group_prior(notion, probs.tobytes(), probs.shape, num_labels, balanced)


@functools.lru_cache(maxsize=64)
def _group_prior(
    notion: str, data: bytes, shape: tuple[int, ...], num_labels: int, balanced: bool = False
) -> GroupPrior:
    return GroupPrior(
        notion, np.frombuffer(data, dtype=np.float64).reshape(shape), num_labels=num_labels, balanced=balanced
    )


def _named(vector: torch.Tensor, spec: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().astype(np.float32) for name, t in unflatten(vector, spec).items()}
