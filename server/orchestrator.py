"""The server's job, independent of the engine: set up the federation, build the strategy, run it, report.

`run_federation(grid, config)` is what the ServerApp does on every engine (in-process, Ray simulation, deployment):

1. setup round (``query.setup``): every silo loads its data and describes it (dimensions, record counts, schema);
2. the run's length: `rounds`, or `epochs` turned into rounds from the silos' record counts;
3. delta: the configured one, or 1/n^2 with n the federation's training records (smaller than 1/n_j^2 for every
   silo j, so the default is conservative for each of them);
4. the strategy for the algorithm, built by its registry entry (:mod:`protocols.algorithms`), started from a model
   initialised by the seed;
5. the result (`result.json`): config, per-round metrics, final metrics, privacy report, timing.

With an `out-dir` the server checkpoints its state after completed rounds (:mod:`server.checkpoint`); with `resume` it
continues from that checkpoint instead of starting at round 1. A run that stops (a silo fails, stalls past
`round-timeout`, or sends something invalid) writes result.json with the state after its last completed round and
`status.state = "stopped"`, then raises a RoundError naming the silo and the round.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from silofl.protocols import messages as msg
from silofl.protocols.algorithms.base import resolve
from silofl.protocols.algorithms.common import check_run_model
from silofl.protocols.config import RunConfig
from silofl.server.result import build_result, write_result
from silofl.strategies.base import ProgressCallback, SiloflStrategy, StrategyInputs
from silofl.strategies.federation import Federation, RoundError, RoundRecord, RunHistory, SiloEntry
from silofl.strategies.replies import collect_replies, superlink_error

SETUP_TIMEOUT = 600.0


def setup_round(grid: Grid, config: RunConfig, *, expected_silos: int | None = None) -> Federation:
    """Ask every connected silo to load its data and describe it."""
    spec = msg.DataSpec.from_run_config(config)
    nodes = _wait_for_nodes(grid, expected_silos or config.num_nodes, config.round_timeout)
    messages = [
        Message(RecordDict({msg.CONFIG: spec.to_config_record()}), node, msg.SETUP, group_id="setup") for node in nodes
    ]
    replies = list(grid.send_and_receive(messages, timeout=SETUP_TIMEOUT))
    entries = []
    asked, seen = set(nodes), set()
    unreachable: list[str] = []
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in asked and (reason := superlink_error(reply)) is not None:
            unreachable.append(reason)
            continue
        if node not in asked:
            raise RoundError(f"setup round: a reply came from node {node}, which was not asked ({sorted(asked)})")
        if node in seen:
            raise RoundError(f"setup round: node {node} answered the setup round twice")
        seen.add(node)
        if reply.has_error():
            raise RoundError(f"node {node} failed to set up its data: {reply.error.reason}")
        what = f"setup reply from node {node}"
        msg.check_records(reply.content, {msg.REPORT}, what=what)
        info = msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT, what=what)
        entries.append(SiloEntry(node_id=node, info=info))
    answered = {e.node_id for e in entries}
    if set(nodes) - answered and unreachable:
        raise RoundError(
            f"setup round: no reply from nodes {sorted(set(nodes) - answered)}; the SuperLink reports "
            f"{'; '.join(sorted(set(unreachable)))!r}; start them again (a `silofl deploy up` federation: `silofl "
            "deploy restart --dir DIR`) and submit the run again"
        )
    if set(nodes) - answered:
        raise RoundError(f"setup round: no reply from nodes {sorted(set(nodes) - answered)}")
    _check_roles(config, entries)
    if config.spec.federated_evaluation:
        _check_evaluations(entries)
    ordered = sorted(entries, key=lambda e: e.info.silo_id)
    return Federation(
        silos=tuple(e for e in ordered if e.info.role != "sensitive"),
        sensitive=tuple(e for e in ordered if e.info.role == "sensitive"),
    )


def _check_roles(config: RunConfig, entries: list[SiloEntry]) -> None:
    """The nodes' roles fit the run: silos for topology 'silos'; else num-silos feature parties and the topology's
    sensitive parties, for an algorithm that runs on parties."""
    by_role: dict[str, list[SiloEntry]] = {}
    for entry in entries:
        by_role.setdefault(entry.info.role, []).append(entry)
    topology = config.topology_name
    if topology == "silos":
        if set(by_role) - {"silo"}:
            parties = ", ".join(e.name for e in entries if e.info.role != "silo")
            how = (
                "give the run the topology the parties were prepared for (topology = divided | central-sensitive | "
                "general)"
                if config.spec.runs_on_parties
                else f"{config.algorithm} runs on silos only (role 'silo': both divisions on one node)"
            )
            raise RoundError(f"setup round: {parties} answered as separate parties but the topology is 'silos'; {how}")
        return
    want = {"features": config.num_silos, "sensitive": config.sensitive_nodes}
    got = {role: len(by_role.get(role, [])) for role in ("silo", "features", "sensitive")}
    if got["silo"] or got["features"] != want["features"] or got["sensitive"] != want["sensitive"]:
        raise RoundError(
            f"setup round: topology {topology!r} with num-silos={config.num_silos} needs {want['features']} feature "
            f"and {want['sensitive']} sensitive parties, but {got['features']} feature parties, {got['sensitive']} "
            f"sensitive parties and {got['silo']} silos answered; start each node with its role (node config 'role' "
            "and the party's data-path)"
        )


def _check_evaluations(entries: list[SiloEntry]) -> None:
    """Every run evaluates (every `eval-every` rounds and after the last): a node whose operator's policy refuses the
    evaluation it would be asked for stops the run here, before anything private is released, not at its first
    evaluation after rounds of training. Every node answers exactly or noised."""
    refusing = []
    for entry in entries:
        mode = entry.info.evaluation
        if mode == "refuse":
            refusing.append(f"{entry.name} (evaluation = {mode!r})")
    if refusing:
        raise RoundError(
            f"setup round: {', '.join(refusing)} would refuse the run's evaluations, as its operator's policy says; "
            "a run evaluates every eval-every rounds and after the last. A node answers them with evaluation = "
            '"noised" or "exact": its operator changes the policy\'s `evaluation`, or the run goes without that node'
        )


def _wait_for_nodes(grid: Grid, expected: int, timeout: float) -> list[int]:
    """Node ids of the connected silos; in a deployment, wait until `expected` SuperNodes have connected."""
    start = time.monotonic()
    last_log = start
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        now = time.monotonic()
        if now - start > timeout:
            raise RoundError(
                f"only {len(nodes)} of {expected} silos connected within {timeout:.0f} s (num-silos={expected}); "
                "start the missing silos or lower num-silos"
            )
        if now - last_log >= 10.0:
            log(INFO, "waiting for silos: %d of %d connected", len(nodes), expected)
            last_log = now
        time.sleep(1.0)


def resolve_rounds(config: RunConfig, federation: Federation) -> int:
    """Communication rounds: `rounds`, or `epochs` turned into rounds by the algorithm's rule."""
    if config.rounds:
        return config.rounds
    return config.spec.rounds(config, [e.info.n_train for e in federation.silos])


