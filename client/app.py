"""The silo's Flower ClientApp: checks every message on receipt, routes it to the silo's algorithm, replies.

Message types (see :mod:`protocols.messages`): ``query.setup`` (describe the silo's data), ``query.groups``
(SteFFLe: the silo's (group, label) counts through a DP histogram), ``query.correlation`` (FedSC: the silo's
correlation matrix through DP-CalR), ``train`` (one round of the run's algorithm) and
``evaluate`` (confusion counts on the silo's local test split). Any message that
fails its checks raises :class:`~protocols.messages.MessageError` before it touches the silo's state; Flower returns
the error to the server, which stops the run naming the silo and the round.

Which function answers a message is the run's algorithm's choice: its registry entry (:mod:`protocols.algorithms`)
names the silo function of each message kind it uses; a kind it does not use is refused.

``groups``, ``correlation`` and ``train`` are answered once per round (:func:`_answer`): with a `state-dir` in its
node config a silo keeps its job's state and its last answers on disk, replays an answer the server asks for again
(a restarted server, a lost reply) and never pays for one answer twice (see :mod:`client.privacy_state`).

Keep this module's import path light: with Flower's runtime (`--runtime flower` or `per-message`) a deployed ClientApp
is a fresh process for every message (docs/DEPLOYMENT.md, "Cost of a round in deployment").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from silofl.client import answer_journal, privacy_state, silo_policy
from silofl.client.data.tabular import SiloData
from silofl.client.rounds import RoundFunction
from silofl.client.silo_data import describe, describe_party, load_party_data, load_silo_data, node_role
from silofl.protocols import messages as msg
from silofl.protocols import parties
from silofl.protocols.models import build_model, parameter_spec, set_parameters

DATA_SPEC_KEY = privacy_state.DATA_SPEC_KEY

app = ClientApp()


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Silo compute on one thread: the same result on every engine (BLAS reductions depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _spec(context: Context) -> msg.DataSpec:
    """The run's data spec (from the setup message, or from the state-dir of a silo restarted mid-run)."""
    if DATA_SPEC_KEY not in context.state:
        saved = privacy_state.load_run_spec(context)  # a silo restarted mid-run, with a state-dir
        if saved is None:
            raise msg.MessageError(
                "this silo holds no state for this run: the server must send 'query.setup' first, or the silo was "
                f"restarted mid-run without a state-dir (node config '{privacy_state.STATE_DIR_KEY}'), which would "
                "let it continue"
            )
        context.state[DATA_SPEC_KEY] = saved
    record = context.state[DATA_SPEC_KEY]
    spec = _DATA_SPECS.get(record)
    if spec is None:
        spec = msg.DataSpec.model_validate(dict(record))
        _DATA_SPECS.put(record, spec)
    return spec


#: The run's data spec as validated from the state record that holds it (validated once, not on every message).
_DATA_SPECS: msg.RecordCache[msg.DataSpec] = msg.RecordCache()


def _silo(context: Context, kind: str) -> tuple[SiloData, msg.DataSpec]:
    """This silo's data; a feature or sensitive party is refused (`kind`: the message it was sent)."""
    spec = _spec(context)
    role, _ = node_role(context, spec)
    if role != parties.SILO:
        raise _party_module().role_error(role, kind, f"this node (a {role} party)")
    return load_silo_data(context, spec), spec


def _role(context: Context) -> str:
    return node_role(context, _spec(context))[0]


def _party(context: Context, role: str):
    spec = _spec(context)
    return load_party_data(context, spec, role, node_role(context, spec)[1])


def _party_module():
    from silofl.client import parties as party_answers  # the generic party protocol (imported by party nodes only)

    return party_answers


def _answer(
    kind: str,
    message: Message,
    context: Context,
    silo_id: int,
    instr: msg.TrainInstruction,
    compute: Callable[[], RecordDict],
    what: str,
    role: str = parties.SILO,
    *,
    records: int,
) -> Message:
    """Answer a checked request once (see `client.privacy_state`): check the job against the node's policy
    (`client.silo_policy`; `records`: the node's training records), bind the node's job, replay a journaled answer
    to the same request, else compute it and journal it before it is released (`client.answer_journal`)."""
    silo_policy.check_job(context, instr, role=role, records=records, what=what)
    privacy_state.open_job(context, silo_id=silo_id, instr=instr, what=what, role=role)
    digest = answer_journal.request_digest(message.content) if privacy_state.persistent(context) else ""
    cached = answer_journal.replay(context, kind, instr, digest, what=what)
    if cached is not None:
        return Message(cached, reply_to=message)
    content = compute()
    silo_policy.record_unnoised(context, instr, what)  # before the release: a job that calibrated no noise
    answer_journal.answered(context, kind, instr.server_round, digest, content)
    return Message(content, reply_to=message)


