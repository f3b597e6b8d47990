"""What a silo training for group fairness does whatever the algorithm (SteFFLe and Tran et al., its baseline).

* Its setup release `query.groups` (:func:`group_counts`): its records counted by (sensitive group, label)
  (:func:`group_label_counts`; SteFFLe Algorithm 1, line 2: P_S, P_{S|Y} for equalized odds), released through a
  Gaussian histogram whose cost is the first entry of the silo's ledger. Changing one record's sensitive attribute
  moves one count from (r, y) to (r', y): an L2 change of sqrt(2), so the histogram is a replace-one Gaussian
  mechanism of radius sqrt(2)/2 around the midpoint; under whole-record privacy (add/remove) its sensitivity is 1.
* Its run's privacy (:func:`mechanism`, :func:`open_privacy`): one composed mechanism per silo, the histogram then
  the rounds' releases, which the algorithm names (SteFFLe's theta and W parts, Tran et al.'s constraint gradient and
  group mass), under the replace-one relation on sensitive attributes, or under `protect = record` (issue 34) the
  add/remove relation with the loss gradient released first (:func:`record_releases`). The rounds' sampler
  (:func:`sampling_of`): Poisson sampling, or shuffled epochs accounted without amplification
  (`protocols.shuffled_epochs`).
* The group prior the server sends every round, validated (:func:`group_prior`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Context

from silofl.client.data.tabular import NonSensitiveDivision, SensitiveDivision, SiloData
from silofl.client.round_privacy import RoundPrivacy
from silofl.protocols import messages as msg
from silofl.protocols import shuffled_epochs
from silofl.protocols.fairness_prior import MIN_SILO_PRIOR, PRIOR_FLOOR, GroupPrior
from silofl.protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity
from silofl.protocols.privacy.mechanism import Mechanism, Release, SetupRelease

#: The setup release: the (group, label) histogram, radius sqrt(2)/2 under replace-one (`histogram_sensitivity`).
GROUP_COUNTS = "group-counts"
#: Under whole-record privacy: the loss gradient's release (radius C), every round's first.
LOSS = "loss"


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


def mechanism(records: int, instr: msg.TrainInstruction, releases: tuple[Release, ...]) -> Mechanism:
    """The silo's run: the one-off group-count histogram (`counts-share` of the budget), then per step the
    algorithm's `releases` of the sensitive division's sample, under the replace-one relation on sensitive attributes
    (a release of radius None takes it from the group prior, bound at its first round: `RoundPrivacy.bind`). Shuffled
    epochs also bind the run seed their permutations come from: a seed changed mid-epoch could put a record in two
    batches of one epoch.

    Under whole-record privacy (`protect = record`) the relation is add/remove of a record and every round releases
    the loss gradient first (:func:`record_releases`), then `releases` (the algorithm's whole-record fairness releases).
    The bound mechanism names the mode (`parameter.protect`), so the silo's state says which mode its releases were
    made under and a later message asking for the other is refused."""
    record = protects_record(instr)
    if record:
        releases = record_releases(instr, releases)
    return _mechanism(
        records, instr.sampling, instr.batch_size, instr.total_rounds, instr.seed, instr.counts_share, releases, record
    )


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


def open_privacy(context: Context, silo: SiloData, instr: msg.TrainInstruction, build: MechanismOf) -> RoundPrivacy:
    """The silo's bound, calibrated mechanism for this run (`build`: the algorithm's, over :func:`mechanism`)."""
    return RoundPrivacy(context, instr, build(len(silo.train), instr), who=f"silo {silo.silo_id}", node_id=silo.silo_id)


def group_counts(
    silo: SiloData, instr: msg.TrainInstruction, context: Context, build: MechanismOf
) -> tuple[np.ndarray, float]:
    """The silo's (group, label) counts, noised unless the run is non-private; and the epsilon spent after them.
    `build` is the algorithm's mechanism (the histogram is its setup release)."""
    counts = group_label_counts(
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


def group_label_counts(
    data: NonSensitiveDivision, sensitive: SensitiveDivision, num_groups: int, num_labels: int
) -> np.ndarray:
    """Records by (sensitive group, label): the silo's input to P_S and P_{S|Y} (Algorithm 1, line 2)."""
    counts = np.zeros((num_groups, num_labels), dtype=np.float64)
    np.add.at(counts, (sensitive.groups, data.labels), 1.0)
    return counts


def group_prior(notion: str, probs: np.ndarray, num_labels: int, *, balanced: bool = False) -> GroupPrior:
    """The validated group prior of a train message (raises ValueError for an invalid one); ``balanced``: the
    group-balanced objective (the run's `group-weight`, `protocols.fairness_prior`).

    A prior with an entry below `protocols.fairness_prior.MIN_SILO_PRIOR` is refused: the W radius and the noise it
    scales grow as 1 / sqrt(rho) (1 / rho balanced), and a server's tiny prior would make them overflow. The server
    sends the same prior every round: a prior is validated once per distinct (notion, bytes, shape, number of labels,
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