def resolve_delta(config: RunConfig, federation: Federation) -> float:
    return config.target_delta if config.target_delta > 0 else 1.0 / federation.n_train**2


def train_instruction(config: RunConfig, rounds: int, delta: float) -> msg.TrainInstruction:
    """What every silo is told each round (the round number aside): the algorithm's options marked for the silos."""
    model = config.spec.instruction_model
    values = {name: getattr(config, name) for name in model.model_fields if name in type(config).model_fields}
    values.update(server_round=1, total_rounds=rounds, delta=delta)
    return model(**values)


def evaluate_instruction(config: RunConfig) -> msg.EvaluateInstruction:
    """What the silos are told to evaluate: the model's architecture (the supervised algorithms' federated
    evaluation; the self-supervised ones evaluate at the server)."""
    values = config.model_dump()
    return msg.EvaluateInstruction(
        server_round=0, model=values["model"], hidden=values.get("hidden", 64), device=values.get("device", "cpu")
    )


def groups_round(
    grid: Grid,
    federation: Federation,
    instruction: msg.TrainInstruction,
    timeout: float,
    *,
    entries: Sequence[SiloEntry] | None = None,
) -> np.ndarray:
    """SteFFLe's setup step: the sum over silos (or the sensitive parties `entries`, over the records each received
    in the sealed exchange) of their (noised) records by (sensitive group, label)."""
    info = federation.info
    asked = federation.silos if entries is None else entries
    shape = (info.num_groups, info.num_labels)
    content = RecordDict({msg.CONFIG: instruction.to_config_record()})
    messages = [Message(content, e.node_id, msg.GROUPS, group_id="groups") for e in asked]
    total = np.zeros(shape, dtype=np.float64)
    replies = grid.send_and_receive(messages, timeout=timeout)
    for entry, reply in collect_replies(federation, 0, replies, "groups", timeout, asked):
        what = f"groups reply from {entry.name}"
        msg.check_records(reply.content, {msg.COUNTS, msg.REPORT}, what=what)
        report = msg.read_config(reply.content, msg.GroupsReport, record=msg.REPORT, what=what)
        if report.silo_id != entry.info.silo_id:
            raise RoundError(f"{what}: the reply says {entry.kind} {report.silo_id}")
        total += msg.check_arrays(reply.content, msg.COUNTS, [("counts", shape)], dtype="float64", what=what)["counts"]
    return total


