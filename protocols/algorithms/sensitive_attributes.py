"""What the registry entries of the group-fair algorithms that noise a silo's sensitive division share (SteFFLe and
Tran et al., its baseline): the neighbouring relations of `protect` sensitive and record, the privacy block's entries
that say what is protected and which sampler ran, the mechanism texts' common parts, what neither mode covers, and the
check of `sampling` and `protect` against the topology. The silos' side of the same machinery is
`client.group_fairness`."""

from __future__ import annotations

from typing import Any

from silofl.protocols import shuffled_epochs
from silofl.protocols.algorithms.base import EXACT_EVALUATION, RECORD_PROTECTED, SENSITIVE_PROTECTED
from silofl.protocols.shuffled_epochs import ACCOUNTING_NOTE

RELATION = "replace_one (the sensitive attribute of one record)"
#: The relation of `protect` = record (`client.group_fairness.mechanism`).
RECORD_RELATION = "add_remove (one whole record: its features, label and sensitive attribute)"
#: What the privacy block's `protected` says, per `protect`.
PROTECTED = {"sensitive": "the sensitive attribute", "record": "the whole record"}

#: How the silos' rounds draw their records, per `sampling` (the mechanism text's {sample}, {own} and {accounting}).
SAMPLERS = {
    "poisson": {"sample": "a Poisson sample q = m/n_j", "own": "sample", "accounting": ""},
    "shuffle": {
        "sample": "the next batch of m records (the last of an epoch smaller) of a shuffled epoch",
        "own": "shuffled epochs (an independent permutation)",
        "accounting": "; " + ACCOUNTING_NOTE,
    },
}
#: The mechanism text's start under `protect` = sensitive on silos (its {sample} one of :data:`SAMPLERS`): the
#: histogram, then the sensitive division's per-round releases, which the algorithm's text goes on to name.
SILOS_HISTOGRAM = (
    "privacy of the sensitive attributes (replace-one relation). Each silo: a Gaussian histogram of its (group, label) "
    "counts (radius sqrt(2)/2, spending counts-share of epsilon), then each round {sample} drawn by the sensitive "
    "division: "
)

RECORD_MECHANISM = (
    "privacy of whole records (add/remove relation: one record's features, label and sensitive attribute; "
    "protect record, DP-FERMI Theorem D.2, second part). Each silo: a Gaussian histogram of its (group, label) counts "
    "(sensitivity 1, spending counts-share of epsilon), then each round one Poisson sample q = m/n_j (DP-FERMI's "
    "minibatch B_t, used by both divisions) and on it {releases}, noised at one multiplier sigma ({count} releases "
    "of one Poisson-subsampled Gaussian, accounted as one mechanism of multiplier sigma/sqrt({count})), each sum "
    "divided by the public batch size m. Nothing that depends on a record leaves un-noised but the record count n_j"
)
#: The release a round under `protect` = record makes first, and alone with lambda = 0.
LOSS_RELEASE = "per-record loss gradients clipped to C"


def record_mechanism(config: Any, fairness_releases: str, fairness_count: int) -> str:
    """The mechanism text of `protect` = record: the loss gradient and the algorithm's fairness releases."""
    if not fairness_releases:
        return RECORD_MECHANISM.format(releases=LOSS_RELEASE, count=1)
    return RECORD_MECHANISM.format(releases=fairness_releases, count=1 + fairness_count)


def protects_record(config: Any) -> bool:
    """Whether the run protects whole records (`protect` = record)."""
    return getattr(config, "protect", "sensitive") == "record"


def protection_report(config: Any, in_clear: str) -> dict[str, Any]:
    """The privacy block's entries that say what is protected, per `protect`: `protect`, `protected` (the sensitive
    attribute or the whole record), `protects` and `in_clear` (what the console prints)."""
    record = protects_record(config)
    return {
        "protect": "record" if record else "sensitive",
        "protected": PROTECTED["record" if record else "sensitive"],
        "protects": RECORD_PROTECTED if record else SENSITIVE_PROTECTED,
        "in_clear": "" if record else in_clear,
    }


