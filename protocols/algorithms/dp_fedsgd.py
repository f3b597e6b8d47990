"""DP-FedSGD: record-level DP with the noise added in each silo (ISRL-DP). Each round each silo Poisson-samples a
minibatch (q = m / n_j), clips per-sample gradients to C, adds Gaussian noise sigma C to the sum and divides by the
public batch size m; the server averages and steps. Server: `strategies.dp_fedsgd` (`DpFedSgdStrategy`); silo:
`client.rounds.dp_fedsgd`."""

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import RECORD_PROTECTED, Algorithm
from silofl.protocols.algorithms.common import MINIBATCH_DEFAULTS
from silofl.protocols.options import (
    ClipOptions,
    DeviceOptions,
    GroupReportOptions,
    LrDecayOptions,
    PrivacyOptions,
    SgdOptions,
    TabularModelOptions,
)

SPEC = register(
    Algorithm(
        name="dp-fedsgd",
        summary="record-level DP-FedSGD: clipped per-sample gradients, Gaussian noise added in each silo",
        options=(
            PrivacyOptions,
            TabularModelOptions,
            DeviceOptions,
            SgdOptions,
            LrDecayOptions,
            ClipOptions,
            GroupReportOptions,
        ),
        defaults=MINIBATCH_DEFAULTS,
        aliases=("dpfedsgd", "dp_fedsgd"),
        noised_for=("silo",),
        protects=RECORD_PROTECTED,
        strategy="silofl.strategies.dp_fedsgd:build",
        silo={"train": "silofl.client.rounds.dp_fedsgd:train_round"},
        plots=("fairness", "privacy"),
        mechanism="each silo: Poisson sampling q = m/n_j, per-sample clipping to C, Gaussian noise sigma*C on the sum "
        "(add/remove neighbours), one release per round; sigma from the accountant for (epsilon, delta, q, T)",
    )
)
