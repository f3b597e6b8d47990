"""FedFDP (Ling et al. 2024): fairness as equal loss across silos (the variance of their losses, weight lambda) under
record-level DP with the noise added in each silo (arXiv 2402.16028, Alg. 2). The math is `protocols/fedfdp.py`;
server: `strategies.fedfdp` (`FedfdpStrategy`); silo: `client.rounds.fedfdp` over `client.algorithms.fedfdp`.

Defaults: silofl's setting for the SteFFLe comparison (the SteFFLe paper gives no FedFDP hyper-parameters),
q_j = 256 / n_j and T = ceil(40 n_mean / 256) (40 epochs at batch 256, as DP-FedSGD), C = 1 and eta = 0.25 from the
grid C in {0.1, 0.5, 1, 2, 5}, eta in {0.1, 0.25, 1}, lambda = 0.1; epsilon as every private algorithm (inf unless
given).
"""

from __future__ import annotations

import math
from typing import Any

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import RECORD_PROTECTED, Algorithm
from silofl.protocols.options import (
    ClipOptions,
    DeviceOptions,
    GroupReportOptions,
    LossFairnessOptions,
    PrivacyOptions,
    SgdOptions,
    TabularModelOptions,
)

DEFAULTS = {"epochs": 40.0, "batch-size": 256, "lr": 0.25, "clip": 1.0, "lambda": 0.1}

RELATION = "add_remove (one whole record (x, s, y) of a silo)"

CAVEAT = (
    "FedFDP's epsilon covers the whole record (x, s, y); SteFFLe's covers the sensitive attribute s only. Under "
    "SteFFLe's notion FedFDP would need no noise at all: compare with its non-private run (--epsilon inf) too"
)


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The loss release's noise, and the paper's gradient-only epsilon of what ran (for comparison only)."""
    from silofl.protocols import fedfdp
    from silofl.protocols.privacy import accountant

    paper = {
        str(silo_id): fedfdp.paper_epsilon(report.noise_multiplier, report.sampling_rate, report.server_round, delta)
        if report.noise_multiplier > 0
        else math.inf
        for silo_id, report in sorted(history.silo_reports.items())
    }
    worst = max(paper.values(), default=math.inf)
    ours = [
        accountant.epsilon_spent(
            report.noise_multiplier, report.sampling_rate, report.server_round, delta, accountant=config.accountant
        )
        for report in history.silo_reports.values()
    ]
    gradient_only = max(ours, default=math.inf)
    return {
        "relation": RELATION,
        "loss_noise_ratio": fedfdp.LOSS_NOISE_RATIO,
        "loss_noise_multiplier": {
            str(silo_id): fedfdp.LOSS_NOISE_RATIO * report.noise_multiplier
            for silo_id, report in sorted(history.silo_reports.items())
        },
        "epsilon_gradient_only": "inf" if math.isinf(gradient_only) else gradient_only,
        "epsilon_paper_gradient_only": "inf" if math.isinf(worst) else worst,
        "epsilon_note": "epsilon_spent (the silos' ledgers) composes both releases and is the run's guarantee; "
        "epsilon_gradient_only is the same accountant on the gradient release alone, epsilon_paper_gradient_only "
        "the paper's accounting of it (RDP, integer orders 2..64): both leave the loss release out",
        "caveat": CAVEAT,
    }


SPEC = register(
    Algorithm(
        name="fedfdp",
        summary="FedFDP (Ling et al. 2024): equal loss across silos with fair clipping, record-level DP in each silo",
        options=(
            PrivacyOptions,
            TabularModelOptions,
            DeviceOptions,
            SgdOptions,
            ClipOptions,
            LossFairnessOptions,
            GroupReportOptions,
        ),
        defaults=DEFAULTS,
        aliases=("fed-fdp", "ling2024"),
        noised_for=("silo",),
        protects=RECORD_PROTECTED,
        strategy="silofl.strategies.fedfdp:build",
        silo={"train": "silofl.client.rounds.fedfdp:train_round"},
        plots=("fairness", "privacy"),
        privacy_report="silofl.protocols.algorithms.fedfdp:privacy_report",
        mechanism="each silo, each round: on a Poisson sample q = m/n_j, fair clipping c_j = min(max(0, 1 + lambda "
        "(f_j - F_t)), C/||g_j||), Gaussian noise sigma*C on the sum, one local step sent as w_i; on an independent "
        "Poisson sample of the same rate, the losses of w_i clipped to [0, C_l] summed with Gaussian noise "
        "sigma_l*C_l, sigma_l = 2.5 sigma, C_l the silo's last release (floored at 1e-3, first 2.5) or the fixed "
        "loss-bound. Both releases "
        "composed per round (add/remove neighbours, dp-accounting), sigma calibrated for (epsilon, delta, q, T). "
        + CAVEAT,
    )
)
