"""The privacy of one silo's round, in one place: calibrate for the run's mechanism, bind it, charge, hand out the
round's generators, write the report.

Every private round function (`client.rounds.*`) describes its run's mechanism completely
(:class:`protocols.privacy.mechanism.Mechanism`: its Gaussian releases, their radii, the sampling, the setup release,
and every parameter the sensitivity depends on) and opens a :class:`RoundPrivacy` with it:

* on the silo's first private answer of the run, the noise multiplier is calibrated with the accountant for the silo's
  budget (the run's epsilon, capped by its operator's `epsilon-budget`) over that mechanism's whole run, and the
  mechanism is bound in the silo's state with the calibration;
* every later message builds its mechanism again from what it carries, and any difference in any field (the batch
  size of shuffled epochs, DP-mu2-FL's domain diameter, a clip norm, a radius, the relation, the number of steps, ...)
  is refused, naming the field, before anything is charged or computed: nothing the noise or the accounting depends
  on is taken from a later round's instruction. Parameters a message carries as arrays (SteFFLe's group prior, from
  which its W radius follows) are bound the same way at their first sight (:meth:`RoundPrivacy.bind`);
* :meth:`RoundPrivacy.charge` charges the ledger (`client.privacy_state`) BEFORE the caller computes anything: a
  refused answer releases nothing;
* :meth:`RoundPrivacy.generator` / :meth:`RoundPrivacy.rng` are the round's random streams (`client.randomness`);
* :meth:`RoundPrivacy.report` is the public report of the answer.

The instruction as a whole is bound per job as well (`client.privacy_state.open_job`); binding the mechanism here
also covers what the instruction does not carry (the prior's radii, the silo's own record count).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ConfigRecord, Context

from silofl.client import privacy_state, randomness, silo_policy
from silofl.protocols import messages as msg
from silofl.protocols.privacy.mechanism import Mechanism

if TYPE_CHECKING:
    from silofl.client.privacy_state import NoisePlan


def digest(array: np.ndarray) -> str:
    """A short digest of an array's dtype, shape and bytes (what :meth:`RoundPrivacy.bind` binds for an array)."""
    array = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(array.tobytes())
    return h.hexdigest()[:32]


class RoundPrivacy:
    """One private answer of one node (a silo, or a sensitive party): its bound, calibrated mechanism and its ledger.

    `who` names the node in errors and ledger entries ("silo 2", "sensitive party 0"); `node_id` is its id (its
    random streams' key). The privacy target is the instruction's (epsilon, delta, accountant), or `epsilon` when the
    algorithm derives it otherwise (DP-mu2-FL's from rho; FedSC's silo cap when the run asks for no noise).
    """

    def __init__(
        self,
        context: Context,
        instr: msg.TrainInstruction,
        mechanism: Mechanism,
        *,
        who: str,
        node_id: int,
        epsilon: float | None = None,
    ) -> None:
        self.context = context
        self.instr = instr
        self.mechanism = mechanism
        self.who = who
        self.node_id = node_id
        self.plan: NoisePlan = _bound_plan(
            context, mechanism, epsilon=instr.epsilon if epsilon is None else epsilon, instr=instr, who=who
        )

    # -- the calibrated mechanism --------------------------------------------------------------------------------------

    @property
    def noise_multiplier(self) -> float:
        """The calibrated per-release noise multiplier of the steps (0: no noise)."""
        return self.plan.noise_multiplier

    @property
    def setup_multiplier(self) -> float:
        """The noise multiplier of the setup release (0: none, or no noise)."""
        return self.plan.one_off

    def multiplier_of(self, release: str) -> float:
        """The noise multiplier of the named release: the calibrated one times its ratio (0: no noise)."""
        for r in self.mechanism.releases:
            if r.name == release:
                return self.plan.noise_multiplier * r.ratio if self.plan.noise_multiplier > 0 else 0.0
        raise KeyError(f"the mechanism has no release {release!r}")

    @property
    def private(self) -> bool:
        """Whether the silo's budget is finite (it adds noise and keeps a ledger)."""
        return math.isfinite(self.plan.epsilon)

    def bind(self, name: str, value: str | float | int) -> None:
        """Bind a parameter this message carries outside the instruction (e.g. the digest of SteFFLe's group prior,
        which sets its W radius): recorded at its first sight, refused when a later message carries another."""
        rec = self.context.state[privacy_state.STATE_KEY]
        key = f"bound.{name}"
        if key not in rec:
            rec[key] = value
            return
        if rec[key] != value:
            raise msg.MessageError(
                f"{self.who}: the server changed '{name}' mid-run ({rec[key]!r} -> {value!r}); the silo's noise and "
                "accounting were fixed for the first one, so it refuses (start a new run)"
            )

    # -- the ledger ----------------------------------------------------------------------------------------------------

    def charge(self) -> float:
        """Charge this round (or, for shuffled epochs, its epoch at the epoch's first round) to the ledger, BEFORE
        anything of it is computed; the epsilon spent after it (raises BudgetExceededError, charging nothing)."""
        return privacy_state.charge(self.context, self.plan, server_round=self.instr.server_round, silo=self.who)

    def charge_setup(self) -> float:
        """Charge the setup release (round 0, before any round) BEFORE it is computed; the epsilon spent after it."""
        return privacy_state.charge_one_off(self.context, self.plan, silo=self.who)

    def spent(self) -> float:
        """The epsilon spent so far: for an answer that releases nothing of the protected data (nothing charged)."""
        return privacy_state.spent(self.context)

    # -- randomness and report -----------------------------------------------------------------------------------------

    def _keys(self, stream: int, server_round: int | None) -> dict[str, int]:
        round_number = self.instr.server_round if server_round is None else server_round
        return {"seed": self.instr.seed, "silo_id": self.node_id, "server_round": round_number, "stream": stream}

    def generator(self, stream: int = randomness.NOISE, *, server_round: int | None = None) -> torch.Generator:
        """The round's torch generator of `stream` (the noise by default); `server_round` 0 for the setup release."""
        return randomness.torch_generator(self.context, **self._keys(stream, server_round))

    def rng(self, stream: int, *, server_round: int | None = None) -> np.random.Generator:
        """The round's numpy generator of `stream` (e.g. `randomness.SAMPLING`)."""
        return randomness.numpy_rng(self.context, **self._keys(stream, server_round))

    def report(self, *, num_examples: int, sampling_rate: float, spent: float) -> msg.TrainReport:
        """The public report of a train answer: n_j, the epsilon spent, the noise multiplier, the sampling rate."""
        return msg.TrainReport(
            silo_id=self.node_id,
            server_round=self.instr.server_round,
            num_examples=num_examples,
            epsilon_spent=spent,
            noise_multiplier=self.plan.noise_multiplier,
            sampling_rate=sampling_rate,
        )


