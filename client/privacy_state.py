"""A silo's privacy state: its ledger, what it admitted and answered, and the job it is bound to, kept in its
persistent state and (with a `state-dir`) on disk.

The silo, not the server, decides its noise (ISRL-DP: every message must be private whatever the server does).
`client.round_privacy` calibrates the noise for the run's mechanism on the silo's first private answer and binds it;
this module binds the job to its instruction (:func:`bind_instruction`: a later message that changes any field but
the per-round ones is refused), keeps the calibration it is given (:class:`NoisePlan`) and the ledger, and charges
the ledger before each answer (:func:`charge`), which refuses (and charges nothing) once the answer would exceed the
budget. The budget is the smaller of the run's epsilon and the silo's own cap (`epsilon-budget` in its node config),
so a silo operator can bound what any server may ask of it.

Shuffled epochs (`protocols.shuffled_epochs`; a plan with `batches_per_epoch` > 0) are calibrated for E_j unsampled
steps, one per epoch, and charged per epoch (:func:`charge`): the first round of an epoch the silo answers charges the
epoch's one release (q = 1) before anything of it is computed; the epoch's other rounds charge nothing new, but are
admitted only in increasing order, once each (the last admitted round is kept in the state, like the ledger), and
refused when the ledger is over budget. The pending mark and the journal work for them as for charged rounds.

Both live in `context.state`, a RecordDict that Flower keeps between the messages of a run. Flower forgets it when the
silo's SuperNode restarts, and a server that restarts from its checkpoint starts a new Flower run (a fresh
`context.state`). A silo whose node config names a `state-dir` therefore also keeps, per job, everything its state
holds (ledger, calibration, DP-mu2-FL's momentum and record order, FedSC's share count) in a file there
(:func:`open_job`, :func:`persist`; encoded by `protocols.record_codec`, written by `protocols.atomic_files`):

* when it charges its ledger, BEFORE it computes or releases the answer (the charge is marked pending);
* when it has computed the answer, BEFORE it releases it: the answer itself is kept (the journal,
  `client.answer_journal`, one answer per message kind) and the pending mark cleared.

So after any crash the silo knows what it spent. A round asked again is answered once: if its answer was journaled it
is replayed byte for byte (a second copy of one release costs no privacy), if the round was charged but its answer
never left the silo it is computed now without a second charge, and a different request for an answered round is
refused (a second answer would be a second release). A silo without `state-dir` keeps nothing on disk; it refuses to
join a private job after its first round (its ledger would start from zero and forget what it spent).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Context

from silofl.protocols.atomic_files import atomic_write
from silofl.protocols.messages import PER_ROUND_FIELDS, MessageError, RecordCache, TrainInstruction, flower_record
from silofl.protocols.record_codec import decode_record, encode_record

if TYPE_CHECKING:  # the accountants (dp-accounting) are imported when a silo first calibrates or charges: a deployed
    # ClientApp is a fresh process per message, and setup, evaluate and non-private rounds need neither
    from silofl.protocols.privacy.ledger import PrivacyLedger

STATE_KEY = "silofl.privacy"
LEDGER_KEY = "silofl.ledger"
SPENT_KEY = "silofl.spent"
STATE_DIR_KEY = "state-dir"
#: The data spec of the run (set by `query.setup`): kept per Flower run, not per job.
DATA_SPEC_KEY = "silofl.data-spec"
#: Which job this context serves and where its file is (never written to the file itself).
JOB_KEY = "silofl.job"
#: A charged answer that has not been released yet (the silo went down in between, or the round failed after it).
PENDING_KEY = "silofl.pending"
#: Shuffled epochs: the last round this silo admitted (charged, or covered by its epoch's charge).
ADMITTED_KEY = "silofl.admitted"
#: The job's instruction as its first message gave it, every field but the per-round ones (:func:`bind_instruction`).
INSTRUCTION_KEY = "silofl.instruction"
#: A sensitive party's records of the run, sealed to it by the feature parties (`client.party_exchange`): other
#: organisations' features and labels, kept in memory for the run only, never written to the job file.
SEALED_RECORDS_KEY = "silofl.sealed-records"
STATE_FORMAT = 1
_TRANSIENT = frozenset({DATA_SPEC_KEY, JOB_KEY, SEALED_RECORDS_KEY})


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
    #: noise multiplier of a second release per round on its own, independent Poisson sample (inf: none; FedFDP's
    #: loss release): `companion_ratio` x noise_multiplier
    companion: float = math.inf
    #: shuffled epochs: B_j, the rounds of one epoch, each epoch one unsampled step of the plan (0: Poisson sampling,
    #: one step per round)
    batches_per_epoch: int = 0


def clear_caches() -> None:
    """Forget the noise calibrations and the privacy accounting this process cached (`protocols.privacy.mechanism`,
    :func:`protocols.privacy.ledger.clear_caches`), and the ledgers kept between messages: a benchmark calls this
    before each run it times, so that every run pays what a run in a fresh process pays. Nothing a silo computes
    changes: every cached value is computed again the same way."""
    from silofl.protocols.privacy import ledger, mechanism

    mechanism.clear_caches()
    _SAVED_LEDGERS.clear()
    _RECORD_VALUES.clear()
    ledger.clear_caches()


#: The values of the state records this process read (`record_values`).
_RECORD_VALUES: RecordCache[dict] = RecordCache()


def record_values(record: ConfigRecord) -> dict:
    """A state record's values as a plain dict, read once per record and values (a Flower record's items cost
    ~0.5 us each to read, and a silo compares its bound instruction and mechanism with every message)."""
    values = _RECORD_VALUES.get(record)
    if values is None:
        values = dict(record)
        _RECORD_VALUES.put(record, values)
    return values


#: The ledger each state record holds, as this process saved it. Reading a ledger back from its record re-validates
#: every entry (~25-70 us per message); while a context's state still holds the very record saved, with the very
#: values, the saved ledger is what `from_dict` would rebuild, and a copy of it is used instead.
_SAVED_LEDGERS: RecordCache[PrivacyLedger] = RecordCache()


def load_ledger(context: Context, plan: NoisePlan) -> PrivacyLedger:
    """The silo's ledger for this run (a fresh one on its first private answer)."""
    from silofl.protocols.privacy.ledger import PrivacyLedger

    if LEDGER_KEY in context.state:
        record = context.state[LEDGER_KEY]
        saved = _SAVED_LEDGERS.get(record)
        if saved is not None:
            return saved.copy()
        return PrivacyLedger.from_dict(dict(record))
    return PrivacyLedger(
        epsilon_budget=plan.epsilon, delta=plan.delta, accountant=plan.accountant, relation=plan.relation
    )


