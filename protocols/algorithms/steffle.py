"""SteFFLe (private and fair federated learning; DP-FERMI with one silo): the ERMI regularizer solved by SGDA, the
noise on the sensitive attributes added by each silo's sensitive division. Server: `strategies.steffle`
(`SteffleStrategy`: descent on theta, projected ascent on W; with separate parties
`strategies.steffle_parties`); silo: `client.rounds.steffle` (group counts, then each round the loss
gradient in the clear and the noised fairness gradients)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import SENSITIVE_PROTECTED, Algorithm
from silofl.protocols.algorithms.common import MINIBATCH_DEFAULTS
from silofl.protocols.algorithms.sensitive_attributes import (
    LOSS_RELEASE,
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
    ErmiOptions,
    FairnessOptions,
    GroupReportOptions,
    LrDecayOptions,
    PrivacyOptions,
    ProtectOptions,
    SamplingOptions,
    SgdOptions,
    TabularModelOptions,
    TopologyOptions,
)

PARTIES_REPORT = (
    'separate parties with sealed records (SECURITY.md, "`steffle` with separate parties"): at setup '
    "each feature party sends each sensitive party the (pseudonym, features, label) of the records whose sensitive "
    "attribute that party holds, encrypted end to end (X25519 + AES-GCM; pseudonyms: a keyed hash the server does not "
    "hold); each sensitive party owns its ledger and budget and samples the records it received with its own secret "
    "coins at the silos' rate q = m / (n / N), so it claims the silos' amplification. The server sees the model, W, "
    "the feature parties' mean loss gradients and s-independent W parts, the sensitive parties' noised means, sealed "
    "bytes and public counts (records per party, coverage): no record id, feature, label, output or Jacobian. A "
    "sensitive party learns the features and labels of the records whose attribute it holds. The guarantee covers "
    "the sensitive attributes only"
)


def label(config: Mapping[str, Any]) -> str:
    """The papers' names: DP-FERMI / FERMI for one silo, SteFFLe otherwise; "(whole record)" after a private run
    under `protect` = record, whose epsilon means another thing."""
    epsilon = config.get("epsilon", math.inf)
    private = math.isfinite(
        float(epsilon) if not isinstance(epsilon, str) else float(epsilon.replace("infinity", "inf"))
    )
    record = " (whole record)" if private and config.get("protect") == "record" else ""
    if int(config.get("num-silos", 3)) == 1:
        return ("dp-fermi" if private else "fermi") + record
    return ("steffle" if private else "steffle (non-private)") + record


SILOS_MECHANISM = SILOS_HISTOGRAM + (
    "per-sample theta-gradients of psi clipped to C and the s-dependent W-gradients (radius "
    "2/sqrt(rho); 2/(sqrt(k) rho) with group-weight balanced; with w-noise per-group, or auto, each group's row at "
    "its own radius, 2/sqrt(p_S(r)), through a release scaled to radius 1), both noised at one multiplier sigma (two "
    "releases, one composed mechanism, PLD); the loss gradient g and the s-independent part of the W-gradient come "
    "from the non-sensitive division's own {own} and are sent in the clear (they do not depend on s; with "
    "group-weight balanced that part is computed from the noised W release instead){accounting}"
)
PARTIES_MECHANISM = (
    "privacy of the sensitive attributes (replace-one relation), topology {topology}, sealed records. Each sensitive "
    "party: a Gaussian histogram of the (group, label) counts of the records it received (radius sqrt(2)/2, spending "
    "counts-share of epsilon), then every round, on its own secret Poisson sample of them at the silos' rate q = m / "
    "(n / N), per-sample theta-gradients of psi (F and J_F computed by it from the broadcast model) clipped to C and "
    "the s-dependent W-gradients (radius 2/sqrt(rho); with w-noise per-group, or auto, each group's row at its own "
    "radius), both noised at one multiplier sigma (two releases, one composed mechanism, amplified by q; PLD): a "
    "silo's sensitive division. The feature parties add no noise: their mean loss gradients and s-independent W parts "
    "over their own samples do not depend on s"
)


#: The releases of a round under `protect` = record, per (lambda > 0, group-weight balanced).
RECORD_RELEASES = {
    False: LOSS_RELEASE,
    True: "per-record loss gradients clipped to C, per-record theta-gradients of psi clipped to C, the s-dependent "
    "W-gradients (radius 2/sqrt(rho); with w-noise per-group each group's row at its own radius) and each record's "
    "soft predictions F(x_i) in its W block (radius 1: the silo computes the -2 W (.) F part of the W-gradient from "
    "them after the noise)",
    "balanced": "per-record loss gradients clipped to C, per-record theta-gradients of psi clipped to C and the "
    "s-dependent W-gradients (radius 2/(sqrt(k) rho); the whole W-gradient follows from them after the noise)",
}


def mechanism(config: Any) -> str:
    """What the silos (or the sensitive parties) release, and how it is noised."""
    if protects_record(config):
        if config.lam <= 0:
            return record_mechanism(config, "", 0)
        balanced = config.group_weight == "balanced"
        return record_mechanism(config, RECORD_RELEASES["balanced" if balanced else True], 3 - balanced)
    if config.topology == "silos":
        return SILOS_MECHANISM.format(**SAMPLERS[config.sampling])
    return PARTIES_MECHANISM.format(topology=config.topology)


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The relation, and per silo the noise it used next to the papers' closed form (Theorem 3.3).

    Both as the std per coordinate of the noise on the batch MEAN (the papers' sigma). The closed form is evaluated
    with L = 1 (the Lipschitz constant of F in theta is not known for a general model) and D = w-radius.
    """
    import numpy as np

    from silofl.protocols.privacy.closed_form import steffle_closed_form

    record = protects_record(config)
    out: dict[str, Any] = {
        "relation": RECORD_RELATION if record else RELATION,
        **protection_report(config, IN_CLEAR),
        **sampling_report(config, history, rounds),
    }
    if record:
        releases = 1 if config.lam <= 0 else (3 if config.group_weight == "balanced" else 4)
        out.update(replace_one_report(config, history, rounds, delta, releases))
    if config.topology != "silos":
        out["parties"] = PARTIES_REPORT
        out["per_silo_role"] = "sensitive parties (the feature parties add no noise and spend no budget)"
        return out
    if not config.private or not history.server_state:
        return out
    prior = np.asarray(history.server_state["prior"], dtype=np.float64)
    rho = float(min(prior.ravel()))
    # the W-gradient's radius: 2 / sqrt(rho), or 2 / (sqrt(k) rho) for the group-balanced objective
    # (protocols.fairness_prior)
    balanced = config.group_weight == "balanced"
    w_bound = 2.0 / (math.sqrt(prior.shape[-1]) * rho) if balanced else 2.0 / math.sqrt(rho)
    per_silo = {}
    labels = prior.shape[0] if prior.ndim == 2 else len(history.server_state["w"][0])
    for silo_id, report in sorted(history.silo_reports.items()):
        m = max(1, round(report.sampling_rate * report.num_examples))
        # the divisor of the released sums: q n_j, or under protect record the public batch size m
        expected = config.batch_size if record else report.sampling_rate * report.num_examples
        paper = steffle_closed_form(
            config.epsilon,
            delta,
            report.num_examples,
            m,
            rounds,
            rho,
            1.0,
            config.w_radius,
            whole_record=record,
            num_labels=labels,
        )
        per_silo[str(silo_id)] = {
            **({"silofl_sigma_loss": report.noise_multiplier * config.clip / expected} if record else {}),
            "silofl_sigma_theta": report.noise_multiplier * config.clip / expected,
            "silofl_sigma_w": report.noise_multiplier * w_bound / expected,
            "papers_sigma_theta": paper["sigma_theta"],
            "papers_sigma_w": paper["sigma_w"],
            "papers_conditions_hold": paper["valid"],
        }
    theorem = (
        "Theorem D.2's second part (DP of all features; it adds no noise to the loss gradient, which silofl clips "
        "and noises as it does theta's)"
        if record
        else "Theorem 3.3"
    )
    out["closed_form"] = {
        "note": "noise std per coordinate on the batch mean; the run uses silofl's (from the accountant); the papers' "
        f"{theorem} evaluated with L = 1, D = w-radius, rho = the smallest prior probability",
        "per_silo": per_silo,
    }
    return out


