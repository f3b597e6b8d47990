"""FedAvg (McMahan et al. 2017), non-private: each round every silo runs `local-epochs` of minibatch SGD from the
global model; the server averages the models weighted by records. Server: `strategies.fedavg` (`FedAvg`); silo:
`client.rounds.fedavg`."""

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import Algorithm, local_epochs_rounds
from silofl.protocols.options import (
    DeviceOptions,
    GroupReportOptions,
    LocalEpochsOptions,
    SgdOptions,
    TabularModelOptions,
)

SPEC = register(
    Algorithm(
        name="fedavg",
        summary="non-private FedAvg: local SGD epochs, the server averages the models",
        options=(TabularModelOptions, DeviceOptions, SgdOptions, LocalEpochsOptions, GroupReportOptions),
        # the SteFFLe sweeps' FedAvg baseline (docs/RESULTS.md): 40 rounds of one local epoch at lr 0.25
        defaults={"epochs": 40.0, "lr": 0.25},
        strategy="silofl.strategies.fedavg:build",
        silo={"train": "silofl.client.rounds.fedavg:train_round"},
        rounds=local_epochs_rounds,
        plots=("fairness", "privacy"),
    )
)