def save_ledger(context: Context, ledger: PrivacyLedger, spent: float) -> None:
    """Persist the ledger, and the epsilon it reported for its last charge (read back by :func:`spent`); with a
    `state-dir`, also on disk before this returns (so before the answer it pays for is computed)."""
    if LEDGER_KEY in context.state:
        _SAVED_LEDGERS.discard(context.state[LEDGER_KEY])
    record = flower_record(ConfigRecord, ledger.to_dict())
    _SAVED_LEDGERS.put(record, ledger.copy())
    context.state[LEDGER_KEY] = record
    context.state[SPENT_KEY] = flower_record(ConfigRecord, {"epsilon": spent})
    persist(context)


def charge(context: Context, plan: NoisePlan, *, server_round: int, silo: str) -> float:
    """Charge one answer to the silo's ledger (raises BudgetExceededError, charging nothing, past the budget).

    Returns the epsilon spent after it: an upper bound during the run (see `PrivacyLedger.charge`), exact on the
    run's last round. A round charged before but never released (the silo went down before answering) is not
    charged again: this answer is the one it paid for. A plan of shuffled epochs charges per epoch
    (:func:`_charge_epoch`).
    """
    if plan.batches_per_epoch > 0:
        return _charge_epoch(context, plan, server_round=server_round, silo=silo)
    ledger = load_ledger(context, plan)
    if _pending_round(context) == server_round and ledger.last_round == server_round:
        return spent(context)
    spent_now = _charged(context, plan, ledger, server_round=server_round, silo=silo, last=server_round >= plan.steps)
    context.state[PENDING_KEY] = flower_record(ConfigRecord, {"round": server_round})
    save_ledger(context, ledger, spent_now)
    return spent_now


