"""A silo's lifetime ledger: every job it ever answered, composed, in its state folder.

A job's own ledger (`client.privacy_state`) bounds that job. The lifetime ledger bounds the silo: one file per state
folder (``lifetime-ledger.json``; a folder is one silo, or one party, and the data it serves), holding each job the
silo admitted and each evaluation it answered noised, as dp-accounting events under *replacing one record*
(:meth:`protocols.privacy.mechanism.Mechanism.replace_one_events`). Its epsilon is the PLD composition of those events
(:func:`protocols.privacy.composition.composed_epsilon`; RDP has no analysis of ``replace_one``, so PLD is both the
sound and the tighter choice) at the policy's `lifetime-delta`.

* **Admission reserves the whole job.** On a job's first private answer, after its noise is calibrated and before
  anything of it is computed, the silo composes every job it admitted before with this job's *whole planned run* and
  refuses the job if that exceeds `lifetime-epsilon` (:func:`admit_job`). Every later release of the job is within
  that plan: the job's own ledger refuses any charge beyond it. So the silo never releases past its lifetime budget,
  whatever the order or concurrency of its jobs, and a job that stops early keeps its reservation (it may be resumed
  and finish: `silofl silo budget` shows what each job charged and what it reserved).
* **A resubmitted job is charged, never free.** A job is keyed by the node and the job's fingerprint (every
  instruction field but the per-round ones). The same job resumed finds its reservation; a job submitted again after a
  fault with another seed is another job, with its own reservation; the same job started again from round 1 finds its
  own job file and is refused round by round as already answered (`client.privacy_state`).
* **Evaluations compose in parallel with training.** A noised evaluation releases counts of the silo's held-out test
  split, records disjoint from the training records every job's events are about. Each record is in one of the two
  sets, so the silo's guarantee is the larger of the two compositions (parallel composition), each at
  `lifetime-delta`; each evaluation is charged here (:func:`charge_evaluation`) before it is computed, and refused past
  the budget. This holds for a test split fixed apart from the training records (a user's own files, or
  `silofl data split`'s seeded split).

The file is written atomically (temporary file, fsync, rename) under an exclusive lock (``fcntl.flock`` on a lock file
beside it), so concurrent answers of one silo, in one process or several, never lose an admission. Owner-only
permissions, like the job files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from silofl.protocols.messages import MessageError
from silofl.protocols.privacy.ledger import BUDGET_RELATIVE_TOLERANCE
from silofl.protocols.silo_policy import SiloPolicy

FILE_NAME = "lifetime-ledger.json"
LOCK_NAME = ".lifetime-ledger.lock"
FORMAT = 1
RELATION = "replace_one"

#: One ledger key: (multiplier or (multiplier, companion multiplier), sampling rate, steps).
Event = tuple[float | tuple[float, ...], float, int]


@dataclass
class JobRecord:
    """One admitted job: who answered it, what it asked, and its whole planned run as events."""

    key: str  # "<role><id>-job-<fingerprint>": the job file's name in the same folder, without ".json"
    algorithm: str
    role: str
    node: int
    epsilon: float  # the job's own budget (the run's epsilon, capped by the policy)
    delta: float
    covers_all_data: bool  # every release noised over everything the node holds (`Algorithm.noised_for`)
    events: tuple[Event, ...]
    admitted_at: float = 0.0

    def to_json(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "role": self.role,
            "node": self.node,
            "epsilon": _number(self.epsilon),
            "delta": self.delta,
            "covers_all_data": self.covers_all_data,
            "events": [_event_json(e) for e in self.events],
            "admitted_at": self.admitted_at,
        }

    @classmethod
    def from_json(cls, key: str, data: dict) -> JobRecord:
        return cls(
            key=key,
            algorithm=str(data["algorithm"]),
            role=str(data["role"]),
            node=int(data["node"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            covers_all_data=bool(data["covers_all_data"]),
            events=tuple(_event_from_json(e) for e in data["events"]),
            admitted_at=float(data.get("admitted_at", 0.0)),
        )


@dataclass
class LifetimeLedger:
    """The contents of one state folder's lifetime ledger."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    #: noise multiplier (under replace_one) -> evaluations answered at it
    evaluations: dict[float, int] = field(default_factory=dict)
    #: run id -> {"count", "first_round", "last_round"} of the evaluations answered (for the report)
    evaluation_runs: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the lifetime budget of the policy the silo last answered under: {"lifetime-epsilon", "lifetime-delta"}
    budget: dict[str, float | str] = field(default_factory=dict)
    #: a sensitive party's permanent randomized responses of its test records' groups, released by versions of
    #: silofl before the sealed record exchange (fingerprint of the secret, eps and k -> (noise parameter, groups)):
    #: no longer made, still composed into what the party released about its test split
    randomized_responses: dict[str, tuple[float, int]] = field(default_factory=dict)

    def evaluation_epsilon(self, delta: float, extra: tuple[Event, ...] = ()) -> float:
        """The PLD epsilon (replace-one) of everything released about the test split: the noised evaluations (and
        `extra` ones) and the randomized responses of earlier versions."""
        from silofl.protocols.privacy.composition import composed_epsilon_with_responses

        state = self.evaluation_state(extra)
        every = tuple(self.randomized_responses.values())
        if not state and not every:
            return 0.0
        return composed_epsilon_with_responses(state, every, delta, RELATION)

    def training_state(self, extra: tuple[Event, ...] = ()) -> tuple[Event, ...]:
        return tuple(e for job in self.jobs.values() for e in job.events) + extra

    def evaluation_state(self, extra: tuple[Event, ...] = ()) -> tuple[Event, ...]:
        """The evaluations (and `extra` ones, each a Gaussian at rate 1) as ONE Gaussian: k Gaussian releases of
        multipliers m_i compose exactly into one of multiplier (sum_i 1 / m_i^2)^(-1/2) (at rate 1 ``REPLACE`` is a
        Gaussian of sensitivity 2 R), so a silo's thousandth evaluation costs one PLD of one Gaussian, not a
        convolution of a thousand."""
        counts = dict(self.evaluations)
        for multiplier, q, steps in extra:
            if q != 1.0 or isinstance(multiplier, tuple):
                raise ValueError("an evaluation is one Gaussian release at rate 1")
            counts[multiplier] = counts.get(multiplier, 0) + steps
        if not counts:
            return ()
        if any(m == 0.0 for m in counts):
            return ((0.0, 1.0, 1),)
        combined = sum(count / m**2 for m, count in counts.items()) ** -0.5
        return ((combined, 1.0, 1),)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "relation": RELATION,
            "jobs": {key: job.to_json() for key, job in self.jobs.items()},
            "evaluations": [[m, count] for m, count in sorted(self.evaluations.items())],
            "evaluation_runs": self.evaluation_runs,
            "budget": self.budget,
            "randomized_responses": {key: [p, k] for key, (p, k) in self.randomized_responses.items()},
            "written_at": time.time(),
        }