def build_strategy(
    config: RunConfig,
    federation: Federation,
    rounds: int,
    delta: float,
    *,
    group_counts: np.ndarray | None = None,
    engine: str = "",
) -> SiloflStrategy:
    """The algorithm's server strategy, from its registry entry's builder (with the server's own evaluator, from the
    entry's `server_evaluator`, when it has one)."""
    from silofl.protocols.algorithms.base import resolve

    evaluator_ref = config.spec.server_evaluator
    inputs = StrategyInputs(
        config=config,
        federation=federation,
        rounds=rounds,
        delta=delta,
        instruction=train_instruction(config, rounds, delta),
        eval_instruction=evaluate_instruction(config),
        group_counts=group_counts,
        engine=engine,
        evaluator=resolve(evaluator_ref)(config) if evaluator_ref else None,
    )
    return config.spec.build_strategy(inputs)


def run_federation(
    grid: Grid, config: RunConfig, *, on_start=None, on_round: ProgressCallback | None = None, engine: str = ""
) -> dict[str, Any]:
    """Run one job on `grid` and return (and, with `out_dir`, write) its result."""
    from silofl.server import checkpoint

    t_start = time.perf_counter()
    resumed = _resume_point(config)
    federation = setup_round(grid, config)
    # a user's model (--model module:factory) is checked here, before anything is asked of a silo's data
    check_run_model(config, federation.info.num_features, federation.info.num_labels)
    rounds = resolve_rounds(config, federation)
    delta = resolve_delta(config, federation)
    if resumed is not None:
        resumed.check_federation(federation)
        resumed.check_run(rounds, delta)
        restore = getattr(grid, "restore_silo_states", None)  # simulated silos (in-process engine)
        if resumed.silo_states and restore is not None:
            restore(resumed.silo_states)
    counts = None
    if federation.sensitive:
        from silofl.server import parties

        # every start, a resumed one too: a sensitive party keeps the records for the run only
        parties.sealed_exchange(grid, federation, config.round_timeout)
    if msg.GROUPS in config.spec.silo:
        # On resume the silos are not asked again: they spent budget on their counts once (the sum is public).
        counts = resumed.group_counts if resumed is not None else None
        if resumed is None:
            instruction = train_instruction(config, rounds, delta)
            entries = federation.sensitive or None  # the sensitive parties count the records they received
            counts = groups_round(grid, federation, instruction, config.round_timeout, entries=entries)
    strategy = build_strategy(config, federation, rounds, delta, group_counts=counts, engine=engine)
    info = federation.info
    history: RunHistory | None = None
    if resumed is not None:
        strategy.restore_state_arrays(resumed.strategy)
        strategy.silo_reports = dict(resumed.silo_reports)
        history = resumed.history()
        initial = history.arrays
    else:
        initial = strategy.initial_arrays() or resolve(config.spec.initial_model)(config, info)
    writer = None
    if config.out_dir and config.spec.resumable:
        writer = checkpoint.CheckpointWriter(
            Path(config.out_dir),
            config,
            federation,
            rounds,
            delta,
            group_counts=counts,
            elapsed_before=resumed.elapsed_seconds if resumed is not None else 0.0,
            resumed_from=resumed.completed if resumed is not None else 0,
            silo_states=getattr(grid, "silo_states", None),
        )
    eval_every = config.eval_every or max(1, rounds // 20)
    if on_start is not None:
        on_start(rounds, federation)

    def after_round(record: RoundRecord) -> None:
        if writer is not None and strategy.history is not None:
            writer.after_round(strategy, strategy.history)
        if on_round is not None:
            on_round(record)

    t_rounds = time.perf_counter()
    error: Exception | None = None
    # Only a resumed run continues a history.
    resume_from = {"first_round": resumed.completed + 1, "history": history} if resumed is not None else {}
    try:
        history = strategy.start(
            grid, initial, num_rounds=rounds, eval_every=eval_every, on_round=after_round, **resume_from
        )
    except (RoundError, msg.MessageError, KeyboardInterrupt) as exc:
        # Keep the server's state as of the last completed round (the model, W, the rounds) with the reason the run
        # stopped (Ctrl-C included); then stop loudly. The privacy block reports the latest answers the silos sent,
        # even from the round that failed: what they spent is never under-reported.
        history, error = strategy.history or RunHistory(arrays=initial), exc
        history.silo_reports = {**history.silo_reports, **strategy.silo_reports}
    with _no_second_interrupt():  # a second Ctrl-C must not leave a half-written result or checkpoint
        return _finish(config, federation, history, error, writer, resumed, rounds, delta, engine, t_start, t_rounds)


def _finish(
    config: RunConfig,
    federation: Federation,
    history: RunHistory,
    error: BaseException | None,
    writer: Any,
    resumed: Any,
    rounds: int,
    delta: float,
    engine: str,
    t_start: float,
    t_rounds: float,
) -> dict[str, Any]:
    """Write the checkpoint and result.json of a run that completed, failed or was interrupted; then return the
    result, or raise what stopped it (a RoundError naming where its state is, or :class:`RunInterrupted`)."""
    checkpoint_path = writer.write() if writer is not None else None
    t_end = time.perf_counter()
    result = build_result(
        config.model_copy(update={"resume": False}),
        federation,
        history,
        rounds=rounds,
        delta=delta,
        engine=engine,
        total_seconds=t_end - t_start + (resumed.elapsed_seconds if resumed is not None else 0.0),
        round_seconds=t_end - t_rounds,
    )
    completed = len(history.rounds)
    interrupted = isinstance(error, KeyboardInterrupt)
    result["status"] = {
        "completed": error is None,
        "state": "completed" if error is None else "interrupted" if interrupted else "stopped",
        "rounds_completed": completed,
        "error": f"interrupted (Ctrl-C) after round {completed}" if interrupted else error and str(error),
        "resumed_from": resumed.completed if resumed is not None else None,
        "checkpoint": str(checkpoint_path) if checkpoint_path is not None else None,
    }
    path = write_result(result, Path(config.out_dir)) if config.out_dir else None
    if path is not None and config.spec.model_output == "npz":
        np.savez(path.parent / "model.npz", **{name: a.numpy() for name, a in history.arrays.items()})
    if interrupted:
        raise RunInterrupted(completed, rounds, path, resumable=writer is not None) from None
    if error is not None:
        if path is not None:
            how = f"; continue it with resume=true (silofl run ... --resume {config.out_dir})" if writer else ""
            raise RoundError(f"{error}\n(the state after round {completed} is in {path}{how})") from error
        raise error
    return result


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during the rounds, after the run's state was written: `completed` of `rounds` rounds, result.json at
    `path` (None without an out-dir), and whether the checkpoint lets `--resume` continue it."""

    def __init__(self, completed: int, rounds: int, path: Path | None, *, resumable: bool) -> None:
        super().__init__(f"interrupted after round {completed} of {rounds}")
        self.completed, self.rounds, self.path, self.resumable = completed, rounds, path, resumable


@contextlib.contextmanager
def _no_second_interrupt():
    """Ignore SIGINT while the result is written (on the main thread, where Python delivers it), then restore it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _resume_point(config: RunConfig):
    """The checkpoint a `resume` run continues from (None for a fresh run); refuses what cannot be resumed."""
    from silofl.protocols.config import ConfigError
    from silofl.server import checkpoint

    if not config.resume:
        return None
    if not config.spec.resumable:
        raise ConfigError(
            f"'resume' is not supported for {config.algorithm} (its registry entry says resumable=False: its server "
            "state is not checkpointed); drop 'resume' to run it afresh"
        )
    if not config.out_dir:
        raise ConfigError("'resume' continues the run in 'out-dir': give the out-dir of the run to continue")
    resumed = checkpoint.load(config.out_dir)
    resumed.check_config(config)
    if resumed.completed >= resumed.rounds:
        raise checkpoint.CheckpointError(
            f"the run in {config.out_dir} already completed its {resumed.rounds} rounds; nothing to resume"
        )
    return resumed
