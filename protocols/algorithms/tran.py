"""Tran et al. 2021 (PF-LD, a Lagrangian dual for demographic parity) as a SteFFLe baseline, with the noise added in
each silo under SteFFLe's threat model (`protocols/tran.py` has the math). Server: `strategies.lagrangian`; silo:
`client.rounds.tran`."""

from __future__ import annotations

from typing import Any

from protocols.algorithms import register
from protocols.algorithms.base import Algorithm
from protocols.algorithms.dp_fedsgd import MINIBATCH_DEFAULTS
from protocols.algorithms.steffle import RELATION
from protocols.options import (
    ClipOptions,
    DualOptions,
    FairnessOptions,
    GroupReportOptions,
    LrDecayOptions,
    PrivacyOptions,
    SgdOptions,
    TabularModelOptions,
)


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    return {"relation": RELATION}


SPEC = register(
    Algorithm(
        name="tran",
        summary="Tran et al. 2021 (Lagrangian dual for fairness), noise on the sensitive attributes in each silo",
        options=(
            PrivacyOptions,
            TabularModelOptions,
            GroupReportOptions,
            SgdOptions,
            LrDecayOptions,
            ClipOptions,
            FairnessOptions,
            DualOptions,
        ),
        defaults=MINIBATCH_DEFAULTS,
        aliases=("tran2021", "pf-ld"),
        strategy="strategies.lagrangian:build",
        silo={"train": "client.rounds.tran:train_round", "query.groups": "client.rounds.tran:group_counts"},
        plots=("fairness", "privacy"),
        privacy_report="protocols.algorithms.tran:privacy_report",
        mechanism="privacy of the sensitive attributes (replace-one relation). Each silo: a Gaussian histogram of its "
        "(group, label) counts (radius sqrt(2)/2, spending counts-share of epsilon), then each round a Poisson "
        "sample q = m/n_j drawn by the sensitive division: the per-sample gradients of the Lagrangian's "
        "constraint term sum_c lambda_c sign(nu_c) nu_c clipped to C, and each record's soft predictions in its "
        "group's row of the group mass (radius 1), both noised at one multiplier sigma (two releases, one "
        "composed mechanism, PLD); the server estimates the violations nu from the noised group mass for the "
        "dual step; the loss gradient g comes from the non-sensitive division's own sample and is sent in the "
        "clear (it does not depend on s)",
    )
)
