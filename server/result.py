"""The result of a run (`result.json`): config, federation, per-round metrics, final metrics, privacy report, timing.

Built from what the server learned (the strategy's history and the silos' public reports); the privacy block reports
the epsilon the silos' own ledgers computed, and for SteFFLe the papers' closed-form noise next to the noise used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from protocols.config import SSL_ALGORITHMS, RunConfig
from strategies.base import Federation, RunHistory


def build_result(
    config: RunConfig,
    federation: Federation,
    history: RunHistory,
    *,
    rounds: int,
    delta: float,
    engine: str,
    total_seconds: float,
    round_seconds: float,
) -> dict[str, Any]:
    """The `result.json` document."""
    final = history.last_evaluation or {}
    per_silo = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        per_silo[str(silo_id)] = {
            "epsilon_spent": _num(report.epsilon_spent),
            "noise_multiplier": report.noise_multiplier,
            "sampling_rate": report.sampling_rate,
            "n_train": report.num_examples,
            "rounds_answered": report.server_round,
        }
    spent = max((r.epsilon_spent for r in history.silo_reports.values()), default=math.inf)
    privacy_extra: dict[str, Any] = {}
    if config.algorithm == "steffle":
        privacy_extra = _steffle_privacy(config, history, rounds, delta)
    elif config.algorithm == "tran":
        privacy_extra = {"relation": "replace_one (the sensitive attribute of one record)"}
    elif config.algorithm == "fedsc":
        privacy_extra = _fedsc_privacy(config, history, delta)
    elif config.algorithm in ("mu2fl", "noisy-sgd") and history.server_state:
        privacy_extra = _single_pass_privacy(config, history, rounds, delta)
        spent = privacy_extra.pop("epsilon_spent", spent)
    return {
        "config": config.to_json(),
        "engine": engine,
        "federation": {
            "silos": [
                {"silo_id": e.info.silo_id, "node_id": e.node_id, "n_train": e.info.n_train, "n_test": e.info.n_test}
                for e in federation.silos
            ],
            "num_features": federation.info.num_features,
            "num_labels": federation.info.num_labels,
            "num_groups": federation.info.num_groups,
            "label_names": list(federation.info.label_names),
            "group_names": list(federation.info.group_names),
            "rounds": rounds,
        },
        "rounds": [r.to_json() for r in history.rounds],
        "final": {
            "accuracy": final.get("accuracy"),
            "error": final.get("error"),
            "loss": final.get("loss"),
            "dp_violation": final.get("dp_violation"),
            "eo_violation": final.get("eo_violation"),
            "eopp_violation": final.get("eopp_violation"),
            **{k: final[k] for k in ("knn_accuracy", "probe_train_accuracy") if k in final},
        },
        "privacy": {
            "epsilon_target": _num(config.epsilon),
            "epsilon_spent": _num(spent),
            "delta": delta,
            "per_silo": per_silo,
            "accountant": config.accountant if config.private else "none (no noise: epsilon = inf)",
            "mechanism": _mechanism(config),
            "not_covered": _not_covered(config),
            **privacy_extra,
        },
        "timing": {
            "total_seconds": total_seconds,
            "seconds_per_round": round_seconds / max(rounds, 1),
        },
        "model": (
            "in model.npz next to this file (too large for JSON)"
            if config.algorithm in SSL_ALGORITHMS
            else {name: arr.numpy().tolist() for name, arr in history.arrays.items()}
        ),
        "server_state": history.server_state,
    }


def _steffle_privacy(config: RunConfig, history: RunHistory, rounds: int, delta: float) -> dict[str, Any]:
    """SteFFLe's report: the relation, and per silo the noise it used next to the papers' closed form (Theorem 3.3).

    Both as the std per coordinate of the noise on the batch MEAN (the papers' sigma). The closed form is evaluated
    with L = 1 (the Lipschitz constant of F in theta is not known for a general model) and D = w-radius.
    """
    from protocols.privacy.closed_form import steffle_closed_form

    out: dict[str, Any] = {"relation": "replace_one (the sensitive attribute of one record)"}
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


def _single_pass_privacy(config: RunConfig, history: RunHistory, rounds: int, delta: float) -> dict[str, Any]:
    """DP-mu2-FL / noisy SGD: the paper's rho, its closed-form epsilon, and for a trusted server the accountant's
    epsilon of the server's noise (the silos' messages are not private then; the released x_t are)."""
    from protocols import mu2

    rho = float(history.server_state["rho"])
    out: dict[str, Any] = {"rho": _num(rho), "epsilon_closed_form": _num(mu2.rho_to_epsilon(rho, delta))}
    if config.trust == "trusted":
        out["trust"] = "trusted server: silos send un-noised messages; the released x_t are DP by the server's noise"
        if math.isfinite(rho):
            mu2_run = config.algorithm == "mu2fl"
            multiplier = mu2.noise_multiplier(rho, rounds) if mu2_run else 1.0 / rho
            out["epsilon_spent"] = mu2.accountant_epsilon(multiplier, rounds if mu2_run else 1, delta)
    return out


def _not_covered(config: RunConfig) -> str:
    if config.algorithm in SSL_ALGORITHMS:
        text = (
            "the trained weights each participant sends every round (DP-CalR protects the correlation matrices only, "
            "as in the FedSC paper); the evaluation is central, on the server's own labelled data"
        )
        return text if config.algorithm == "fedsc" else "everything: FedAvg+SC adds no noise; " + text
    return "federated evaluation: exact confusion counts of each silo's held-out test split"


def _fedsc_privacy(config: RunConfig, history: RunHistory, delta: float) -> dict[str, Any]:
    """FedSC: the shares each silo actually made, its noise, and the paper's closed form (Proposition 6.6 as
    corrected in the spec) next to the accountant's epsilon the silo's ledger reports."""
    from protocols.privacy.calr import calr_closed_form_epsilon

    state = history.server_state or {}
    subsampled = config.calr_sampling_rate < 1.0
    if subsampled:
        rate = config.calr_sampling_rate
        relation = f"{config.calr_relation} (Poisson rate q = {rate:g}; one record's term has norm <= mu / (q n_j))"
    else:
        relation = f"{config.calr_relation} (sensitivity of DP-CalR's matrix: " + (
            "sqrt(2) mu / n_j)" if config.calr_relation == "replace_one" else "mu / n_j)"
        )
    out: dict[str, Any] = {
        "relation": relation,
        "calr_sampling_rate": config.calr_sampling_rate,
        "planned_shares": state.get("planned_shares"),
    }
    if not config.private:
        return out
    per_silo = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        key = str(silo_id)
        shares = int(state.get("shares", {}).get(key, 0))
        sigma = float(state.get("noise_std", {}).get(key, 0.0))
        entry: dict[str, Any] = {"shares": shares, "noise_std": sigma}
        if shares and sigma > 0 and not subsampled:  # Proposition 6.6 is for shares of every record
            entry["epsilon_closed_form"] = calr_closed_form_epsilon(
                shares, config.mu, sigma, report.num_examples, delta, config.calr_relation
            )
        per_silo[key] = entry
    out["correlation_shares"] = per_silo
    return out


def _mechanism(config: RunConfig) -> str:
    if config.algorithm == "steffle":
        return (
            "privacy of the sensitive attributes (replace-one relation). Each silo: a Gaussian histogram of its "
            "(group, label) counts (radius sqrt(2)/2, spending counts-share of epsilon), then each round a Poisson "
            "sample q = m/n_j drawn by the sensitive division: per-sample theta-gradients of psi clipped to C and the "
            "s-dependent W-gradients (radius 2/sqrt(rho)), both noised at one multiplier sigma (two releases, one "
            "composed mechanism, PLD); the loss gradient g and the s-independent part of the W-gradient come from "
            "the non-sensitive division's own sample and are sent in the clear (they do not depend on s)"
        )
    if config.algorithm == "tran":
        return (
            "privacy of the sensitive attributes (replace-one relation). Each silo: a Gaussian histogram of its "
            "(group, label) counts (radius sqrt(2)/2, spending counts-share of epsilon), then each round a Poisson "
            "sample q = m/n_j drawn by the sensitive division: the per-sample gradients of the Lagrangian's "
            "constraint term sum_c lambda_c sign(nu_c) nu_c clipped to C, and each record's soft predictions in its "
            "group's row of the group mass (radius 1), both noised at one multiplier sigma (two releases, one "
            "composed mechanism, PLD); the server estimates the violations nu from the noised group mass for the "
            "dual step; the loss gradient g comes from the non-sensitive division's own sample and is sent in the "
            "clear (it does not depend on s)"
        )
    if config.algorithm == "mu2fl":
        return (
            "each round each silo releases q_t = t d_t (corrected momentum over all its records so far; one record "
            "moves it by at most 2S/b), with Gaussian noise 2S sqrt(T)/(rho b) added in the silo (untrusted) or once "
            "at the server on the mean (trusted, /M); T rounds compose to (alpha, alpha rho^2/2)-RDP (the paper's "
            "Theorems 5.1/6.1)"
        )
    if config.algorithm == "noisy-sgd":
        return (
            "single pass: each record is used in one round; each silo releases its mean gradient (sensitivity 2G/b) "
            "with Gaussian noise 2G/(rho b) (untrusted; trusted: once at the server, /M): one release per record"
        )
    if config.algorithm == "fedsc" and config.calr_sampling_rate < 1.0:
        return (
            "Poisson-subsampled DP-CalR (silofl's extension of FedSC Algorithm 2): each time a silo shares, every "
            f"record joins with probability q = {config.calr_sampling_rate:g}, and the sum over the sample of each "
            "record's mean over V views of z z^T (z clipped to norm sqrt(mu)), divided by q n_j, gets i.i.d. Gaussian "
            "noise on every entry, added in the silo; sigma from the accountant for (epsilon, delta) over the "
            "schedule's shares as Poisson-subsampled Gaussians (one record's term: norm <= mu / (q n_j)); the ledger "
            "counts the shares that happened"
        )
    if config.algorithm == "fedsc":
        return (
            "DP-CalR (FedSC Algorithm 2): each time a silo shares, its correlation matrix (mean over its records and "
            "V views of z z^T, z clipped to norm sqrt(mu)) gets i.i.d. Gaussian noise on every entry, added in the "
            "silo; sigma from the accountant for (epsilon, delta) over the schedule's shares (sampling rate 1); the "
            "ledger counts the shares that happened"
        )
    if config.algorithm == "dp-fedsgd":
        return (
            "each silo: Poisson sampling q = m/n_j, per-sample clipping to C, Gaussian noise sigma*C on the sum "
            "(add/remove neighbours), one release per round; sigma from the accountant for (epsilon, delta, q, T)"
        )
    return "none"


def _num(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def write_result(result: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, allow_nan=False))
    tmp.replace(path)
    return path