def _bound_plan(
    context: Context, mechanism: Mechanism, *, epsilon: float, instr: msg.TrainInstruction, who: str
) -> NoisePlan:
    """Calibrate once per run for `mechanism` (cached in the silo's state) and refuse any later message whose
    mechanism or privacy target differs in any field."""
    wanted: dict[str, str | float | int] = {
        "epsilon": epsilon,
        "delta": instr.delta,
        "accountant": instr.accountant,
        **mechanism.binding(),
    }
    state = context.state
    if privacy_state.STATE_KEY in state:
        bound = privacy_state.record_values(state[privacy_state.STATE_KEY])
        if wanted.items() <= bound.items():  # the same mechanism and target (one C-level comparison)
            if ADMITTED_KEY not in bound:  # a job's state written before lifetime ledgers: admit it now
                _admit_bound(context, instr, mechanism, bound, who)
            return _plan(bound, mechanism)
        for key, value in wanted.items():
            before = bound.get(key)
            if before != value:
                name = key.removeprefix("parameter.")
                raise msg.MessageError(
                    f"{who}: the server changed '{name}' from {before!r} to {value!r} mid-run; this silo calibrated "
                    "its noise for the first value and refuses to re-calibrate (start a new run)"
                )
        return _plan(bound, mechanism)
    budget = silo_policy.job_budget(context, epsilon)
    calibrated = mechanism.calibrate(budget, instr.delta, instr.accountant)
    # the operator's policy, before the job's first release: a fixed mechanism within the job's cap, the whole run
    # within the lifetime budget (reserved in the lifetime ledger)
    silo_policy.admit(context, instr, mechanism, calibrated, budget=budget, who=who)
    rec = ConfigRecord(
        {
            **wanted,
            "budget": budget,
            "noise-multiplier": calibrated.multiplier,
            "epsilon-accountant": calibrated.epsilon,
            "one-off": calibrated.setup_multipliers[0] if calibrated.setup_multipliers else 0.0,
            ADMITTED_KEY: 1,
        }
    )
    state[privacy_state.STATE_KEY] = rec
    return _plan(dict(rec), mechanism)


#: In the bound calibration: the job was admitted into the node's lifetime ledger (`client.silo_policy.admit`).
ADMITTED_KEY = "lifetime-admitted"


def _admit_bound(context: Context, instr: msg.TrainInstruction, mechanism: Mechanism, bound: dict, who: str) -> None:
    """Admit a job whose calibration was bound before lifetime ledgers existed (its state file is older), with the
    calibration it holds, before its next release; then mark it admitted."""
    from silofl.protocols.privacy.mechanism import Calibrated

    setup = (float(bound["one-off"]),) if mechanism.setup else ()
    calibrated = Calibrated(float(bound["noise-multiplier"]), setup, float(bound["epsilon-accountant"]))
    silo_policy.admit(context, instr, mechanism, calibrated, budget=float(bound["budget"]), who=who)
    record = context.state[privacy_state.STATE_KEY]
    record[ADMITTED_KEY] = 1


def _plan(rec: dict, mechanism: Mechanism) -> NoisePlan:
    """The ledger's view of the bound mechanism: each step charged as `Mechanism.ledger_step` (the same event)."""
    return privacy_state.NoisePlan(
        **mechanism.ledger_step(float(rec["noise-multiplier"])),
        epsilon=float(rec["budget"]),
        delta=float(rec["delta"]),
        steps=mechanism.steps,
        accountant=str(rec["accountant"]),
        epsilon_accountant=float(rec["epsilon-accountant"]),
        relation=mechanism.relation,
        one_off=float(rec["one-off"]),
        batches_per_epoch=mechanism.rounds_per_step if mechanism.sampling == "epochs" else 0,
    )
