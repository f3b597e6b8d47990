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
from protocols.privacy.accountant import calibrate_noise, epsilon_spent
from protocols.privacy.ledger import PrivacyLedger

STATE_KEY = "silofl.privacy"
LEDGER_KEY = "silofl.ledger"
SPENT_KEY = "silofl.spent"
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
    relation: str = "add_remove"
    one_off: float = 0.0  # noise multiplier of a one-off unsampled release before the rounds (0: none)


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
    context: Context,
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int,
    accountant: str,
    relation: str = "add_remove",
    one_off_share: float = 0.0,
    noise_multiplier: float | None = None,
) -> NoisePlan:
    """Calibrate once per run (cached in the silo's state) and refuse a change of the calibrated parameters.

    The noise is calibrated for the silo's budget (:func:`silo_budget`): a silo whose operator caps epsilon below the
    run's target adds more noise and still completes the announced rounds within its cap.

    `relation` is the neighbouring relation ("add_remove" records, or "replace_one" for privacy of the sensitive
    attribute only); `one_off_share` > 0 reserves that share of the budget for one unsampled release made before the
    rounds (SteFFLe's group-count histogram): its noise multiplier is calibrated for share x budget alone, then the
    rounds' noise for the whole budget with that release in the same composition (not a sum of epsilons).

    `noise_multiplier` given: the algorithm fixes its noise itself (DP-mu2-FL's sigma = 2 S sqrt(T) / rho); nothing is
    calibrated, and the accountant's epsilon for it is recorded (the ledger still refuses past the budget).
    """
    wanted = {
        "epsilon": epsilon,
        "delta": delta,
        "sampling-rate": sampling_rate,
        "steps": steps,
        "releases": releases,
        "accountant": accountant,
        "relation": relation,
        "one-off-share": one_off_share,
        "fixed-multiplier": -1.0 if noise_multiplier is None else noise_multiplier,
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
    one_off = 0.0
    if noise_multiplier is not None:
        multiplier = noise_multiplier
        eps_back = (
            epsilon_spent(multiplier, sampling_rate, steps, delta, releases=releases, accountant=accountant)
            if multiplier > 0
            else math.inf
        )
    elif math.isinf(budget):
        multiplier, eps_back = 0.0, math.inf
    else:
        if one_off_share > 0:
            one_off = _calibrate(one_off_share * budget, delta, 1.0, 1, 1, accountant, relation, 0.0).noise_multiplier
        cal = _calibrate(budget, delta, sampling_rate, steps, releases, accountant, relation, one_off)
        multiplier, eps_back = cal.noise_multiplier, cal.epsilon
    rec = ConfigRecord(
        {**wanted, "budget": budget, "noise-multiplier": multiplier, "epsilon-accountant": eps_back, "one-off": one_off}
    )
    context.state[STATE_KEY] = rec
    return _plan_from(rec)


@functools.lru_cache(maxsize=64)
def _calibrate(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int,
    accountant: str,
    relation: str,
    one_off: float,
):
    """`calibrate_noise` is a pure function of its arguments (0.2-1 s); simulated silos of equal size share it."""
    prior = [(one_off, 1.0, 1)] if one_off > 0 else []
    return calibrate_noise(
        epsilon, delta, sampling_rate, steps, releases=releases, accountant=accountant, relation=relation, prior=prior
    )


def _plan_from(rec: ConfigRecord) -> NoisePlan:
    return NoisePlan(
        noise_multiplier=float(rec["noise-multiplier"]),
        sampling_rate=float(rec["sampling-rate"]),
        releases=int(rec["releases"]),
        epsilon=float(rec["budget"]),
        delta=float(rec["delta"]),
        steps=int(rec["steps"]),
        accountant=str(rec["accountant"]),
        relation=str(rec["relation"]),
        one_off=float(rec["one-off"]),
        epsilon_accountant=float(rec["epsilon-accountant"]),
    )


def load_ledger(context: Context, plan: NoisePlan) -> PrivacyLedger:
    """The silo's ledger for this run (a fresh one on its first private answer)."""
    if LEDGER_KEY in context.state:
        return PrivacyLedger.from_dict(dict(context.state[LEDGER_KEY]))
    return PrivacyLedger(
        epsilon_budget=plan.epsilon, delta=plan.delta, accountant=plan.accountant, relation=plan.relation
    )


def save_ledger(context: Context, ledger: PrivacyLedger, spent: float) -> None:
    """Persist the ledger, and the epsilon it reported for its last charge (read back by :func:`spent`)."""
    context.state[LEDGER_KEY] = ConfigRecord(ledger.to_dict())
    context.state[SPENT_KEY] = ConfigRecord({"epsilon": spent})


def charge(context: Context, plan: NoisePlan, *, server_round: int, silo: str) -> float:
    """Charge one answer to the silo's ledger (raises BudgetExceededError, charging nothing, past the budget).

    Returns the epsilon spent after it: an upper bound during the run (see `PrivacyLedger.charge`), exact on the
    run's last round.
    """
    ledger = load_ledger(context, plan)
    spent = ledger.charge(
        round=server_round,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        releases=plan.releases,
        silo=silo,
    )
    if server_round >= plan.steps:
        spent = ledger.spent()  # the last answer reports the exact figure, not the cheap upper bound of `charge`
    save_ledger(context, ledger, spent)
    return spent


def charge_one_off(context: Context, plan: NoisePlan, *, silo: str) -> float:
    """Charge the one-off unsampled release (round 0, before any training round); returns the epsilon spent."""
    ledger = load_ledger(context, plan)
    spent = ledger.charge(round=0, noise_multiplier=plan.one_off, sampling_rate=1.0, releases=1, silo=silo)
    save_ledger(context, ledger, spent)
    return spent


def spent(context: Context) -> float:
    """Epsilon spent so far by this silo in this run, as its ledger reported it at the last charge (0 before any
    private answer). Stored, not recomputed: a PLD evaluation per round would dominate a round that charges nothing."""
    if SPENT_KEY not in context.state:
        return 0.0
    return float(context.state[SPENT_KEY]["epsilon"])
