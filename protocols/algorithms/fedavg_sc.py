"""FedAvg+SC: the FedSC paper's baseline, the same local spectral contrastive training with alpha = 1 and nothing
shared (non-private). Server: `strategies.fedsc` (`FedscStrategy`, built by `build_fedavg_sc`); silo:
`client.rounds.fedsc` (`train_round_fedavg_sc`)."""

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import Algorithm
from silofl.protocols.algorithms.fedsc import SSL_DEFAULTS, SSL_ENTRY, SSL_NOT_COVERED
from silofl.protocols.options import LocalEpochsOptions, SgdOptions, SslOptions

SPEC = register(
    Algorithm(
        name="fedavg-sc",
        summary="FedAvg+SC: local spectral contrastive training averaged by FedAvg (FedSC's baseline; images)",
        options=(SslOptions, SgdOptions, LocalEpochsOptions),
        defaults=SSL_DEFAULTS,
        aliases=("fedavg+sc", "fedavg_sc"),
        strategy="silofl.strategies.fedsc:build_fedavg_sc",
        silo={"train": "silofl.client.rounds.fedsc:train_round_fedavg_sc"},
        **SSL_ENTRY,
        not_covered="everything: FedAvg+SC adds no noise; " + SSL_NOT_COVERED,
    )
)
