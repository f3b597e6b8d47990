"""The server's job, independent of the engine: set up the federation, build the strategy, run it, report.

`run_federation(grid, config)` is what the ServerApp does on every engine (in-process, Ray simulation, deployment):

1. setup round (``query.setup``): every silo loads its data and describes it (dimensions, record counts, schema);
2. the run's length: `rounds`, or `epochs` turned into rounds from the silos' record counts;
3. delta: the configured one, or 1/n^2 with n the federation's training records (smaller than 1/n_j^2 for every
   silo j, so the default is conservative for each of them);
4. the strategy for the algorithm, started from a model initialised by the seed;
5. the result (`result.json`): config, per-round metrics, final metrics, privacy report, timing.

With an `out-dir` the server checkpoints its state after completed rounds (:mod:`server.checkpoint`); with `resume` it
continues from that checkpoint instead of starting at round 1. A run that stops (a silo fails, stalls past
`round-timeout`, or sends something invalid) writes result.json with the state after its last completed round and
`status.state = "stopped"`, then raises a RoundError naming the silo and the round.
"""

from __future__ import annotations

import math
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from protocols import messages as msg
from protocols.config import SSL_ALGORITHMS, RunConfig
from protocols.models import build_model, get_parameters, parameter_spec
from server.result import build_result, write_result
from strategies.base import (
    Federation,
    ProgressCallback,
    RoundError,
    RoundRecord,
    RunHistory,
    SiloEntry,
    SiloflStrategy,
    collect_replies,
)

SETUP_TIMEOUT = 600.0
#: Smallest group probability the prior may hold: noised counts of a tiny group can come out <= 0, and
#: p_S(r)^(-1/2) enters both the objective and the W-noise radius 2 / sqrt(rho).
PRIOR_FLOOR = 1e-3


def setup_round(grid: Grid, config: RunConfig, *, expected_silos: int | None = None) -> Federation:
    """Ask every connected silo to load its data and describe it."""
    spec = msg.DataSpec(
        dataset=config.dataset,
        data_dir=config.data_dir,
        target=config.target,
        sensitive=config.sensitive,
        features=config.features,
        num_silos=config.num_silos,
        partition=config.partition,
        heterogeneity=config.heterogeneity,
        classes_per_silo=config.classes_per_silo,
        dirichlet_alpha=config.dirichlet_alpha,
        max_train_records=config.max_train_records,
        seed=config.seed,
    )
    nodes = _wait_for_nodes(grid, expected_silos or config.num_silos, config.round_timeout)
    messages = [
        Message(RecordDict({msg.CONFIG: spec.to_config_record()}), node, msg.SETUP, group_id="setup") for node in nodes
    ]
    replies = list(grid.send_and_receive(messages, timeout=SETUP_TIMEOUT))
    entries = []
    asked, seen = set(nodes), set()
    for reply in replies:
        node = reply.metadata.src_node_id
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
    if set(nodes) - answered:
        raise RoundError(f"setup round: no reply from nodes {sorted(set(nodes) - answered)}")
    return Federation(silos=tuple(sorted(entries, key=lambda e: e.info.silo_id)))


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
    """Communication rounds: `rounds`, or `epochs` passes over the mean silo's data."""
    if config.rounds:
        return config.rounds
    mean_n = federation.n_train / len(federation.silos)
    if config.algorithm in ("fedavg", "fedsc", "fedavg-sc"):
        return max(1, math.ceil(config.epochs / config.local_epochs))
    if config.algorithm in ("mu2fl", "noisy-sgd"):  # one pass: every record of the smallest silo used once
        if config.epochs > 1:
            raise ValueError(
                f"{config.algorithm} makes a single pass over the data: 'epochs' must be <= 1, got {config.epochs}"
            )
        smallest = min(e.info.n_train for e in federation.silos)
        return max(1, math.floor(config.epochs * smallest / config.batch_size))
    return max(1, math.ceil(config.epochs * mean_n / config.batch_size))


def resolve_delta(config: RunConfig, federation: Federation) -> float:
    return config.delta if config.delta > 0 else 1.0 / federation.n_train**2


def train_instruction(config: RunConfig, rounds: int, delta: float) -> msg.TrainInstruction:
    """What every silo is told each round (the round number aside)."""
    return msg.TrainInstruction(
        algorithm=config.algorithm,
        server_round=1,
        total_rounds=rounds,
        model=config.model,
        hidden=config.hidden,
        batch_size=config.batch_size,
        lr=config.lr,
        local_epochs=config.local_epochs,
        clip=config.clip,
        epsilon=config.epsilon,
        delta=delta,
        accountant=config.accountant,
        seed=config.seed,
        fairness=config.fairness,
        lam=config.lam,
        counts_share=config.counts_share,
        trust=config.trust,
        rho=config.rho,
        domain_diameter=config.domain_diameter,
        projection_dim=config.projection_dim,
        width=config.width,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        grad_clip=config.grad_clip,
        mu=config.mu,
        views=config.views,
        calr_relation=config.calr_relation,
        calr_sampling_rate=config.calr_sampling_rate,
        local_steps=config.local_steps,
        device=config.device,
    )


