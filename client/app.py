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

Keep this module's import path light: a deployed ClientApp is a fresh process for every message (platform.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client import privacy_state
from client.data.tabular import SiloData
from client.rounds import RoundFunction
from client.silo_data import describe, load_silo_data
from protocols import messages as msg
from protocols.models import build_model, parameter_spec, set_parameters

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


def _silo(context: Context) -> tuple[SiloData, msg.DataSpec]:
    if DATA_SPEC_KEY not in context.state:
        saved = privacy_state.load_run_spec(context)  # a silo restarted mid-run, with a state-dir
        if saved is None:
            raise msg.MessageError(
                "this silo holds no state for this run: the server must send 'query.setup' first, or the silo was "
                f"restarted mid-run without a state-dir (node config '{privacy_state.STATE_DIR_KEY}'), which would "
                "let it continue"
            )
        context.state[DATA_SPEC_KEY] = saved
    spec = msg.DataSpec.model_validate(dict(context.state[DATA_SPEC_KEY]))
    return load_silo_data(context, spec), spec


def _answer(
    kind: str,
    message: Message,
    context: Context,
    silo: SiloData,
    instr: msg.TrainInstruction,
    compute: Callable[[], RecordDict],
    what: str,
) -> Message:
    """Answer a checked request once (see `client.privacy_state`): bind the silo's job, replay a journaled answer to
    the same request, else compute it and journal it before it is released."""
    privacy_state.open_job(context, silo_id=silo.silo_id, instr=instr, what=what)
    digest = privacy_state.request_digest(message.content) if privacy_state.persistent(context) else ""
    cached = privacy_state.replay(context, kind, instr, digest, what=what)
    if cached is not None:
        return Message(cached, reply_to=message)
    content = compute()
    privacy_state.answered(context, kind, instr.server_round, digest, content)
    return Message(content, reply_to=message)


@functools.lru_cache(maxsize=8)
def _model_shell(kind: str, num_features: int, num_labels: int, hidden: int) -> torch.nn.Module:
    """A model of the right architecture, reused across messages in one process (every message overwrites all of
    its parameters, so nothing carries over; building one costs ~1 ms, a large part of a small model's round)."""
    return build_model(kind, num_features, num_labels, hidden=hidden)


def _model_from_message(message: Message, silo: SiloData, kind: str, hidden: int, what: str) -> torch.nn.Module:
    model = _model_shell(kind, silo.info.num_features, silo.info.num_labels, hidden)
    params = msg.check_arrays(message.content, msg.MODEL, parameter_spec(model), what=what)
    set_parameters(model, params)
    return model


@app.query("setup")
def setup(message: Message, context: Context) -> Message:
    """Load (or derive) the silo's data and describe it."""
    msg.check_records(message.content, {msg.CONFIG}, what="setup message")
    spec = msg.read_config(message.content, msg.DataSpec, what="setup message")
    silo = load_silo_data(context, spec)  # a spec the silo refuses leaves its current setup as it was
    context.state[DATA_SPEC_KEY] = spec.to_config_record()
    privacy_state.save_run_spec(context, context.state[DATA_SPEC_KEY])
    return Message(RecordDict({msg.REPORT: describe(silo).to_config_record()}), reply_to=message)


@app.query("groups")
def groups(message: Message, context: Context) -> Message:
    """SteFFLe's setup step: the silo's records by (sensitive group, label), through a DP histogram."""
    silo, _ = _silo(context)
    what = f"groups message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.CONFIG}, what=what)
    instr = msg.read_instruction(message.content, what=what)
    group_counts = _handler(instr, msg.GROUPS, what)

    def compute() -> RecordDict:
        counts, spent = group_counts(silo, instr, context)
        report = msg.GroupsReport(silo_id=silo.silo_id, epsilon_spent=spent)
        return RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})

    return _answer("groups", message, context, silo, instr, compute, what)


@app.query("correlation")
def correlation(message: Message, context: Context) -> Message:
    """FedSC: the silo's correlation matrix under the current global model, through DP-CalR (noised here)."""
    silo, _ = _silo(context)
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

    return _answer("correlation", message, context, silo, instr, compute, what)


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the run's algorithm on this silo."""
    silo, _ = _silo(context)
    what = f"train message to silo {silo.silo_id}"
    instr = msg.read_instruction(message.content, what=what)
    round_fn: RoundFunction = _handler(instr, msg.TRAIN, what)
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG, *round_fn.extra_records}, what=what)

    def compute() -> RecordDict:
        with _single_thread():
            model = None
            if round_fn.needs_model:
                model = _model_from_message(message, silo, instr.model, getattr(instr, "hidden", 64), what)
            arrays, report = round_fn(model, silo, instr, context, message)
        return RecordDict(
            {**{name: msg.arrays_record(a) for name, a in arrays.items()}, msg.REPORT: report.to_metric_record()}
        )

    return _answer("train", message, context, silo, instr, compute, what)


def _handler(instr: msg.TrainInstruction, kind: str, what: str) -> Callable:
    """The silo's function for message kind `kind` of the instruction's algorithm (its registry entry names it; the
    module is imported on first use: keep the import path light)."""
    from protocols import algorithms

    spec = algorithms.get(instr.algorithm)
    handler = spec.silo_handler(kind)
    if handler is None:
        raise msg.MessageError(f"{what}: {spec.name} does not use {kind!r} messages")
    return handler


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Confusion counts by (sensitive group, label, prediction) and the summed loss on the local test split.

    The sensitive division is read here, to group the counts: the counts are exact (not noised) and describe the
    held-out test split, not the training records the DP guarantee covers; see the run's privacy report.
    """
    from protocols.fairness_metrics import confusion_counts
    from protocols.models import loss_fn

    silo, _ = _silo(context)
    what = f"evaluate message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.EvaluateInstruction, what=what)
    with _single_thread():
        model = _model_from_message(message, silo, instr.model, instr.hidden, what)
        x = torch.from_numpy(silo.test.nonsensitive.features)
        y = torch.from_numpy(silo.test.nonsensitive.labels)
        with torch.no_grad():
            logits = model(x)
            loss_sum = float(loss_fn(logits, y)) * len(y) if len(y) else 0.0
            predictions = logits.argmax(dim=1).numpy()
    counts = confusion_counts(
        silo.test.sensitive.groups,
        silo.test.nonsensitive.labels,
        predictions,
        silo.info.num_groups,
        silo.info.num_labels,
    )
    report = msg.EvaluateReport(
        silo_id=silo.silo_id, server_round=instr.server_round, num_examples=len(y), loss_sum=loss_sum
    )
    content = RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})
    return Message(content, reply_to=message)
