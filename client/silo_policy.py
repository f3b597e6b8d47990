"""The operator's policy at the silo: read from the node config, enforced before anything is computed.

A node's policy (:class:`protocols.silo_policy.SiloPolicy`) is the TOML file its node config names (``policy``:
`silofl silo start --policy FILE`, or `silofl run ... --silo-policy FILE` in simulation), with the older node config
keys folded in: ``epsilon-budget`` is a `max-epsilon-per-job` (the smaller of the two wins), ``allow-trusted-server``
allows a trusted server. A node with neither has the permissive policy: it answers as silofl always did.

What the silo checks, and when (every check depends on the message and the policy only, never on the data):

* :func:`check_job`, on every private-capable message (train, groups, correlation, a party's answers) before the job
  is opened: the algorithm is one the policy answers in this node's role (with `protect = "record"`, only a job whose
  every release is noised over the node's whole records: SteFFLe asked for `protect` = sensitive is refused), and the
  job's delta is at most `max-delta` (default 1/n_j with a budget);
* :func:`job_budget`, at calibration: the job's epsilon, capped by `max-epsilon-per-job` (more noise, never a
  refusal);
* :func:`admit`, at calibration, before the job's first release: a mechanism the algorithm fixes itself (DP-mu2-FL's
  rho) must fit the job's cap, the job's whole planned run must fit the lifetime ledger (`client.lifetime_ledger`),
  and under `protect = "record"` it must add noise;
* :func:`allow_trusted`: DP-mu2-FL's trusted mode, which sends the momentum un-noised;
* :func:`evaluation_mode`: how evaluations are answered (noised, exact, refused);
* :func:`check_model`, on every message that builds the run's model (and in :func:`check_job`): a user's model
  (``--model MODULE:FACTORY``) is imported by a deployed node only if its policy lists the module in
  `model-modules`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Context

from silofl.protocols import messages as msg
from silofl.protocols.silo_policy import PERMISSIVE, PolicyError, SiloPolicy, load_policy

if TYPE_CHECKING:
    from silofl.client.lifetime_ledger import JobRecord

POLICY_KEY = "policy"
BUDGET_KEY = "epsilon-budget"
ALLOW_TRUSTED_KEY = "allow-trusted-server"

#: (path, mtime_ns, size, legacy keys) -> the node's policy: a file read once per change, not per message.
_POLICIES: dict[tuple, SiloPolicy] = {}


def _flag(value: object) -> bool:
    return str(value).strip().lower() in {"true", "1", "yes"}


def node_policy(context: Context) -> SiloPolicy:
    """The node's policy: its policy file (node config `policy`) with `epsilon-budget` and `allow-trusted-server`
    folded in; the permissive policy when it has none of them. MessageError naming the key if any is invalid."""
    config = context.node_config
    path = str(config.get(POLICY_KEY, "") or "")
    budget = config.get(BUDGET_KEY)
    trusted = config.get(ALLOW_TRUSTED_KEY)
    stamp: tuple = ()
    if path:
        try:
            stat = os.stat(Path(path).expanduser())
            stamp = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = ("missing",)
    key = (path, stamp, budget, trusted)
    cached = _POLICIES.get(key)
    if cached is not None:
        return cached
    try:
        policy = load_policy(path) if path else PERMISSIVE
    except PolicyError as exc:
        raise msg.MessageError(f"node config '{POLICY_KEY}': {exc}") from None
    updates: dict[str, object] = {}
    if budget is not None and str(budget) != "":
        try:
            cap = float(budget)
        except (TypeError, ValueError):
            raise msg.MessageError(f"node config '{BUDGET_KEY}' must be a number, got {budget!r}") from None
        if not cap > 0:
            raise msg.MessageError(f"node config '{BUDGET_KEY}' must be > 0, got {budget!r}")
        updates["max_epsilon_per_job"] = min(cap, policy.max_epsilon_per_job)
    if trusted is not None and _flag(trusted):
        updates["allow_trusted_server"] = True
    if updates:
        policy = policy.model_copy(update=updates)
    if len(_POLICIES) > 64:
        _POLICIES.clear()
    _POLICIES[key] = policy
    return policy


def has_policy(context: Context) -> bool:
    """Whether the operator set anything (a policy file, or one of the older keys)."""
    config = context.node_config
    return bool(config.get(POLICY_KEY)) or config.get(BUDGET_KEY) is not None or ALLOW_TRUSTED_KEY in config


def check_model(context: Context, kind: str, what: str) -> None:
    """Refuse to build a user's model (`kind` = ``module:factory``) whose module this node may not import: a
    deployed node (its own data folder) imports only the modules, or the packages' modules, its operator lists in
    the policy's `model-modules` (default: none). A built-in model, and any model at a simulated silo (the user's own
    process runs it), passes. Checked before the module is imported, so a refused module never runs here.

    Why an opt-in: the server names the model; without it, a server naming any module installed at the silo (the
    standard library's included) would make the silo import it and call one of its functions."""
    from silofl.client.silo_data import is_deployed
    from silofl.protocols.model_names import is_custom_model, model_module

    if not is_custom_model(kind) or not is_deployed(context):
        return
    policy = node_policy(context)
    module = model_module(kind)
    if not policy.allows_model_module(module):
        listed = f"lists model-modules = {list(policy.model_modules)}" if policy.model_modules else "lists none"
        raise msg.MessageError(
            f"{what}: the server asked for the user model {kind!r}, which would make this node import module "
            f"{module!r} and run its code; this node's policy {listed}. Its operator allows it by installing the "
            f'package here and adding model-modules = ["{module}"] to the policy file (`silofl silo start --policy`)'
        )


def check_job(context: Context, instr: msg.TrainInstruction, *, role: str, records: int, what: str) -> SiloPolicy:
    """Refuse a job the policy does not answer (the model's module, the algorithm, the delta), naming the key and the
    value asked; returns the policy. Called on every message of a job, before it is opened or anything is
    computed."""
    check_model(context, str(getattr(instr, "model", "")), what)
    policy = node_policy(context)
    if policy is PERMISSIVE:
        return policy
    from silofl.protocols import algorithms

    spec = algorithms.get(instr.algorithm)
    name = spec.name
    if math.isfinite(policy.lifetime_epsilon) and (not spec.private or role == "features"):
        raise msg.MessageError(
            f"{what}: {name} at a {role} releases un-noised values, which no lifetime budget can hold (their epsilon "
            "is unbounded); this node's policy sets lifetime-epsilon, so it refuses the job"
        )
    protect = str(getattr(instr, "protect", "sensitive"))
    if not policy.allows(name, role, protect):
        if policy.protect == "record" and not policy.covers_whole_records(name, role, protect):
            raise msg.MessageError(f"{what}: {_not_whole_records(name, role, protect, spec)}")
        listed = policy.allowed_algorithms(role)
        extra = sorted(set(policy.allowed_algorithms(role, "record")) - set(listed))
        also = f"; and {', '.join(extra)} with protect = record" if extra else ""
        why = (
            "its policy lists algorithms = " + str(list(policy.algorithms))
            if policy.algorithms is not None
            else "with a budget it answers only the algorithms whose releases are noised for everything a "
            f"{role} holds ({', '.join(listed) or 'none'}{also}); the operator can list others in 'algorithms'"
        )
        raise msg.MessageError(f"{what}: the server asked for {name!r}, which this {role}'s policy refuses: {why}")
    limit = policy.max_delta_for(records)
    if limit is not None and instr.delta > limit:
        source = "max-delta" if policy.max_delta is not None else "max-delta (default 1/n_j, n_j its training records)"
        raise msg.MessageError(
            f"{what}: the server asked for delta = {instr.delta:g}, above this {role}'s policy {source} = "
            f"{limit:g}; a larger delta lets a mechanism publish a record outright, so it refuses the job"
        )
    return policy


def _not_whole_records(name: str, role: str, protect: str, spec) -> str:
    """Why a `protect = "record"` policy refuses a job: what the job would release un-noised, and what to ask."""
    head = f"the server asked for {name!r}"
    if spec.noised_for_record and role in spec.noised_roles("record"):
        return (
            f"{head} with protect = {protect!r}, which releases part of each record un-noised (its loss gradient: the "
            f"features and labels); this {role}'s policy sets protect = 'record' (every release noised over the whole "
            "record), so it refuses the job: ask for protect = 'record' (silofl run ... --protect record)"
        )
    return (
        f"{head}, whose releases at a {role} are not all noised over the whole record; this {role}'s policy sets "
        "protect = 'record', so it refuses the job"
    )


def job_budget(context: Context, run_epsilon: float) -> float:
    """The epsilon the node calibrates a job for: the run's, capped by the policy's `max-epsilon-per-job`."""
    return min(run_epsilon, node_policy(context).job_epsilon_cap)


def allow_trusted(context: Context, *, deployed: bool) -> bool:
    """Whether the node sends DP-mu2-FL's momentum un-noised to a trusted server: its policy's (or node config's)
    `allow-trusted-server`; a simulated silo without any policy allows it (as silofl always did)."""
    policy = node_policy(context)
    if policy.allow_trusted_server:
        return True
    return not deployed and not has_policy(context)


def evaluation_mode(context: Context) -> str:
    """``noised``, ``exact`` or ``refuse``: how the node answers an evaluation (`SiloPolicy.evaluation_mode`)."""
    return node_policy(context).evaluation_mode()


def admit(
    context: Context,
    instr: msg.TrainInstruction,
    mechanism,
    calibrated,
    *,
    budget: float,
    who: str,
) -> None:
    """Before a job's first release: refuse a fixed mechanism over the job's cap, and reserve the job's whole run in
    the node's lifetime ledger (refused past `lifetime-epsilon`). A node without a lifetime budget and without a
    state folder keeps no lifetime ledger."""
    from silofl.client import lifetime_ledger, privacy_state
    from silofl.protocols.privacy.ledger import BUDGET_RELATIVE_TOLERANCE

    policy = node_policy(context)
    if policy.protect == "record" and not calibrated.multiplier > 0:
        raise msg.MessageError(
            f"{who}: the job asks for no noise (epsilon = inf), so its releases would leave un-noised; this node's "
            "policy sets protect = 'record' (every release noised over the whole record), so it refuses (ask for a "
            "finite epsilon, or the operator sets max-epsilon-per-job to have such jobs calibrated for it)"
        )
    cap = policy.job_epsilon_cap
    over_cap = not calibrated.epsilon <= cap * (1.0 + BUDGET_RELATIVE_TOLERANCE)
    if mechanism.fixed_multiplier is not None and math.isfinite(cap) and over_cap:
        raise msg.MessageError(
            f"{who}: the job's mechanism is fixed by the server's parameters (noise multiplier "
            f"{calibrated.multiplier:.4g}) and spends epsilon = {calibrated.epsilon:.4g} over its run, above this "
            f"node's policy max-epsilon-per-job = {cap:g}; it refuses the job (ask for a smaller rho or epsilon)"
        )
    directory = privacy_state.state_dir(context)
    if directory is None:
        if math.isfinite(policy.lifetime_epsilon):
            raise msg.MessageError(
                f"{who}: its policy sets lifetime-epsilon, but it has no state folder (node config "
                f"'{privacy_state.STATE_DIR_KEY}') to keep its lifetime ledger in; it refuses to answer"
            )
        return
    if math.isinf(budget) and math.isfinite(policy.lifetime_epsilon):
        raise msg.MessageError(
            f"{who}: the job asks for no noise (epsilon = inf), which no lifetime budget can hold; its policy sets "
            "lifetime-epsilon, so it refuses (ask for a finite epsilon, or the operator sets max-epsilon-per-job to "
            "have such jobs calibrated for it)"
        )
    events = mechanism.replace_one_events(calibrated.multiplier, tuple(calibrated.setup_multipliers))
    record = _lifetime_record(
        context, instr, epsilon=float(budget), delta=float(instr.delta), events=events, noised=True
    )
    lifetime_ledger.admit_job(directory, record, policy, who=who)


def _lifetime_record(
    context: Context, instr: msg.TrainInstruction, *, epsilon: float, delta: float, events: tuple, noised: bool
) -> JobRecord:
    """The node's open job as the lifetime ledger keeps it; a `noised` one covers all the node's data when every
    release of its algorithm is noised for the node's role (`Algorithm.noised_roles`: SteFFLe's and Tran's silos under
    `protect` = record)."""
    from silofl.client import lifetime_ledger, privacy_state
    from silofl.protocols import algorithms

    job = privacy_state.job_record(context)
    spec = algorithms.get(instr.algorithm)
    return lifetime_ledger.JobRecord(
        key=str(job["key"]),
        algorithm=spec.name,
        role=str(job["role"]),
        node=int(job["node"]),
        epsilon=epsilon,
        delta=delta,
        covers_all_data=noised and job["role"] in spec.noised_roles(instr),
        events=events,
    )


def record_unnoised(context: Context, instr: msg.TrainInstruction, what: str) -> None:
    """Keep a job that calibrated no noise (an algorithm without privacy, a feature party's step, a trusted-server
    DP-mu2-FL round) in the node's lifetime ledger as what it is, un-noised (epsilon unbounded), so that the ledger
    counts everything the node ever released. Once per job and process; nothing without a state folder. (A lifetime
    budget refuses such jobs before they are computed: `check_job`, and DP-mu2-FL's trusted check.)"""
    from silofl.client import lifetime_ledger, privacy_state

    directory = privacy_state.state_dir(context)
    job_record = context.state[privacy_state.JOB_KEY]
    if directory is None or privacy_state.STATE_KEY in context.state or "lifetime" in job_record:
        return
    delta = float(getattr(instr, "delta", 0.0) or 0.0)
    record = _lifetime_record(context, instr, epsilon=math.inf, delta=delta, events=((0.0, 1.0, 1),), noised=False)
    lifetime_ledger.admit_job(directory, record, node_policy(context), who=what)
    job_record["lifetime"] = 1
