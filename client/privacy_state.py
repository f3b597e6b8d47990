"""A silo's privacy: the noise it calibrated for itself and the ledger it keeps, both in its persistent state.

The silo, not the server, decides its noise (ISRL-DP: every message must be private whatever the server does). On its
first private answer it calibrates the noise multiplier with the accountant for the run's (epsilon, delta), its own
Poisson rate q_j = m / n_j and the announced number of rounds T, and binds that calibration to those parameters: a
later message that asks for other parameters is refused rather than silently re-calibrated. Before each answer it
charges its ledger, which refuses (and charges nothing) once the answer would exceed its budget. The budget is the
smaller of the run's epsilon and the silo's own cap (`epsilon-budget` in its node config), so a silo operator can bound
what any server may ask of it.

Both live in `context.state`, a RecordDict that Flower keeps between the messages of a run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context

from protocols.messages import MessageError
from protocols.privacy.accountant import calibrate_noise
from protocols.privacy.ledger import PrivacyLedger

STATE_KEY = "silofl.privacy"
LEDGER_KEY = "silofl.ledger"
BUDGET_KEY = "epsilon-budget"


@dataclass(frozen=True)
class NoisePlan:
    """The calibrated mechanism of one silo for one run."""

    noise_multiplier: float
    sampling_rate: float
    releases: int
    epsilon: float  # the silo's budget: the run's epsilon, capped by the operator's `epsilon-budget`
    delta: float
    steps: int
    accountant: str
    epsilon_accountant: float  # what the accountant gives back for noise_multiplier (<= epsilon)


def silo_budget(context: Context, run_epsilon: float) -> float:
    """The silo's epsilon budget: the run's target, capped by the operator's `epsilon-budget` node config."""
    cap = context.node_config.get(BUDGET_KEY)
    if cap is None:
        return run_epsilon
    try:
        cap_value = float(cap)
    except (TypeError, ValueError):
        raise MessageError(f"node config '{BUDGET_KEY}' must be a number, got {cap!r}") from None
    return min(run_epsilon, cap_value)


def noise_plan(
    context: Context, *, epsilon: float, delta: float, sampling_rate: float, steps: int, releases: int, accountant: str
) -> NoisePlan:
    """Calibrate once per run (cached in the silo's state) and refuse a change of the calibrated parameters.

    The noise is calibrated for the silo's budget (:func:`silo_budget`): a silo whose operator caps epsilon below the
    run's target adds more noise and still completes the announced rounds within its cap.
    """
    wanted = {
        "epsilon": epsilon,
        "delta": delta,
        "sampling-rate": sampling_rate,
        "steps": steps,
        "releases": releases,
        "accountant": accountant,
    }
    if STATE_KEY in context.state:
        rec = context.state[STATE_KEY]
        for key, value in wanted.items():
            if rec[key] != value:
                raise MessageError(
                    f"the server changed '{key}' from {rec[key]!r} to {value!r} mid-run; this silo calibrated its "
                    "noise for the first value and refuses to re-calibrate (start a new run)"
                )
        return _plan_from(rec)
    budget = silo_budget(context, epsilon)
    if math.isinf(budget):
        multiplier, eps_back = 0.0, math.inf
    else:
        cal = _calibrate(budget, delta, sampling_rate, steps, releases, accountant)
        multiplier, eps_back = cal.noise_multiplier, cal.epsilon
    rec = ConfigRecord({**wanted, "budget": budget, "noise-multiplier": multiplier, "epsilon-accountant": eps_back})
    context.state[STATE_KEY] = rec
    return _plan_from(rec)


@functools.lru_cache(maxsize=64)
def _calibrate(epsilon: float, delta: float, sampling_rate: float, steps: int, releases: int, accountant: str):
    """`calibrate_noise` is a pure function of its arguments (0.2-1 s); simulated silos of equal size share it."""
    return calibrate_noise(epsilon, delta, sampling_rate, steps, releases=releases, accountant=accountant)


def _plan_from(rec: ConfigRecord) -> NoisePlan:
    return NoisePlan(
        noise_multiplier=float(rec["noise-multiplier"]),
        sampling_rate=float(rec["sampling-rate"]),
        releases=int(rec["releases"]),
        epsilon=float(rec["budget"]),
        delta=float(rec["delta"]),
        steps=int(rec["steps"]),
        accountant=str(rec["accountant"]),
        epsilon_accountant=float(rec["epsilon-accountant"]),
    )


def load_ledger(context: Context, *, budget: float, delta: float, accountant: str) -> PrivacyLedger:
    """The silo's ledger for this run (a fresh one on its first private answer)."""
    if LEDGER_KEY in context.state:
        return PrivacyLedger.from_dict(dict(context.state[LEDGER_KEY]))
    return PrivacyLedger(epsilon_budget=budget, delta=delta, accountant=accountant)


def save_ledger(context: Context, ledger: PrivacyLedger) -> None:
    context.state[LEDGER_KEY] = ConfigRecord(ledger.to_dict())


def charge(context: Context, plan: NoisePlan, *, server_round: int, silo: str) -> float:
    """Charge one answer to the silo's ledger (raises BudgetExceededError, charging nothing, past the budget).

    Returns the epsilon spent after it: an upper bound during the run (see `PrivacyLedger.charge`), exact on the
    run's last round.
    """
    ledger = load_ledger(context, budget=plan.epsilon, delta=plan.delta, accountant=plan.accountant)
    spent = ledger.charge(
        round=server_round,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        releases=plan.releases,
        silo=silo,
    )
    save_ledger(context, ledger)
    if server_round >= plan.steps:
        spent = ledger.spent()  # the last answer reports the exact figure, not the cheap upper bound of `charge`
    return spent