def groups_round(grid: Grid, federation: Federation, instruction: msg.TrainInstruction, timeout: float) -> np.ndarray:
    """SteFFLe's setup step: the sum over silos of their (noised) records by (sensitive group, label)."""
    info = federation.info
    shape = (info.num_groups, info.num_labels)
    content = RecordDict({msg.CONFIG: instruction.to_config_record()})
    messages = [Message(content, e.node_id, msg.GROUPS, group_id="groups") for e in federation.silos]
    total = np.zeros(shape, dtype=np.float64)
    replies = grid.send_and_receive(messages, timeout=timeout)
    for entry, reply in collect_replies(federation, 0, replies, "groups", timeout):
        what = f"groups reply from {entry.name}"
        msg.check_records(reply.content, {msg.COUNTS, msg.REPORT}, what=what)
        report = msg.read_config(reply.content, msg.GroupsReport, record=msg.REPORT, what=what)
        if report.silo_id != entry.info.silo_id:
            raise RoundError(f"{what}: the reply says silo {report.silo_id}")
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
    from strategies.fedavg import FedAvg
    from strategies.gradient_step import GradientStep, StepSchedule

    info = federation.info
    eval_instruction = msg.EvaluateInstruction(server_round=0, model=config.model, hidden=config.hidden)
    instruction = train_instruction(config, rounds, delta)
    common = {"eval_instruction": eval_instruction, "timeout": config.round_timeout, "instruction": instruction}
    if config.algorithm in SSL_ALGORITHMS:
        return _ssl_strategy(config, federation, common)
    spec = parameter_spec(build_model(config.model, info.num_features, info.num_labels, hidden=config.hidden))
    if config.algorithm == "fedavg":
        return FedAvg(federation, spec, **common)
    if config.algorithm in ("mu2fl", "noisy-sgd"):
        from protocols import mu2
        from strategies.anytime import AnytimeAveraging

        constants = mu2.Mu2Constants.for_logreg(info.num_features, info.num_labels, D=config.domain_diameter)
        calibrate = mu2.calibrate if config.algorithm == "mu2fl" else mu2.calibrate_noisy_sgd
        calibration = calibrate(
            constants,
            num_rounds=rounds,
            num_silos=len(federation.silos),
            rho=mu2.resolve_rho(config.rho, config.epsilon, delta),
            trusted=config.trust == "trusted",
            batch_size=config.batch_size,
            delta=delta,
        )
        return AnytimeAveraging(
            federation,
            spec,
            calibration=calibration,
            radius=constants.radius,
            seeded=engine in ("inprocess", "ray"),
            **common,
        )
    mean_n = federation.n_train / len(federation.silos)
    schedule = StepSchedule(
        config.lr,
        decay=config.lr_decay,
        decay_epochs=config.lr_decay_epochs,
        rounds_per_epoch=mean_n / config.batch_size,
    )
    if config.algorithm == "tran":
        from protocols.ermi import GroupPrior
        from strategies.lagrangian import LagrangianDual

        if group_counts is None:
            raise ValueError("tran needs the silos' group counts (groups_round) to build its prior")
        prior = GroupPrior.from_counts(config.fairness, group_counts, floor=PRIOR_FLOOR)
        return LagrangianDual(
            federation,
            spec,
            schedule=schedule,
            prior=prior,
            initial_multiplier=config.lam,
            dual_lr=config.dual_lr,
            **common,
        )
    if config.algorithm == "steffle":
        from protocols.ermi import GroupPrior, w_shape
        from strategies.noisy_aggregation import NoisyAggregation

        if group_counts is None:
            raise ValueError("steffle needs the silos' group counts (groups_round) to build its prior")
        prior = GroupPrior.from_counts(config.fairness, group_counts, floor=PRIOR_FLOOR)
        return NoisyAggregation(
            federation,
            spec,
            schedule=schedule,
            prior=prior.probs,
            w_shape=w_shape(config.fairness, info.num_groups, info.num_labels),
            w_radius=config.w_radius,
            w_lr=config.w_lr,
            **common,
        )
    return GradientStep(federation, spec, schedule=schedule, **common)


