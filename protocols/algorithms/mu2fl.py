"""DP-mu2-FL (private federated convex optimization with anytime averaging and corrected momentum), for an untrusted
server (noise in each silo) or a trusted one (one draw at the server). One pass over each silo's records. Server:
`strategies.mu2fl` (`Mu2flStrategy`; `protocols.mu2fl` has the math); silo: `client.rounds.mu2fl`."""

from __future__ import annotations

import math
from typing import Any

from silofl.protocols.algorithms import register
from silofl.protocols.algorithms.base import RECORD_PROTECTED, Algorithm, single_pass_rounds
from silofl.protocols.options import PrivacyOptions, SinglePassOptions

#: The paper's Tables 1 and 2 (docs/RESULTS.md, benchmarks/sweeps/mu2_mnist.toml): one pass with b = 1.
SINGLE_PASS_DEFAULTS = {"dataset": "digits", "epochs": 1.0, "batch-size": 1}


def check_rho(config: Any) -> None:
    if config.rho and math.isfinite(config.epsilon):
        raise ValueError(f"give either 'rho' or 'epsilon' for {config.algorithm}, not both")


def single_pass_report(config: Any, history: Any, rounds: int, delta: float, *, releases_per_record: int) -> dict:
    """The paper's rho, its closed-form epsilon, and for a trusted server the accountant's epsilon of the server's
    noise (the silos' messages are not private then; the released x_t are). `releases_per_record`: 0 = every round
    releases every record (DP-mu2-FL's momentum; T releases at noise multiplier sigma(rho, T)), 1 = one release per
    record at multiplier 1 / rho (single-pass noisy SGD)."""
    from silofl.protocols import mu2fl

    if not history.server_state:
        return {}
    rho = float(history.server_state["rho"])
    num = lambda v: "inf" if math.isinf(v) else v  # noqa: E731
    out: dict[str, Any] = {"rho": num(rho), "epsilon_closed_form": num(mu2fl.rho_to_epsilon(rho, delta))}
    if config.trust == "trusted":
        out["trust"] = "trusted server: silos send un-noised messages; the released x_t are DP by the server's noise"
        if math.isfinite(rho):
            if releases_per_record:
                multiplier, count = 1.0 / rho, releases_per_record
            else:
                multiplier, count = mu2fl.noise_multiplier(rho, rounds), rounds
            out["epsilon_spent"] = mu2fl.accountant_epsilon(multiplier, count, delta)
    return out


def privacy_report(config: Any, history: Any, rounds: int, delta: float) -> dict[str, Any]:
    return single_pass_report(config, history, rounds, delta, releases_per_record=0)


SPEC = register(
    Algorithm(
        name="mu2fl",
        summary="DP-mu2-FL: private convex FL with anytime averaging and corrected momentum (untrusted/trusted)",
        options=(PrivacyOptions, SinglePassOptions),
        defaults=SINGLE_PASS_DEFAULTS,
        aliases=("dp-mu2-fl", "mu2"),
        noised_for=("silo",),
        protects=RECORD_PROTECTED,
        strategy="silofl.strategies.mu2fl:build_mu2fl",
        silo={"train": "silofl.client.rounds.mu2fl:train_round"},
        rounds=single_pass_rounds,
        check=check_rho,
        plots=("mu2",),
        privacy_report="silofl.protocols.algorithms.mu2fl:privacy_report",
        mechanism="each round each silo releases q_t = t d_t (corrected momentum over all its records so far; one "
        "record moves it by at most 2S/b), with Gaussian noise 2S sqrt(T)/(rho b) added in the silo (untrusted) or "
        "once at the server on the mean (trusted, /M); T rounds compose to (alpha, alpha rho^2/2)-RDP (the paper's "
        "Theorems 5.1/6.1)",
    )
)
