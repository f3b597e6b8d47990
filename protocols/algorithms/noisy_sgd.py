"""Single-pass noisy projected SGD with averaged iterates: DP-mu2-FL's baseline at the same rho (each record is used in
one round, so its silo charges one Gaussian release per record). Server: DP-mu2-FL's, `strategies.mu2fl`
(`Mu2flStrategy` with a projected SGD step, built by `build_noisy_sgd`); silo: `client.rounds.mu2fl`
(`train_round_noisy_sgd`)."""

from __future__ import annotations

from typing import Any

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import RECORD_PROTECTED, Algorithm, single_pass_rounds
from silofl.protocols.algorithms.mu2fl import SINGLE_PASS_DEFAULTS, check_rho, single_pass_report
from silofl.protocols.options import PrivacyOptions, SinglePassOptions


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    return single_pass_report(config, history, rounds, delta, releases_per_record=1)


SPEC = register(
    Algorithm(
        name="noisy-sgd",
        summary="single-pass noisy SGD with averaged iterates: DP-mu2-FL's baseline at the same rho",
        options=(PrivacyOptions, SinglePassOptions),
        defaults=SINGLE_PASS_DEFAULTS,
        aliases=("noisy_sgd",),
        noised_for=("silo",),
        protects=RECORD_PROTECTED,
        strategy="silofl.strategies.mu2fl:build_noisy_sgd",
        silo={"train": "silofl.client.rounds.mu2fl:train_round_noisy_sgd"},
        rounds=single_pass_rounds,
        check=check_rho,
        plots=("mu2",),
        privacy_report="silofl.protocols.algorithms.noisy_sgd:privacy_report",
        mechanism="single pass: each record is used in one round; each silo releases its mean gradient (sensitivity "
        "2G/b) with Gaussian noise 2G/(rho b) (untrusted; trusted: once at the server, /M): one release per record",
    )
)