def _charged(
    context: Context, plan: NoisePlan, ledger: PrivacyLedger, *, server_round: int, silo: str, last: bool
) -> float:
    """Charge one step of `plan` to `ledger` at `server_round` (the caller saves it); the epsilon spent after it.

    The figure is `PrivacyLedger.charge`'s cheap upper bound, except for the plan's `last` step, which reports the
    exact one. A refused or misordered charge raises (BudgetExceededError, ValueError) and charges nothing."""
    try:
        spent_now = ledger.charge(
            round=server_round,
            noise_multiplier=plan.noise_multiplier,
            sampling_rate=plan.sampling_rate,
            releases=plan.releases,
            silo=silo,
            companion=plan.companion,
        )
    except ValueError as exc:
        raise ValueError(f"{exc}{_already_hint(context, exc)}") from None
    return ledger.spent() if last else spent_now


def _charge_epoch(context: Context, plan: NoisePlan, *, server_round: int, silo: str) -> float:
    """Admit round `server_round` of a run of shuffled epochs, charging its epoch if it is the epoch's first answer.

    The epoch's one unsampled release (q = 1, `plan.releases` releases at `plan.noise_multiplier`) is charged to the
    ledger at the first round of the epoch this silo answers, before anything of that round is computed: the record
    whose attribute a round reveals may sit in the epoch's first batch, so the whole epoch is paid for up front
    (`protocols.shuffled_epochs` has the argument). A later round of an epoch that is paid for charges nothing new;
    it is refused if the ledger is over its budget, and any round at or before the last admitted one is refused (each
    batch answered once: a second answer would put the batch's records in the epoch twice). Like :func:`charge`, a
    round admitted but never released (pending) is answered without a second admission. Returns the epsilon spent:
    the ledger's figure after the charge (exact from the run's last epoch on), else the figure it last reported.
    """
    from silofl.protocols.privacy.ledger import BUDGET_RELATIVE_TOLERANCE, BudgetExceededError
    from silofl.protocols.shuffled_epochs import epoch_of

    ledger = load_ledger(context, plan)
    admitted = max(_admitted_round(context), ledger.last_round or 0)
    if _pending_round(context) == server_round and admitted == server_round:
        return spent(context)
    if server_round <= admitted:
        seen = "was already answered" if server_round == admitted else "comes before the last answered round"
        exc = ValueError(f"round {server_round} {seen} ({admitted}); a silo answers each round of its epochs once")
        raise ValueError(f"{exc}{_already_hint(context, exc)}") from None
    epoch = epoch_of(server_round, plan.batches_per_epoch)
    if epoch > epoch_of(ledger.last_round or 0, plan.batches_per_epoch):  # the epoch is not paid for yet
        spent_now = _charged(context, plan, ledger, server_round=server_round, silo=silo, last=epoch >= plan.steps)
        _admit(context, server_round)
        save_ledger(context, ledger, spent_now)
        return spent_now
    spent_now = spent(context)
    if spent_now > ledger.epsilon_budget * (1.0 + BUDGET_RELATIVE_TOLERANCE):
        raise BudgetExceededError(
            silo=silo,
            round=server_round,
            budget=ledger.epsilon_budget,
            spent=spent_now,
            cost=spent_now,
            accountant=ledger.accountant,
            delta=ledger.delta,
        )
    _admit(context, server_round)
    persist(context)
    return spent_now


def _admitted_round(context: Context) -> int:
    return int(context.state[ADMITTED_KEY]["round"]) if ADMITTED_KEY in context.state else 0


def _admit(context: Context, server_round: int) -> None:
    """Mark `server_round` admitted and pending (its answer not released yet); the caller persists the state."""
    context.state[ADMITTED_KEY] = flower_record(ConfigRecord, {"round": server_round})
    context.state[PENDING_KEY] = flower_record(ConfigRecord, {"round": server_round})


def charge_one_off(context: Context, plan: NoisePlan, *, silo: str) -> float:
    """Charge the one-off unsampled release (round 0, before any training round); returns the epsilon spent."""
    ledger = load_ledger(context, plan)
    if _pending_round(context) == 0 and ledger.last_round == 0:
        return spent(context)
    try:
        spent_now = ledger.charge(round=0, noise_multiplier=plan.one_off, sampling_rate=1.0, releases=1, silo=silo)
    except ValueError as exc:
        raise ValueError(f"{exc}{_already_hint(context, exc)}") from None
    context.state[PENDING_KEY] = flower_record(ConfigRecord, {"round": 0})
    save_ledger(context, ledger, spent_now)
    return spent_now