def epsilon_of(state: tuple[Event, ...], delta: float) -> float:
    """The PLD epsilon of `state` under replace-one at `delta` (0 for nothing)."""
    from silofl.protocols.privacy.composition import composed_epsilon

    return composed_epsilon(state, delta, RELATION) if state else 0.0


# -- reading and writing ------------------------------------------------------------------------------------------


def path_of(directory: Path) -> Path:
    return directory / FILE_NAME


def load(directory: Path) -> LifetimeLedger:
    """The lifetime ledger of the state folder `directory` (empty if it has none yet); a damaged file is refused."""
    path = path_of(directory)
    if not path.is_file():
        return LifetimeLedger()
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("relation") != RELATION:
            raise ValueError(f"format {data.get('format')!r} / relation {data.get('relation')!r}, expected {FORMAT}")
        return LifetimeLedger(
            jobs={key: JobRecord.from_json(key, job) for key, job in data["jobs"].items()},
            evaluations={float(m): int(count) for m, count in data["evaluations"]},
            evaluation_runs={str(k): {kk: int(vv) for kk, vv in v.items()} for k, v in data["evaluation_runs"].items()},
            budget=dict(data.get("budget", {})),
            randomized_responses={
                str(key): (float(p), int(k)) for key, (p, k) in data.get("randomized_responses", {}).items()
            },
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MessageError(
            f"the silo's lifetime ledger {path} is unreadable ({exc}); it refuses to answer, since it cannot tell "
            "what it has spent over its lifetime. Restore the file (deleting it forgets every job it answered)"
        ) from None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _save(directory: Path, ledger: LifetimeLedger, policy: SiloPolicy) -> None:
    from silofl.protocols.atomic_files import atomic_write

    if math.isfinite(policy.lifetime_epsilon):
        ledger.budget = {"lifetime-epsilon": policy.lifetime_epsilon, "lifetime-delta": policy.lifetime_delta or 0.0}
    else:
        ledger.budget = {}
    atomic_write(path_of(directory), json.dumps(ledger.to_json(), indent=1).encode())


# -- admission and charges ----------------------------------------------------------------------------------------


def admit_job(directory: Path, job: JobRecord, policy: SiloPolicy, *, who: str) -> float:
    """Reserve `job`'s whole planned run in the lifetime ledger, or refuse it (MessageError naming
    `lifetime-epsilon`, what the job asked and what is left); returns the lifetime training epsilon with it.

    A job already admitted (a resumed run, another message of it in another process) is admitted again only with
    the same planned events: a job whose plan changed under the same key would be a second release of its data."""
    with _locked(directory):
        ledger = load(directory)
        known = ledger.jobs.get(job.key)
        if known is not None:
            if known.events != job.events:
                raise MessageError(
                    f"{who}: job {job.key} was admitted with another planned run ({list(known.events)}, now "
                    f"{list(job.events)}); the silo's data or the job changed under the same job, so it refuses"
                )
            return _training_epsilon(ledger, policy)
        total = math.nan
        if math.isfinite(policy.lifetime_epsilon):
            total = epsilon_of(ledger.training_state(job.events), policy.lifetime_delta or 0.0)
            if not total <= policy.lifetime_epsilon * (1.0 + BUDGET_RELATIVE_TOLERANCE):
                before = epsilon_of(ledger.training_state(), policy.lifetime_delta or 0.0)
                raise MessageError(
                    f"{who}: the silo's policy has lifetime-epsilon = {policy.lifetime_epsilon:g} (at lifetime-delta "
                    f"= {policy.lifetime_delta:g}); it has spent {before:.4g} over {len(ledger.jobs)} earlier job(s), "
                    f"and this {job.algorithm} job, asking epsilon = {job.epsilon:g} over its whole run, would bring "
                    f"the total to {total:.4g}. It refuses the job before releasing anything (`silofl silo budget "
                    "--state-dir DIR` lists what was spent; ask for a smaller epsilon, or the operator raises "
                    "lifetime-epsilon)"
                )
        job.admitted_at = time.time()
        ledger.jobs[job.key] = job
        _save(directory, ledger, policy)
        return total


def charge_evaluation(
    directory: Path, policy: SiloPolicy, *, multiplier: float, run_id: int, server_round: int, who: str
) -> float:
    """Charge one noised evaluation (a Gaussian of `multiplier` under replace-one, at rate 1) BEFORE it is computed;
    refuse it past `lifetime-epsilon` (MessageError). Returns the lifetime evaluation epsilon after it (nan without
    a lifetime budget: nothing to check, the charge is recorded)."""
    with _locked(directory):
        ledger = load(directory)
        after = math.nan
        if math.isfinite(policy.lifetime_epsilon):
            after = ledger.evaluation_epsilon(policy.lifetime_delta or 0.0, ((multiplier, 1.0, 1),))
            if not after <= policy.lifetime_epsilon * (1.0 + BUDGET_RELATIVE_TOLERANCE):
                count = sum(ledger.evaluations.values())
                raise MessageError(
                    f"{who}: the silo's policy has lifetime-epsilon = {policy.lifetime_epsilon:g}; its {count} noised "
                    f"evaluation(s) of its test split so far and this one would bring their total to {after:.4g}. It "
                    "refuses to evaluate (the operator can raise evaluation-noise or lifetime-epsilon)"
                )
        ledger.evaluations[multiplier] = ledger.evaluations.get(multiplier, 0) + 1
        run = ledger.evaluation_runs.setdefault(
            str(run_id), {"count": 0, "first_round": server_round, "last_round": server_round}
        )
        run["count"] += 1
        run["first_round"] = min(run["first_round"], server_round)
        run["last_round"] = max(run["last_round"], server_round)
        _save(directory, ledger, policy)
        return after


def _training_epsilon(ledger: LifetimeLedger, policy: SiloPolicy) -> float:
    if not math.isfinite(policy.lifetime_epsilon):
        return math.nan
    return epsilon_of(ledger.training_state(), policy.lifetime_delta or 0.0)


def _number(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def _event_json(event: Event) -> list:
    multiplier, q, steps = event
    return [list(multiplier) if isinstance(multiplier, tuple) else multiplier, q, steps]


def _event_from_json(data: list) -> Event:
    multiplier, q, steps = data
    m = tuple(float(v) for v in multiplier) if isinstance(multiplier, list) else float(multiplier)
    return (m, float(q), int(steps))