@functools.lru_cache(maxsize=8)
def _model_shell(kind: str, num_features: int, num_labels: int, hidden: int, device: str = "cpu") -> torch.nn.Module:
    """A model of the right architecture on `device` (a resolved torch device: "cpu", "cuda"), reused across messages
    in one process (every message overwrites all of its parameters, so nothing carries over; building one costs
    ~1 ms, a large part of a small model's round). A user's model (`module:factory`) is imported and built here, once
    per process, after :func:`client.silo_policy.check_model` allowed it."""
    return build_model(kind, num_features, num_labels, hidden=hidden).to(device)


@functools.lru_cache(maxsize=8)
def _shell_spec(kind: str, num_features: int, num_labels: int, hidden: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The parameter names and shapes of :func:`_model_shell` (its architecture never changes)."""
    return tuple(parameter_spec(_model_shell(kind, num_features, num_labels, hidden)))


def _device_name(instr: msg.TrainInstruction | msg.EvaluateInstruction, what: str) -> str:
    """The run's `device` resolved on this node ("auto": cuda if torch sees a GPU here); an instruction without the
    option (mu2fl, noisy-sgd, an older server's) runs on the CPU. MessageError for cuda on a node without a GPU."""
    from silofl.protocols.devices import resolve_device

    name = getattr(instr, "device", "cpu")
    if name == "cpu":
        return "cpu"
    try:
        return str(resolve_device(name))
    except ValueError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None


def _model_from_arrays(
    message: Message,
    info,
    instr: msg.TrainInstruction | msg.EvaluateInstruction,
    what: str,
    context: Context,
) -> torch.nn.Module:
    """The instruction's model with the message's (checked) parameters, on the run's device. A user's model is built
    only if the node's operator allows its module (`client.silo_policy.check_model`: a deployed node's policy key
    `model-modules`), before anything of it is imported."""
    from silofl.protocols.models import ModelError

    kind, hidden = instr.model, getattr(instr, "hidden", 64)
    silo_policy.check_model(context, kind, what)
    device = _device_name(instr, what)
    key = (kind, info.num_features, info.num_labels, hidden)
    try:
        spec = _shell_spec(*key)
        model = _model_shell(*key, device)
    except ModelError as exc:
        raise msg.MessageError(f"{what}: {exc}") from None
    params = msg.check_arrays(message.content, msg.MODEL, spec, what=what, max_abs=msg.MAX_SERVER_VALUE)
    set_parameters(model, params)
    return model


@app.query("setup")
def setup(message: Message, context: Context) -> Message:
    """Load (or derive) the silo's data and describe it, with how its policy answers evaluations."""
    msg.check_records(message.content, {msg.CONFIG}, what="setup message")
    spec = msg.read_config(message.content, msg.DataSpec, what="setup message")
    role, party_id = node_role(context, spec)
    # a spec the node refuses leaves its current setup as it was
    evaluation = silo_policy.evaluation_mode(context)
    if role == parties.SILO:
        info = describe(load_silo_data(context, spec), evaluation)
    else:
        info = describe_party(load_party_data(context, spec, role, party_id), role, evaluation)
    context.state[DATA_SPEC_KEY] = spec.to_config_record()
    privacy_state.save_run_spec(context, context.state[DATA_SPEC_KEY])
    return Message(RecordDict({msg.REPORT: info.to_config_record()}), reply_to=message)


@app.query("groups")
def groups(message: Message, context: Context) -> Message:
    """SteFFLe's setup step: the silo's records by (sensitive group, label), through a DP histogram (at a sensitive
    party: of the requested ids it holds)."""
    if _role(context) == parties.SENSITIVE:
        return _sensitive_answer("groups", msg.GROUPS, message, context)
    silo, _ = _silo(context, msg.GROUPS)
    what = f"groups message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.CONFIG}, what=what)
    instr = msg.read_instruction(message.content, what=what)
    group_counts = _handler(instr, msg.GROUPS, what)

    def compute() -> RecordDict:
        counts, spent = group_counts(silo, instr, context)
        report = msg.GroupsReport(silo_id=silo.silo_id, epsilon_spent=spent)
        return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})

    return _answer("groups", message, context, silo.silo_id, instr, compute, what, records=len(silo.train))