def spent(context: Context) -> float:
    """Epsilon spent so far by this silo in this run, as its ledger reported it at the last charge (0 before any
    private answer). Stored, not recomputed: a PLD evaluation per round would dominate a round that charges nothing."""
    if SPENT_KEY not in context.state:
        return 0.0
    return float(context.state[SPENT_KEY]["epsilon"])


def _pending_round(context: Context) -> int | None:
    return int(context.state[PENDING_KEY]["round"]) if PENDING_KEY in context.state else None


def _already_hint(context: Context, exc: ValueError) -> str:
    """What to do about a round the ledger refuses as already charged (or out of order); '' for other errors."""
    if not any(
        phrase in str(exc)
        for phrase in ("already charged", "before the last charged round", "already answered", "last answered round")
    ):
        return ""
    where = f" (its ledger is in {context.state[JOB_KEY]['path']})" if persistent(context) else ""
    return (
        f"{where}. This silo answers each round of a job once: a resumed server continues after its checkpoint, "
        "and a new job with the same parameters needs another seed"
    )


# -- persistence across restarts (node config `state-dir`) ----------------------------------------------------------


def state_dir(context: Context) -> Path | None:
    """The silo's state folder from its node config (`state-dir`), or None: nothing is kept on disk."""
    value = context.node_config.get(STATE_DIR_KEY)
    if value is None or str(value) == "":
        return None
    return Path(str(value)).expanduser()


def persistent(context: Context) -> bool:
    """Whether this context's job is kept on disk (a `state-dir` and a job bound by :func:`open_job`)."""
    return JOB_KEY in context.state and bool(context.state[JOB_KEY]["path"])


def job_fingerprint(instr: TrainInstruction) -> str:
    """What identifies a job to a silo across Flower runs: every instruction field but the per-round ones.

    A resumed run sends the same instruction (its run config is checked against the checkpoint's), so it finds the
    silo's file; a different job (another seed, epsilon, number of rounds, ...) gets a file of its own. Two jobs with
    identical instructions are one job to the silo: the second one's rounds are refused as already answered (give
    it another seed).
    """
    fields = instr.model_dump(by_alias=True, exclude=set(PER_ROUND_FIELDS))
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def private_job(instr: TrainInstruction) -> bool:
    """Whether `instr` is a private job: a finite epsilon, or a zCDP budget (rho > 0)."""
    return math.isfinite(instr.epsilon) or float(getattr(instr, "rho", 0.0)) > 0


def open_job(context: Context, *, silo_id: int, instr: TrainInstruction, what: str, role: str = "silo") -> None:
    """Bind this context to the job of `instr` on its first message, loading the silo's saved state for the job.

    The state file is named by the node's role and id (``silo0-job-...``, ``sensitive0-job-...``), so that a
    feature and a sensitive party given one state-dir by mistake do not read each other's ledgers. (The run's data
    spec, ``run-<id>.json``, is the same for every node of a run.)

    A context serves one job: later messages with other parameters are refused (:func:`bind_instruction`;
    `client.round_privacy`). A silo with no state for a private job refuses to start it after round 1: its ledger
    would start from zero and forget the rounds it answered before it was restarted (without `state-dir`) or before
    the server resumed the run.
    """
    if JOB_KEY in context.state:
        bind_instruction(context, instr, what=what)
        return
    fingerprint = job_fingerprint(instr)
    directory = state_dir(context)
    path = directory / f"{role}{silo_id}-job-{fingerprint}.json" if directory is not None else None
    if path is not None and path.is_file():
        _load_job(context, path, silo_id, fingerprint)
    elif private_job(instr) and instr.server_round > 1:
        where = (
            f"no state for this job in its state-dir {directory}"
            if directory is not None
            else "no state-dir in its node config, so nothing survived"
        )
        raise MessageError(
            f"{what}: silo {silo_id} has no record of rounds 1..{instr.server_round - 1} of this private job "
            f"({where}): it was restarted, or the server resumed the run on silos that kept no state. Answering "
            "would start its privacy ledger from zero and forget what it spent; it refuses. Give every silo a "
            f"state-dir (node config '{STATE_DIR_KEY}') so that its ledger survives restarts"
        )
    context.state[JOB_KEY] = ConfigRecord(
        {"fingerprint": fingerprint, "silo": silo_id, "role": role, "path": "" if path is None else str(path)}
    )
    bind_instruction(context, instr, what=what)


