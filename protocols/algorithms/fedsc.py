"""FedSC: federated self-supervised learning with the spectral contrastive objective; silos share correlation
matrices of their representations through DP-CalR (noise added in the silo) and train on the global loss. Server:
`strategies.fedsc` (`FedscStrategy`: correlation-matrix aggregation, central kNN monitor and linear probe); silo:
`client.rounds.fedsc` (`correlation_reply`, `train_round`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import Algorithm, local_epochs_rounds
from silofl.protocols.options import CalrOptions, LocalEpochsOptions, PrivacyOptions, SgdOptions, SslOptions

#: docs/RESULTS.md's FedSC configuration (Fashion-MNIST, 10 silos x 1 class, 800 one-step rounds, FedAdam at the
#: server): `benchmarks/fedsc_fmnist.py --rounds 800 --records 6000 --local-steps 1 --batch-size 13 --alpha-start 0.1
#: --alpha-end 0.1 --server-optimizer adam --server-lr 0.002 --calr-sampling-rate 0.01 --eval-every 200`. The
#: default dataset is scikit-learn's digits (embedded, works offline); `--dataset fashion-mnist` is the benchmark's.
SSL_DEFAULTS: dict[str, Any] = {
    "dataset": "digits",
    "num-silos": 10,
    "partition": "classes",
    "classes-per-silo": 1,
    "max-train-records": 6000,
    "rounds": 800,
    "local-steps": 1,
    "batch-size": 13,
    "lr": 0.05,
    "server-optimizer": "adam",
    "server-lr": 2e-3,
    "eval-every": 200,
}
SSL_SUMMARY = {"linear probe acc.": "accuracy", "kNN acc.": "knn_accuracy"}
SSL_PROGRESS = {"kNN": "knn_accuracy", "probe": "accuracy"}
SSL_NOT_COVERED = (
    "the trained weights each participant sends every round (DP-CalR protects the correlation matrices only, as in "
    "the FedSC paper); the evaluation is central, on the server's own labelled data"
)


class SslRoundFields(BaseModel):
    """What the FedSC server sets in each round's train instruction (FedAvg+SC: alpha 1, no shares)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        allow_inf_nan=False,
        alias_generator=lambda s: s.replace("_", "-"),
    )

    alpha: float = Field(default=1.0, ge=0.0, le=1.0, description="this round's alpha_t (eq. 80)")
    planned_shares: int = Field(default=0, ge=0, description="correlation shares the schedule can ask for")


#: What FedSC and FedAvg+SC share in their registry entries: rounds from local epochs, the round fields their silos
#: read, checkpoint resume (the strategy checkpoints its cache and FedAdam's moments), the starting model fixed by the
#: strategy (`initial_arrays`), the model written to model.npz, the self-supervised metrics, the "fedsc" figure.
SSL_ENTRY: dict[str, Any] = {
    "rounds": local_epochs_rounds,
    "instruction_fields": SslRoundFields,
    "resumable": True,
    "initial_model": "",
    "model_output": "npz",
    "summary_metrics": SSL_SUMMARY,
    "fairness_metrics": False,
    "progress_metrics": SSL_PROGRESS,
    "plots": ("fedsc",),
    "federated_evaluation": False,  # the encoder is evaluated on the server's own probe data
    "server_evaluator": "silofl.server.ssl_evaluation:central_evaluator",
}


def mechanism(config: Any) -> str:
    add_remove = config.calr_relation == "add_remove"
    divisor = (
        "divided by q (the server divides by the public n_j: a divisor the added or removed record would change "
        "cannot be inside the mechanism)"
        if add_remove
        else "divided by q n_j"
    )
    if config.calr_sampling_rate < 1.0:
        return (
            "Poisson-subsampled DP-CalR (silofl's extension of FedSC Algorithm 2): each time a silo shares, every "
            f"record joins with probability q = {config.calr_sampling_rate:g}, and the sum over the sample of each "
            f"record's mean over V views of z z^T (z clipped to norm sqrt(mu)), {divisor}, gets i.i.d. Gaussian "
            "noise on every entry, added in the silo; sigma from the accountant for (epsilon, delta) over the "
            "schedule's shares as Poisson-subsampled Gaussians (one record's term: norm <= mu / (q n_j)); the ledger "
            "counts the shares that happened"
        )
    matrix = (
        "correlation sum (over its records of each record's mean over V views of z z^T, z clipped to norm sqrt(mu); "
        "the server divides it by the public n_j)"
        if add_remove
        else "correlation matrix (mean over its records and V views of z z^T, z clipped to norm sqrt(mu))"
    )
    return (
        f"DP-CalR (FedSC Algorithm 2): each time a silo shares, its {matrix} gets i.i.d. Gaussian noise on every "
        "entry, added in the silo; sigma from the accountant for (epsilon, delta) over the schedule's shares "
        "(sampling rate 1); the ledger counts the shares that happened"
    )


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The shares each silo actually made, its noise, and the paper's closed form (FedSC, Jing et al., ICML 2024,
    Proposition 6.6 with its missing |D_j|^2 restored: docs/FEDSC.md, "Privacy") next to the accountant's epsilon the
    silo's ledger reports."""
    from silofl.protocols.privacy.calr import calr_closed_form_epsilon

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


SPEC = register(
    Algorithm(
        name="fedsc",
        summary="FedSC: federated spectral contrastive learning, correlation matrices shared through DP-CalR (images)",
        options=(PrivacyOptions, SslOptions, SgdOptions, LocalEpochsOptions, CalrOptions),
        defaults={
            **SSL_DEFAULTS,
            "calr-sampling-rate": 0.01,
            "alpha-start": 0.1,
            "alpha-end": 0.1,
        },
        strategy="silofl.strategies.fedsc:build_fedsc",
        silo={
            "train": "silofl.client.rounds.fedsc:train_round",
            "query.correlation": "silofl.client.rounds.fedsc:correlation_reply",
        },
        **SSL_ENTRY,
        mechanism=mechanism,
        protects="the correlation matrices each silo shares (DP-CalR)",
        not_covered=SSL_NOT_COVERED,
        privacy_report="silofl.protocols.algorithms.fedsc:privacy_report",
    )
)
