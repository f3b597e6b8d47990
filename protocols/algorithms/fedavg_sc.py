"""FedAvg+SC: the FedSC paper's baseline, the same local spectral contrastive training with alpha = 1 and nothing
shared (non-private). Server: `strategies.correlation` (`build_fedavg_sc`); silo: `client.rounds.fedsc`
(`train_round_fedavg_sc`)."""

from protocols.algorithms import register
from protocols.algorithms.base import Algorithm, local_epochs_rounds
from protocols.algorithms.fedsc import SSL_DEFAULTS, SSL_NOT_COVERED, SSL_PROGRESS, SSL_SUMMARY, SslRoundFields
from protocols.options import LocalEpochsOptions, SgdOptions, SslOptions

SPEC = register(
    Algorithm(
        name="fedavg-sc",
        summary="FedAvg+SC: local spectral contrastive training averaged by FedAvg (FedSC's baseline; images)",
        options=(SslOptions, SgdOptions, LocalEpochsOptions),
        defaults=SSL_DEFAULTS,
        aliases=("fedavg+sc", "fedavg_sc"),
        strategy="strategies.correlation:build_fedavg_sc",
        silo={"train": "client.rounds.fedsc:train_round_fedavg_sc"},
        rounds=local_epochs_rounds,
        instruction_fields=SslRoundFields,
        resumable=False,
        initial_model="",
        model_output="npz",
        summary_metrics=SSL_SUMMARY,
        fairness_metrics=False,
        progress_metrics=SSL_PROGRESS,
        plots=("fedsc",),
        not_covered="everything: FedAvg+SC adds no noise; " + SSL_NOT_COVERED,
    )
)
