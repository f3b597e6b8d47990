"""The silo's Flower ClientApp: checks every message on receipt, routes it to the silo's algorithm, replies.

Message types (see :mod:`protocols.messages`): ``query.setup`` (describe the silo's data), ``train`` (one round of
the run's algorithm) and ``evaluate`` (confusion counts on the silo's local test split). Any message that fails its
checks raises :class:`~protocols.messages.MessageError` before it touches the silo's state; Flower returns the error
to the server, which stops the run naming the silo and the round.

Keep this module's import path light: a deployed ClientApp is a fresh process for every message (platform.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client import randomness
from client.data.tabular import SiloData
from client.silo_data import describe, load_silo_data
from protocols import messages as msg
from protocols.models import build_model, get_parameters, parameter_spec, set_parameters

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


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the run's algorithm on this silo."""
    silo, _ = _silo(context)
    what = f"train message to silo {silo.silo_id}"
    msg.check_records(message.content, {msg.MODEL, msg.CONFIG}, what=what)
    instr = msg.read_config(message.content, msg.TrainInstruction, what=what)
    with _single_thread():
        model = _model_from_message(message, silo, instr.model, instr.hidden, what)
        if instr.algorithm == "fedavg":
            update, report = _train_fedavg(model, silo, instr, context)
        elif instr.algorithm == "dp-fedsgd":
            update, report = _train_dp_fedsgd(model, silo, instr, context)
        else:  # pragma: no cover - TrainInstruction admits only the algorithms above
            raise msg.MessageError(f"{what}: unknown algorithm {instr.algorithm!r}")
    content = RecordDict({msg.UPDATE: msg.arrays_record(update), msg.REPORT: report.to_metric_record()})
    return Message(content, reply_to=message)


def _train_fedavg(model, silo: SiloData, instr: msg.TrainInstruction, context: Context):
    from client.algorithms.fedavg import local_sgd

    rng = randomness.numpy_rng(
        context, seed=instr.seed, silo_id=silo.silo_id, server_round=instr.server_round, stream=randomness.SHUFFLE
    )
    n = local_sgd(
        model, silo.train.nonsensitive, epochs=instr.local_epochs, batch_size=instr.batch_size, lr=instr.lr, rng=rng
    )
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=n,
        epsilon_spent=float("inf"),
        noise_multiplier=0.0,
        sampling_rate=1.0,
    )
    return get_parameters(model), report


def _train_dp_fedsgd(model, silo: SiloData, instr: msg.TrainInstruction, context: Context):
    from client import privacy_state
    from client.algorithms.dp_fedsgd import noisy_gradient
    from client.gradients import unflatten

    n = len(silo.train)
    rate = min(1.0, instr.batch_size / n)
    plan = privacy_state.noise_plan(
        context,
        epsilon=instr.epsilon,
        delta=instr.delta,
        sampling_rate=rate,
        steps=instr.total_rounds,
        releases=1,
        accountant=instr.accountant,
    )
    # The ledger is charged BEFORE anything is computed or released: a refused answer releases nothing.
    spent = privacy_state.charge(context, plan, server_round=instr.server_round, silo=f"silo {silo.silo_id}")
    keys = {"seed": instr.seed, "silo_id": silo.silo_id, "server_round": instr.server_round}
    grad = noisy_gradient(
        model,
        silo.train.nonsensitive,
        sampling_rate=rate,
        clip=instr.clip,
        noise_multiplier=plan.noise_multiplier,
        sample_rng=randomness.numpy_rng(context, stream=randomness.SAMPLING, **keys),
        noise_generator=randomness.torch_generator(context, stream=randomness.NOISE, **keys),
    )
    update = {name: t.detach().numpy().astype("float32") for name, t in unflatten(grad, parameter_spec(model)).items()}
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=n,
        epsilon_spent=spent,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=rate,
    )
    return update, report


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
