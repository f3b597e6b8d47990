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

Whole-record privacy (`protect = record`, issue 34; `client.algorithms.steffle.record_gradients`): the relation is
add/remove of one whole record, the histogram's sensitivity 1, and each round makes its releases on ONE Poisson sample:
the loss gradient (radius C), and with lambda > 0 the theta part (C), the s-dependent W part (R_W) and the soft
predictions (radius 1; not for the balanced objective, whose W-gradient follows from its W part). The loss release is
charged every round, lambda = 0 included. Shuffled epochs and separate parties are refused (`ProtectOptions`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Context, Message
from torch import nn

from silofl.client import batches, randomness
from silofl.client.algorithms import steffle as algo
from silofl.client.data.tabular import SiloData
from silofl.client.gradients import unflatten
from silofl.client.round_privacy import RoundPrivacy, digest
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import messages as msg
from silofl.protocols import shuffled_epochs
from silofl.protocols.models import parameter_spec
from silofl.protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity
from silofl.protocols.privacy.mechanism import Mechanism, Release, SetupRelease
from silofl.protocols.steffle import MIN_SILO_PRIOR, PRIOR_FLOOR, GroupPrior

#: The setup release: the (group, label) histogram, radius sqrt(2)/2 under replace-one (`histogram_sensitivity`).
GROUP_COUNTS = "group-counts"
#: Under whole-record privacy: the loss gradient's release (radius C) and the soft predictions' (radius 1).
LOSS = "loss"
OUTPUTS = "outputs"


def protects_record(instr: msg.TrainInstruction) -> bool:
    """Whether the job protects whole records (`protect = record`); an instruction without the field does not."""
    return getattr(instr, "protect", "sensitive") == "record"


def relation_of(instr: msg.TrainInstruction) -> str:
    """The neighbouring relation of the job: add/remove of a whole record, or replace-one of s."""
    return "add_remove" if protects_record(instr) else "replace_one"


def record_releases(instr: msg.TrainInstruction, fairness: tuple[Release, ...]) -> tuple[Release, ...]:
    """A whole-record round's releases: the loss gradient (radius C), then `fairness` (none with lambda = 0).
    Refused (MessageError, from the message alone) with shuffled epochs, whose accounting does not hold under
    add/remove (`protocols.options.ProtectOptions`)."""
    if getattr(instr, "sampling", "poisson") != "poisson":
        raise msg.MessageError(
            "the server asked for 'protect' = 'record' with 'sampling' = 'shuffle': a record added or removed changes "
            "every batch of a shuffled epoch, which the silo cannot account; it refuses (use sampling poisson)"
        )
    return (Release(LOSS, radius=instr.clip), *fairness)


def sampling_of(records: int, sampling: str, batch_size: int, rounds: int) -> dict[str, object]:
    """The steps of a division's sampler: Poisson sampling, T steps at q = min(1, m / n_j); shuffled epochs, E_j =
    ceil(T / B_j) unsampled steps (q = 1) of B_j rounds each, no amplification (`protocols.shuffled_epochs`)."""
    if sampling == "shuffle":
        return {
            "sampling": "epochs",
            "sampling_rate": 1.0,
            "steps": shuffled_epochs.accounted_steps(rounds, records, batch_size),
            "rounds_per_step": shuffled_epochs.batches_per_epoch(records, batch_size),
        }
    return {"sampling": "poisson", "sampling_rate": min(1.0, batch_size / records), "steps": rounds}


def mechanism(records: int, instr: msg.TrainInstruction, releases: tuple[Release, ...] | None = None) -> Mechanism:
    """The silo's run under the replace-one relation on sensitive attributes: the one-off group-count histogram
    (`counts-share` of the budget), then per step two releases of the sensitive division's sample, the clipped theta
    part (radius C) and the s-dependent W part (its radius 2 / sqrt(rho), or per group rows, follows from the group
    prior, bound at its first round: `RoundPrivacy.bind`). Shuffled epochs also bind the run seed their
    permutations come from: a seed changed mid-epoch could put a record in two batches of one epoch.

    Under whole-record privacy (`protect = record`) the relation is add/remove of a record and every round releases
    the loss gradient first (:func:`record_releases`); SteFFLe's fairness releases are then :func:`record_fairness`'s.
    The bound mechanism names the mode (`parameter.protect`), so the silo's state says which mode its releases were
    made under and a later message asking for the other is refused."""
    record = protects_record(instr)
    if record:
        releases = record_releases(instr, record_fairness(instr) if releases is None else releases)
    releases = releases or (Release("theta", radius=instr.clip), Release("w", radius=None))
    return _mechanism(
        records, instr.sampling, instr.batch_size, instr.total_rounds, instr.seed, instr.counts_share, releases, record
    )


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


@functools.lru_cache(maxsize=64)
def _mechanism(
    records: int,
    sampling: str,
    batch: int,
    rounds: int,
    seed: int,
    share: float,
    releases: tuple[Release, ...],
    record: bool = False,
) -> Mechanism:
    """:func:`mechanism` of these values (a Mechanism is immutable: the same one serves every round of a run)."""
    parameters: dict[str, str | int | float] = {"batch-size": batch}
    if sampling == "shuffle":
        parameters["epoch-seed"] = seed
    if record:
        parameters["protect"] = "record"
    relation = "add_remove" if record else "replace_one"
    return Mechanism(
        relation=relation,
        releases=releases,
        setup=(SetupRelease(GROUP_COUNTS, share=share, radius=histogram_sensitivity(relation)),),
        parameters=parameters,
        **sampling_of(records, sampling, batch, rounds),  # type: ignore[arg-type]
    )


MechanismOf = Callable[[int, msg.TrainInstruction], Mechanism]


def open_privacy(
    context: Context, silo: SiloData, instr: msg.TrainInstruction, build: MechanismOf = mechanism
) -> RoundPrivacy:
    """The silo's bound, calibrated mechanism for this run (`build`: SteFFLe's :func:`mechanism`, or Tran's)."""
    return RoundPrivacy(context, instr, build(len(silo.train), instr), who=f"silo {silo.silo_id}", node_id=silo.silo_id)


def group_counts(
    silo: SiloData, instr: msg.TrainInstruction, context: Context, build: MechanismOf = mechanism
) -> tuple[np.ndarray, float]:
    """The silo's (group, label) counts, noised unless the run is non-private; and the epsilon spent after them.
    `build` is the algorithm's mechanism (the histogram is its setup release)."""
    counts = algo.group_label_counts(
        silo.train.nonsensitive, silo.train.sensitive, silo.info.num_groups, silo.info.num_labels
    )
    privacy = open_privacy(context, silo, instr, build)
    if not privacy.private:
        return counts, math.inf
    spent = privacy.charge_setup()
    release = GaussianMechanism(
        sensitivity=histogram_sensitivity(relation_of(instr)), noise_multiplier=privacy.setup_multiplier
    )
    noisy = release.release(torch.from_numpy(counts), privacy.generator(server_round=0)).numpy()
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
    privacy = open_privacy(context, silo, instr)
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


def group_prior(notion: str, probs: np.ndarray, num_labels: int, *, balanced: bool = False) -> GroupPrior:
    """The validated group prior of a train message (raises ValueError for an invalid one); ``balanced``: the
    group-balanced objective (the run's `group-weight`, `protocols.steffle.prior`).

    A prior with an entry below `protocols.steffle.MIN_SILO_PRIOR` is refused: the W radius and the noise it scales grow
    as 1 / sqrt(rho) (1 / rho balanced), and a server's tiny prior would make them overflow. The server sends the
    same prior every round: a prior is validated once per distinct (notion, bytes, shape, number of labels,
    balanced) and the (immutable) GroupPrior reused."""
    probs = np.ascontiguousarray(probs, dtype=np.float64)
    if probs.size and float(probs.min()) < MIN_SILO_PRIOR:
        raise ValueError(
            f"its smallest entry is {float(probs.min()):.3g}, below the {MIN_SILO_PRIOR:g} a silo accepts (the server "
            f"floors its prior at {PRIOR_FLOOR:g}; the W radius grows as the entry shrinks)"
        )
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