def check(config: Any) -> None:
    """Options of the parties that only some topologies read."""
    check_sampling_and_protect(config)
    if config.topology != "general" and config.sensitive_parties != 1:
        raise ValueError(
            f"'sensitive-parties' is for topology 'general'; topology {config.topology!r} fixes the number of "
            "sensitive parties (drop the key)"
        )
    if config.topology != "general" and config.sensitive_by:
        raise ValueError(
            f"'sensitive-by' deals the ids to the sensitive parties of topology 'general'; topology "
            f"{config.topology!r} fixes who holds which id (drop the key)"
        )
    if config.topology != "silos" and config.group_weight != "prior":
        raise ValueError(
            "'group-weight balanced' is implemented for topology 'silos' only (the sensitive parties compute the "
            "papers' ERMI); drop the key or use topology silos"
        )


#: What leaves a silo un-noised (the console says it is not protected).
IN_CLEAR = (
    "the features and labels: each silo's (or feature party's) loss gradient and the s-independent part of its "
    "W-gradient reach the server without noise"
)


SPEC = register(
    Algorithm(
        name="steffle",
        summary="SteFFLe: private and fair FL (ERMI; --num-silos 1 is DP-FERMI), noise on the sensitive attributes "
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
            ErmiOptions,
            ProtectOptions,
            TopologyOptions,
        ),
        defaults=MINIBATCH_DEFAULTS,
        check=check,
        noised_for=("sensitive",),
        noised_for_record=("silo",),
        strategy="silofl.strategies.steffle:build",
        silo={
            "train": "silofl.client.rounds.steffle:train_round",
            "query.groups": "silofl.client.rounds.steffle:group_counts",
            "features:train": "silofl.client.rounds.steffle_parties:feature_train",
            "sensitive:query.groups": "silofl.client.rounds.steffle_parties:group_counts",
            "sensitive:query.sensitive": "silofl.client.rounds.steffle_parties:sensitive_round",
        },
        plots=("fairness", "privacy"),
        label=label,
        privacy_report="silofl.protocols.algorithms.steffle:privacy_report",
        mechanism=mechanism,
        protects=SENSITIVE_PROTECTED,
        in_clear=IN_CLEAR,
        not_covered=NOT_COVERED,
    )
)
