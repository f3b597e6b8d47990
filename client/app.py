"""The silo's Flower ClientApp: checks every message on receipt, routes it to the silo's algorithm, replies.

Message types (see :mod:`protocols.messages`): ``query.setup`` (describe the silo's data), ``query.groups``
(SteFFLe: the silo's (group, label) counts through a DP histogram), ``query.correlation`` (FedSC: the silo's
correlation matrix through DP-CalR), ``train`` (one round of the run's algorithm, `client.rounds.<algorithm>`) and
``evaluate`` (confusion counts on the silo's local test split). Any message that
fails its checks raises :class:`~protocols.messages.MessageError` before it touches the silo's state; Flower returns
the error to the server, which stops the run naming the silo and the round.

Keep this module's import path light: a deployed ClientApp is a fresh process for every message (platform.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client.data.tabular import SiloData
from client.rounds import RoundFunction
from client.silo_data import describe, load_silo_data
from protocols import messages as msg
from protocols.models import build_model, parameter_spec, set_parameters

DATA_SPEC_KEY = "silofl.data-spec"

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
        raise msg.MessageError("this silo has not been set up for the run: the server must send 'query.setup' first")
    spec = msg.DataSpec.model_validate(dict(context.state[DATA_SPEC_KEY]))
    return load_silo_data(context, spec), spec


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
    context.state[DATA_SPEC_KEY] = spec.to_config_record()
    silo = load_silo_data(context, spec)
    return Message(RecordDict({msg.REPORT: describe(silo).to_config_record()}), reply_to=message)


@app.query("groups")
def groups(message: Message, context: Context) -> Message:
    """SteFFLe's setup step: the silo's records by (sensitive group, label), through a DP histogram."""
    from client.rounds.steffle import group_counts

    silo, _ = _silo(context)
    what = f"groups message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.TrainInstruction, what=what)
    if instr.algorithm != "steffle":
        raise msg.MessageError(f"{what}: group counts are part of SteFFLe only, not {instr.algorithm!r}")
    counts, spent = group_counts(silo, instr, context)
    report = msg.GroupsReport(silo_id=silo.silo_id, epsilon_spent=spent)
    content = RecordDict({msg.COUNTS: msg.arrays_record({"counts": counts}), msg.REPORT: report.to_metric_record()})
    return Message(content, reply_to=message)


@app.query("correlation")
def correlation(message: Message, context: Context) -> Message:
    """FedSC: the silo's correlation matrix under the current global model, through DP-CalR (noised here)."""
    from client.rounds.fedsc import correlation_reply

    silo, _ = _silo(context)
    what = f"correlation query to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.TrainInstruction, what=what)
    with _single_thread():
        matrix, report = correlation_reply(silo, instr, context, message)
    content = RecordDict(
        {msg.CORRELATION_MATRIX: msg.arrays_record({"R": matrix}), msg.REPORT: report.to_metric_record()}
    )
    return Message(content, reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the run's algorithm on this silo."""
    silo, _ = _silo(context)
    what = f"train message to silo {silo.silo_id}"
    instr = msg.read_config(message.content, msg.TrainInstruction, what=what)
    round_fn = _round_function(instr.algorithm)
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG, *round_fn.extra_records}, what=what)
    with _single_thread():
        model = _model_from_message(message, silo, instr.model, instr.hidden, what) if round_fn.needs_model else None
        arrays, report = round_fn(model, silo, instr, context, message)
    content = RecordDict(
        {**{name: msg.arrays_record(a) for name, a in arrays.items()}, msg.REPORT: report.to_metric_record()}
    )
    return Message(content, reply_to=message)


def _round_function(algorithm: str) -> RoundFunction:
    """The silo's side of one training round of `algorithm` (imported on demand: keep the import path light)."""
    if algorithm == "fedavg":
        from client.rounds.fedavg import train_round
    elif algorithm == "dp-fedsgd":
        from client.rounds.dp_fedsgd import train_round
    elif algorithm == "steffle":
        from client.rounds.steffle import train_round
    elif algorithm in ("mu2fl", "noisy-sgd"):
        from client.rounds.mu2fl import train_round
    elif algorithm == "fedsc":
        from client.rounds.fedsc import train_round
    elif algorithm == "fedavg-sc":
        from client.rounds.fedsc import train_round_fedavg_sc as train_round
    else:  # pragma: no cover - TrainInstruction admits only the algorithms above
        raise msg.MessageError(f"unknown algorithm {algorithm!r}")
    return train_round


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