@app.query("correlation")
def correlation(message: Message, context: Context) -> Message:
    """FedSC: the silo's correlation matrix under the current global model, through DP-CalR (noised here)."""
    silo, _ = _silo(context, msg.CORRELATION)
    what = f"correlation query to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG}, what=what)
    instr = msg.read_instruction(message.content, what=what)
    correlation_reply = _handler(instr, msg.CORRELATION, what)

    def compute() -> RecordDict:
        with _single_thread():
            matrix, report = correlation_reply(silo, instr, context, message)
        return RecordDict(
            {msg.CORRELATION_MATRIX: msg.arrays_record({"R": matrix}), msg.REPORT: report.to_metric_record()}
        )

    return _answer("correlation", message, context, silo.silo_id, instr, compute, what, records=len(silo.train))


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the run's algorithm on this silo (at a feature party: its step 1)."""
    if _role(context) == parties.FEATURES:
        return _feature_train(message, context)
    silo, _ = _silo(context, msg.TRAIN)
    what = f"train message to silo {silo.silo_id}"
    instr = msg.read_instruction(message.content, what=what)
    round_fn: RoundFunction = _handler(instr, msg.TRAIN, what)
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG, *round_fn.extra_records}, what=what)

    def compute() -> RecordDict:
        with _single_thread():
            model = None
            if round_fn.needs_model:
                model = _model_from_arrays(message, silo.info, instr, what, context)
            arrays, report = round_fn(model, silo, instr, context, message)
        return RecordDict(
            {**{name: msg.arrays_record(a) for name, a in arrays.items()}, msg.REPORT: report.to_metric_record()}
        )

    return _answer("train", message, context, silo.silo_id, instr, compute, what, records=len(silo.train))


def _handler(instr: msg.TrainInstruction, kind: str, what: str, role: str = parties.SILO) -> Callable:
    """The node's function for message kind `kind` of the instruction's algorithm (its registry entry names it per
    role; the module is imported on first use: keep the import path light)."""
    from silofl.protocols import algorithms

    spec = algorithms.get(instr.algorithm)
    handler = spec.silo_handler(kind, role)
    if handler is None:
        who = "" if role == parties.SILO else f" at a {role} party"
        raise msg.MessageError(f"{what}: {spec.name} does not use {kind!r} messages{who}")
    return handler


def _evaluation_mode(context: Context, what: str) -> str:
    """How the node answers evaluations (its policy): ``exact`` or ``noised``; MessageError under ``refuse``."""
    mode = silo_policy.evaluation_mode(context)
    if mode == "refuse":
        raise msg.MessageError(f'{what}: this node\'s policy answers no evaluations (evaluation = "refuse")')
    return mode


def _noised(context: Context, mode: str, node_id: int, who: str, **kwargs: float):
    """The node's :class:`client.noised_evaluation.NoisedRelease` under ``noised``, else None (exact)."""
    if mode != "noised":
        return None
    from silofl.client.noised_evaluation import NoisedRelease

    return NoisedRelease(context, silo_policy.node_policy(context), node_id=node_id, who=who, **kwargs)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Confusion counts by (sensitive group, label, prediction) and the summed loss on the local test split.

    The sensitive division is read here, to group the counts. How they are answered is the operator's policy
    (`client.silo_policy` `evaluation_mode`): ``exact`` (no policy, or a policy without a budget: the exact counts,
    listed under the run's `not_covered`), ``noised`` (a Gaussian histogram charged to the lifetime ledger before it
    is computed: `client.noised_evaluation`) or ``refuse``.
    """
    from silofl.protocols.fairness_metrics import confusion_counts
    from silofl.protocols.models import test_outputs

    silo, _ = _silo(context, msg.EVALUATE)  # a feature party answers query.loss instead
    what = f"evaluate message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    noised = _noised(context, _evaluation_mode(context, what), silo.silo_id, f"silo {silo.silo_id}")
    model = _model_from_arrays(message, silo.info, instr, what, context)
    if noised is not None:  # charged before anything of the test split is computed
        noised.charge(instr.server_round)
    with _single_thread():
        test = silo.test.nonsensitive
        predictions, loss_sum, losses = test_outputs(model, test.features, test.labels)
    counts = confusion_counts(
        silo.test.sensitive.groups,
        silo.test.nonsensitive.labels,
        predictions,
        silo.info.num_groups,
        silo.info.num_labels,
    )
    noise_std = 0.0
    if noised is not None:
        counts, loss_sum = noised.counts_and_loss(counts, losses, instr.server_round)
        noise_std = noised.std
    content = msg.evaluation_content(silo.silo_id, instr.server_round, len(test.labels), counts, loss_sum, noise_std)
    return Message(content, reply_to=message)


# -- feature and sensitive parties (protocols/parties.py) ----------------------------------------------------------


def _feature_train(message: Message, context: Context) -> Message:
    party = _party(context, parties.FEATURES)
    what = f"train message to feature party {party.party_id}"
    instr = msg.read_instruction(message.content, what=what)
    round_fn = _handler(instr, msg.TRAIN, what, parties.FEATURES)
    # the records beyond the model that the algorithm's feature party reads with this instruction (e.g. W)
    extra = getattr(round_fn, "records_for", lambda _instr: frozenset())(instr)
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG, *extra}, what=what)

    def compute() -> RecordDict:
        with _single_thread():
            model = _model_from_arrays(message, party.info, instr, what, context)
            return round_fn(model, party, instr, context, message)

    return _answer(
        "train", message, context, party.party_id, instr, compute, what, parties.FEATURES, records=len(party.train_ids)
    )


def _sensitive_answer(kind: str, message_kind: str, message: Message, context: Context) -> Message:
    """A sensitive party's private answer (group counts, a round's sums): its algorithm's handler, journaled and
    charged once like a silo's (`_answer`)."""
    party = _party(context, parties.SENSITIVE)
    what = f"{message_kind} message to sensitive party {party.party_id}"
    instr = msg.read_instruction(message.content, what=what)
    handler = _handler(instr, message_kind, what, parties.SENSITIVE)

    def compute() -> RecordDict:
        with _single_thread():
            return handler(party, instr, context, message)

    return _answer(
        kind, message, context, party.party_id, instr, compute, what, parties.SENSITIVE, records=len(party.train_ids)
    )