def _ssl_strategy(config: RunConfig, federation: Federation, common: dict[str, Any]) -> SiloflStrategy:
    """FedSC / FedAvg+SC: correlation-matrix aggregation, the backbone + projector as the model."""
    from protocols.ssl_models import build_ssl_model, image_shape
    from strategies.correlation import CorrelationAggregation

    try:
        shape = image_shape(federation.info.num_features)
    except ValueError as exc:
        raise ValueError(f"{config.algorithm} needs an image dataset: {exc}") from None
    model = build_ssl_model(
        config.model, shape, projection_dim=config.projection_dim, width=config.width, seed=config.seed
    )
    evaluator = None
    if config.eval_data == "central":
        from server.ssl_evaluation import CentralEvaluator

        evaluator = CentralEvaluator(config)
    return CorrelationAggregation(
        federation,
        parameter_spec(model),
        initial=get_parameters(model),
        share_start=config.share_start,
        share_every=config.share_every,
        alpha_start=config.alpha_start,
        alpha_end=config.alpha_end,
        participation=config.participation,
        server_optimizer=config.server_optimizer,
        server_lr=config.server_lr,
        evaluator=evaluator,
        **common,
    )


def run_federation(
    grid: Grid, config: RunConfig, *, on_start=None, on_round: ProgressCallback | None = None, engine: str = ""
) -> dict[str, Any]:
    """Run one job on `grid` and return (and, with `out_dir`, write) its result."""
    from server import checkpoint

    t_start = time.perf_counter()
    resumed = _resume_point(config)
    federation = setup_round(grid, config)
    rounds = resolve_rounds(config, federation)
    delta = resolve_delta(config, federation)
    if resumed is not None:
        resumed.check_federation(federation)
        resumed.check_run(rounds, delta)
        restore = getattr(grid, "restore_silo_states", None)  # simulated silos (in-process engine)
        if resumed.silo_states and restore is not None:
            restore(resumed.silo_states)
    counts = None
    if config.algorithm in ("steffle", "tran"):
        # On resume the silos are not asked again: they spent budget on their counts once (the sum is public).
        counts = (
            resumed.group_counts
            if resumed is not None
            else groups_round(grid, federation, train_instruction(config, rounds, delta), config.round_timeout)
        )
    strategy = build_strategy(config, federation, rounds, delta, group_counts=counts, engine=engine)
    info = federation.info
    history: RunHistory | None = None
    if resumed is not None:
        strategy.restore_state_arrays(resumed.strategy)
        strategy.silo_reports = dict(resumed.silo_reports)
        history = resumed.history()
        initial = history.arrays
    else:
        initial = strategy.initial_arrays() or msg.arrays_record(
            get_parameters(
                build_model(config.model, info.num_features, info.num_labels, hidden=config.hidden, seed=config.seed)
            )
        )
    writer = None
    if config.out_dir and checkpoint.resumable(config.algorithm):
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
    # Only a resumed run continues a history (FedSC's strategy runs its own loop and is never resumed).
    resume_from = {"first_round": resumed.completed + 1, "history": history} if resumed is not None else {}
    try:
        history = strategy.start(
            grid, initial, num_rounds=rounds, eval_every=eval_every, on_round=after_round, **resume_from
        )
    except (RoundError, msg.MessageError) as exc:
        # Keep the server's state as of the last completed round (the model, W, the rounds) with the reason the run
        # stopped; then stop loudly. The privacy block reports the latest answers the silos sent, even from the
        # round that failed: what they spent is never under-reported.
        history, error = strategy.history or RunHistory(arrays=initial), exc
        history.silo_reports = {**history.silo_reports, **strategy.silo_reports}
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
    result["status"] = {
        "completed": error is None,
        "state": "completed" if error is None else "stopped",
        "rounds_completed": completed,
        "error": error and str(error),
        "resumed_from": resumed.completed if resumed is not None else None,
        "checkpoint": str(checkpoint_path) if checkpoint_path is not None else None,
    }
    path = write_result(result, Path(config.out_dir)) if config.out_dir else None
    if path is not None and config.algorithm in SSL_ALGORITHMS:
        np.savez(path.parent / "model.npz", **{name: a.numpy() for name, a in history.arrays.items()})
    if error is not None:
        if path is not None:
            how = f"; continue it with resume=true (silofl run ... --resume {config.out_dir})" if writer else ""
            raise RoundError(f"{error}\n(the state after round {completed} is in {path}{how})") from error
        raise error
    return result


def _resume_point(config: RunConfig):
    """The checkpoint a `resume` run continues from (None for a fresh run); refuses what cannot be resumed."""
    from protocols.config import ConfigError
    from server import checkpoint

    if not config.resume:
        return None
    if not checkpoint.resumable(config.algorithm):
        raise ConfigError(
            f"'resume' is not supported for {config.algorithm} yet (its strategy runs its own round loop); drop "
            "'resume' to run it afresh"
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
