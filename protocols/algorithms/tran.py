"""Tran et al. 2021 (PF-LD, a Lagrangian dual for demographic parity) as a SteFFLe baseline, with the noise added in
each silo under SteFFLe's threat model (`protocols/tran.py` has the math). Server: `strategies.tran`
(`TranStrategy`); silo: `client.rounds.tran`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import SENSITIVE_PROTECTED, Algorithm
from silofl.protocols.algorithms.common import MINIBATCH_DEFAULTS
from silofl.protocols.algorithms.sensitive_attributes import (
    NOT_COVERED,
    RECORD_RELATION,
    RELATION,
    SAMPLERS,
    SILOS_HISTOGRAM,
    check_sampling_and_protect,
    protection_report,
    protects_record,
    record_mechanism,
    replace_one_report,
    sampling_report,
)
from silofl.protocols.options import (
    ClipOptions,
    DeviceOptions,
    DualOptions,
    FairnessOptions,
    GroupReportOptions,
    LrDecayOptions,
    PrivacyOptions,
    ProtectOptions,
    SamplingOptions,
    SgdOptions,
    TabularModelOptions,
)

MECHANISM = SILOS_HISTOGRAM + (
    "the per-sample gradients of the Lagrangian's "
    "constraint term sum_c lambda_c sign(nu_c) nu_c clipped to C, and each record's soft predictions in its "
    "group's row of the group mass (radius 1), both noised at one multiplier sigma (two releases, one "
    "composed mechanism, PLD); the server estimates the violations nu from the noised group mass for the "
    "dual step; the loss gradient g comes from the non-sensitive division's own {own} and is sent in the "
    "clear (it does not depend on s){accounting}"
)


#: The releases of a round under `protect` = record (`client.rounds.tran`), after the loss gradient.
RECORD_RELEASES = (
    "per-record loss gradients clipped to C, the per-record gradients of the Lagrangian's constraint term clipped to "
    "C and each record's soft predictions in its group's row of the group mass (radius 1)"
)


def mechanism(config: Any) -> str:
    """What the silos release, and how it is noised, for the run's `sampling` and `protect`."""
    if protects_record(config):
        return record_mechanism(config, RECORD_RELEASES, 2)
    return MECHANISM.format(**SAMPLERS[config.sampling])


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The relation, what is protected, which sampler ran and, for shuffled epochs, each silo's epochs (as
    SteFFLe's)."""
    record = protects_record(config)
    return {
        "relation": RECORD_RELATION if record else RELATION,
        **protection_report(config, IN_CLEAR),
        **sampling_report(config, history, rounds),
        **(replace_one_report(config, history, rounds, delta, 3) if record else {}),
    }


def tran_label(config: Mapping[str, Any]) -> str:
    """Tran et al.'s name, with "(whole record)" under `protect` = record (as SteFFLe's label)."""
    return "tran (whole record)" if config.get("protect") == "record" else "tran"


#: What leaves a silo un-noised (the console says it is not protected).
IN_CLEAR = "the features and labels: each silo's loss gradient reaches the server without noise"


SPEC = register(
    Algorithm(
        name="tran",
        summary="Tran et al. 2021 (Lagrangian dual for fairness), noise on the sensitive attributes in each silo "
        "(--protect record: on whole records)",
        options=(
            PrivacyOptions,
            TabularModelOptions,
            DeviceOptions,
            GroupReportOptions,
            SgdOptions,
            SamplingOptions,
            LrDecayOptions,
            ClipOptions,
            FairnessOptions,
            DualOptions,
            ProtectOptions,
        ),
        defaults=MINIBATCH_DEFAULTS,
        aliases=("tran2021", "pf-ld"),
        strategy="silofl.strategies.tran:build",
        silo={
            "train": "silofl.client.rounds.tran:train_round",
            "query.groups": "silofl.client.rounds.tran:group_counts",
        },
        plots=("fairness", "privacy"),
        privacy_report="silofl.protocols.algorithms.tran:privacy_report",
        mechanism=mechanism,
        protects=SENSITIVE_PROTECTED,
        noised_for_record=("silo",),
        in_clear=IN_CLEAR,
        not_covered=NOT_COVERED,
        label=tran_label,
        check=check_sampling_and_protect,
    )
)