def _party_for(context: Context, role: str, kind: str):
    """This node's party data, if it has `role` (else the error naming what it answers)."""
    actual = _role(context)
    if actual != role:
        raise _party_module().role_error(actual, kind, "this node")
    return _party(context, role)


@app.query("sensitive")
def sensitive(message: Message, context: Context) -> Message:
    """A sensitive party's step of a round: its noised fairness gradients over its own sample of the records it
    received."""
    _party_for(context, parties.SENSITIVE, parties.SENSITIVE_QUERY)
    return _sensitive_answer("sensitive", parties.SENSITIVE_QUERY, message, context)


@app.query("confusion")
def confusion(message: Message, context: Context) -> Message:
    """A sensitive party's confusion counts of the test records it received, predicted by the model the message
    carries: exact, or under its policy's ``evaluation = "noised"`` (or the policy of a feature party whose records
    they are) a Gaussian histogram charged to its lifetime ledger first."""
    from silofl.client import party_exchange
    from silofl.client.noised_evaluation import COUNTS_RADIUS

    party = _party_for(context, parties.SENSITIVE, parties.CONFUSION)
    what = f"confusion query to sensitive party {party.party_id}"
    mode = _evaluation_mode(context, what)

    msg.check_records(message.content, {msg.CONFIG, msg.MODEL}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    records = party_exchange.stored(context, what)
    if records.noised_evaluation:
        mode = "noised"
    noised = _noised(context, mode, party.party_id, what, radius=COUNTS_RADIUS)
    model = _model_from_arrays(message, party.info, instr, what, context)
    return Message(_party_module().confusion(model, party, records, instr, noised), reply_to=message)


@app.query("loss")
def loss(message: Message, context: Context) -> Message:
    """A feature party's summed test loss (the sensitive parties count its predictions): exact,
    or under its policy's ``evaluation = "noised"`` clipped and noised, charged to its lifetime ledger first."""
    from silofl.client.noised_evaluation import LOSS_RADIUS

    party = _party_for(context, parties.FEATURES, parties.LOSS_QUERY)
    what = f"loss query to feature party {party.party_id}"
    msg.check_records(message.content, {msg.CONFIG, msg.MODEL}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    noised = _noised(context, _evaluation_mode(context, what), party.party_id, what, radius=LOSS_RADIUS)
    model = _model_from_arrays(message, party.info, instr, what, context)
    return Message(_party_module().feature_loss(model, party, instr, noised), reply_to=message)


@app.query("holdings")
def holdings(message: Message, context: Context) -> Message:
    """A sensitive party's record pseudonyms, sealed to each feature party (setup)."""
    from silofl.client import party_exchange

    party = _party_for(context, parties.SENSITIVE, parties.HOLDINGS_QUERY)
    return Message(party_exchange.holdings(context, party, message), reply_to=message)


@app.query("seal")
def seal(message: Message, context: Context) -> Message:
    """A feature party's records, sealed to the sensitive parties holding them (setup)."""
    from silofl.client import party_exchange

    party = _party_for(context, parties.FEATURES, parties.SEAL_QUERY)
    what = f"seal query to feature party {party.party_id}"
    content = party_exchange.seal(context, party, message, _evaluation_mode(context, what))
    return Message(content, reply_to=message)


@app.query("unseal")
def unseal(message: Message, context: Context) -> Message:
    """A sensitive party opens and keeps the feature parties' sealed records (setup)."""
    from silofl.client import party_exchange

    party = _party_for(context, parties.SENSITIVE, parties.UNSEAL_QUERY)
    return Message(party_exchange.receive(context, party, message), reply_to=message)
