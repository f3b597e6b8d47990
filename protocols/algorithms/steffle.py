"""SteFFLe (private and fair federated learning; DP-FERMI with one silo): the ERMI regularizer solved by SGDA, the
noise on the sensitive attributes added by each silo's sensitive division. Server: `strategies.noisy_aggregation`
(descent on theta, projected ascent on W); silo: `client.rounds.steffle` (group counts, then each round the loss
gradient in the clear and the noised fairness gradients)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from protocols.algorithms import register
from protocols.algorithms.base import Algorithm
from protocols.algorithms.dp_fedsgd import MINIBATCH_DEFAULTS
from protocols.options import (
    ClipOptions,
    ErmiOptions,
    FairnessOptions,
    LrDecayOptions,
    PrivacyOptions,
    SgdOptions,
    TabularModelOptions,
)

RELATION = "replace_one (the sensitive attribute of one record)"


def label(config: Mapping[str, Any]) -> str:
    """The papers' names: DP-FERMI / FERMI for one silo, SteFFLe otherwise."""
    epsilon = config.get("epsilon", math.inf)
    private = math.isfinite(
        float(epsilon) if not isinstance(epsilon, str) else float(epsilon.replace("infinity", "inf"))
    )
    if int(config.get("num-silos", 3)) == 1:
        return "dp-fermi" if private else "fermi"
    return "steffle" if private else "steffle (non-private)"


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The relation, and per silo the noise it used next to the papers' closed form (Theorem 3.3).

    Both as the std per coordinate of the noise on the batch MEAN (the papers' sigma). The closed form is evaluated
    with L = 1 (the Lipschitz constant of F in theta is not known for a general model) and D = w-radius.
    """
    import numpy as np

    from protocols.privacy.closed_form import steffle_closed_form

    out: dict[str, Any] = {"relation": RELATION}
    if not config.private or not history.server_state:
        return out
    rho = float(min(np.asarray(history.server_state["prior"], dtype=np.float64).ravel()))
    per_silo = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        m = max(1, round(report.sampling_rate * report.num_examples))
        expected = report.sampling_rate * report.num_examples
        paper = steffle_closed_form(config.epsilon, delta, report.num_examples, m, rounds, rho, 1.0, config.w_radius)
        per_silo[str(silo_id)] = {
            "silofl_sigma_theta": report.noise_multiplier * config.clip / expected,
            "silofl_sigma_w": report.noise_multiplier * (2.0 / math.sqrt(rho)) / expected,
            "papers_sigma_theta": paper["sigma_theta"],
            "papers_sigma_w": paper["sigma_w"],
            "papers_conditions_hold": paper["valid"],
        }
    out["closed_form"] = {
        "note": "noise std per coordinate on the batch mean; the run uses silofl's (from the accountant); the papers' "
        "Theorem 3.3 evaluated with L = 1, D = w-radius, rho = the smallest prior probability",
        "per_silo": per_silo,
    }
    return out


SPEC = register(
    Algorithm(
        name="steffle",
        summary="SteFFLe: private and fair FL (ERMI; --num-silos 1 is DP-FERMI), noise on the sensitive attributes",
        options=(
            PrivacyOptions,
            TabularModelOptions,
            SgdOptions,
            LrDecayOptions,
            ClipOptions,
            FairnessOptions,
            ErmiOptions,
        ),
        defaults=MINIBATCH_DEFAULTS,
        strategy="strategies.noisy_aggregation:build",
        silo={"train": "client.rounds.steffle:train_round", "query.groups": "client.rounds.steffle:group_counts"},
        plots=("fairness", "privacy"),
        label=label,
        privacy_report="protocols.algorithms.steffle:privacy_report",
        mechanism="privacy of the sensitive attributes (replace-one relation). Each silo: a Gaussian histogram of its "
        "(group, label) counts (radius sqrt(2)/2, spending counts-share of epsilon), then each round a Poisson "
        "sample q = m/n_j drawn by the sensitive division: per-sample theta-gradients of psi clipped to C and the "
        "s-dependent W-gradients (radius 2/sqrt(rho)), both noised at one multiplier sigma (two releases, one "
        "composed mechanism, PLD); the loss gradient g and the s-independent part of the W-gradient come from "
        "the non-sensitive division's own sample and are sent in the clear (they do not depend on s)",
    )
)