def replace_one_report(config: Any, history: Any, rounds: int, delta: float, releases: int) -> dict[str, Any]:
    """Under `protect` = record: what each silo's run costs under REPLACING one whole record, the relation of
    `protect` = sensitive (changing a record's s is a replacement) and of the silos' lifetime ledgers, beside the
    add/remove epsilon the run was calibrated for: the same events (`Mechanism.replace_one_events`: the histogram's
    Gaussian at its multiplier for `counts-share` x epsilon, then `rounds` Poisson-subsampled Gaussians of `releases`
    releases at the silo's reported multiplier), composed by PLD under replace_one. Empty for a run without noise."""
    from silofl.protocols.privacy.accountant import calibrate_noise
    from silofl.protocols.privacy.composition import composed_epsilon
    from silofl.protocols.privacy.mechanism import Mechanism, Release, SetupRelease

    if not config.private or not history.silo_reports:
        return {}
    share = config.counts_share
    setup = calibrate_noise(share * config.epsilon, delta, 1.0, 1, relation="add_remove").noise_multiplier
    figures: dict[str, float] = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        if not report.noise_multiplier > 0:
            continue
        run = Mechanism(
            relation="add_remove",
            sampling="poisson",
            sampling_rate=report.sampling_rate,
            steps=rounds,
            releases=tuple(Release(f"release-{i}", radius=1.0) for i in range(releases)),
            setup=(SetupRelease("group-counts", share=share, radius=1.0),),
        )
        events = run.replace_one_events(report.noise_multiplier, (setup,))
        figures[str(silo_id)] = composed_epsilon(events, delta, "replace_one")
    if not figures:
        return {}
    return {
        "epsilon_replace_one": max(figures.values()),
        "epsilon_replace_one_note": "the same run under replacing one whole record (e.g. changing its sensitive "
        "attribute: the relation of protect sensitive, and of the silos' lifetime ledgers), PLD over the events the "
        "silos ran (largest over silos; the histogram's multiplier for the run's epsilon, larger under a silo "
        "policy's cap, so this is an upper bound then); epsilon_spent is under add/remove, as DP-FedSGD's and "
        "FedFDP's",
    }


def sampling_report(config: Any, history: Any, rounds: int) -> dict[str, Any]:
    """The privacy block's `sampling` (which sampler ran) and, for shuffled epochs, each silo's B_j and E_j with the
    accounting (`per_silo`, merged into the block's per-silo entries by `server.result`)."""
    if config.sampling != "shuffle" and protects_record(config):
        return {
            "sampling": "poisson: every round one fresh Poisson sample, the same for every release (protect record: "
            "one Poisson-subsampled Gaussian per round)"
        }
    if config.sampling != "shuffle":
        return {
            "sampling": "poisson: every round a fresh Poisson sample per division (the mechanism says what the "
            "accounting claims from it)"
        }
    per_silo = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        batches = shuffled_epochs.batches_per_epoch(report.num_examples, config.batch_size)
        per_silo[str(silo_id)] = {
            "sampling": "shuffle",
            "batches_per_epoch": batches,
            "epochs_accounted": shuffled_epochs.accounted_steps(rounds, report.num_examples, config.batch_size),
            "accounted_sampling_rate": 1.0,
        }
    return {
        "sampling": "shuffle: each silo's divisions take the rounds' batches of their own shuffled epochs (B_j = "
        f"ceil(n_j/m) batches of m = {config.batch_size}, every record once per epoch); " + ACCOUNTING_NOTE,
        "per_silo": per_silo,
    }


#: What neither mode covers (SteFFLe's and Tran's): the evaluations (unless the silos' policies noise them) and n_j.
NOT_COVERED = (
    EXACT_EVALUATION + "; each silo's number of training records n_j (public: sent at setup and in every report, "
    "and the sampling rate q = m / n_j is computed from it)"
)


def check_sampling_and_protect(config: Any) -> None:
    """Shuffled epochs on silos only (`SamplingOptions.sampling_problem`); whole-record privacy with Poisson sampling
    only (`ProtectOptions.protect_problem`)."""
    problem = config.sampling_problem(config.topology_name) or config.protect_problem(
        config.topology_name, config.sampling
    )
    if problem:
        raise ValueError(problem)