def job_record(context: Context) -> dict[str, str | int]:
    """The job this context serves: its key (``<role><id>-job-<fingerprint>``, the name of its file in the state
    folder), the node's role and id (after :func:`open_job`)."""
    job = context.state[JOB_KEY]
    role, node, fingerprint = str(job["role"]), int(job["silo"]), str(job["fingerprint"])
    return {"key": f"{role}{node}-job-{fingerprint}", "role": role, "node": node}


def bind_instruction(context: Context, instr: TrainInstruction, *, what: str) -> None:
    """Bind the job to its instruction: every field but the per-round ones (`protocols.messages.PER_ROUND_FIELDS`)
    must be the same in every message of the job, or the message is refused, naming the field, before anything is
    charged or computed.

    The silo's noise and accounting depend on these fields (the batch size, the clip norm, DP-mu2-FL's domain
    diameter and trust, the sampling, the relation, the number of rounds, ...). A server that changed one mid-run
    could otherwise make the silo release with less noise than the data it already released needs (e.g. a domain
    diameter of 1e4 in one round and 0.1 in the others), or put a record in two batches of one shuffled epoch.
    """
    fields = {name: value for name, value in instr.__dict__.items() if name not in PER_ROUND_FIELDS}
    if INSTRUCTION_KEY not in context.state:
        context.state[INSTRUCTION_KEY] = ConfigRecord(fields)
        return
    bound = record_values(context.state[INSTRUCTION_KEY])
    if bound == fields:
        return
    for name in sorted(set(bound) | set(fields)):
        before, now = bound.get(name), fields.get(name)
        if before != now:
            raise MessageError(
                f"{what}: the server changed '{name.replace('_', '-')}' from {before!r} to {now!r} in round "
                f"{instr.server_round}; this silo's noise and privacy accounting were fixed for the job's first "
                "value, so it refuses the message (a new job needs a new run)"
            )


def persist(context: Context) -> None:
    """Write the job's state (every record but the transient ones) to its file, atomically; no-op without one."""
    if not persistent(context):
        return
    job = context.state[JOB_KEY]
    records = {name: encode_record(rec) for name, rec in context.state.items() if name not in _TRANSIENT}
    document = {
        "format": STATE_FORMAT,
        "silo": int(job["silo"]),
        "fingerprint": str(job["fingerprint"]),
        "written_at": time.time(),
        "records": records,
    }
    atomic_write(Path(str(job["path"])), json.dumps(document).encode())


def _load_job(context: Context, path: Path, silo_id: int, fingerprint: str) -> None:
    try:
        document = json.loads(path.read_text())
        if document.get("format") != STATE_FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {STATE_FORMAT}")
        if document.get("silo") != silo_id or document.get("fingerprint") != fingerprint:
            raise ValueError(f"it belongs to silo {document.get('silo')}, job {document.get('fingerprint')}")
        records = {name: decode_record(rec) for name, rec in document["records"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MessageError(
            f"silo {silo_id}: its saved state {path} is unreadable ({exc}); it refuses to answer, since it cannot "
            "tell what it has spent. Restore the file, or delete it deliberately (that forgets the budget it spent)"
        ) from None
    for name, record in records.items():
        context.state[name] = record


def save_run_spec(context: Context, record: ConfigRecord) -> None:
    """Keep the run's data spec (from `query.setup`) on disk, so that a silo restarted mid-run can continue it."""
    directory = state_dir(context)
    if directory is None:
        return
    document = {"format": STATE_FORMAT, "run_id": context.run_id, "record": encode_record(record)}
    atomic_write(directory / f"run-{context.run_id}.json", json.dumps(document).encode())


def load_run_spec(context: Context) -> ConfigRecord | None:
    """The run's data spec saved by :func:`save_run_spec`, or None."""
    directory = state_dir(context)
    path = directory / f"run-{context.run_id}.json" if directory is not None else None
    if path is None or not path.is_file():
        return None
    try:
        record = decode_record(json.loads(path.read_text())["record"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MessageError(f"the silo's saved run spec {path} is unreadable ({exc})") from None
    return record if isinstance(record, ConfigRecord) else None
