"""The round loop every silofl strategy runs on (:class:`SiloflStrategy`), and what an algorithm's strategy builder
is given (:class:`StrategyInputs`).

A silofl strategy is a Flower Message-API :class:`~flwr.serverapp.strategy.Strategy`. It talks to every silo of the
federation each round (cross-silo: all silos take part unless the algorithm samples them), checks every reply on
receipt (the silo that sent it, the round, the shapes, dtypes and finite values) and refuses the round, naming the
silo, if anything is wrong: nothing of a bad round is applied, so the server's state stays that of the last good
round. The federation and the run's records are in :mod:`strategies.federation`; collecting and checking replies
and the evaluation metrics in :mod:`strategies.replies`.

`start` runs the rounds like Flower's own loop, but evaluates on a schedule (every `eval_every` rounds and at the end,
since a federated evaluation costs a full round trip) and reports progress through a callback. A strategy may ask
only some silos to train in a round (:meth:`SiloflStrategy.participants`), exchange something with them before the
train message (:meth:`SiloflStrategy.before_train`: FedSC's correlation share), send each of them records of its own
(:meth:`SiloflStrategy.silo_records`) and evaluate elsewhere than at the silos (:meth:`SiloflStrategy.evaluate_round`:
FedSC's central evaluation). It can also continue a run from a server checkpoint (`first_round`, `history`; see
:mod:`server.checkpoint`): the strategy's own state is whatever numpy arrays it holds as attributes
(:meth:`SiloflStrategy.state_arrays`, which a strategy with other state overrides), so that a restored strategy
continues bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from silofl.protocols import messages as msg
from silofl.strategies.federation import Federation, RoundError, RoundRecord, RunHistory, SiloEntry
from silofl.strategies.replies import Arrays, SiloUpdate, check_evaluation_counts, collect_replies, evaluation_metrics


@dataclass
class StrategyInputs:
    """What an algorithm's strategy builder (its registry entry's `strategy`) is given: the run's configuration, the
    federation that answered the setup round, the run's length and delta, the instruction every silo receives, and
    the (noised) group counts of the algorithms that ask the silos for them (`query.groups`), and the server's own
    evaluator where the algorithm's entry has one."""

    config: Any  # the algorithm's protocols.config.RunConfig
    federation: Federation
    rounds: int
    delta: float
    instruction: msg.TrainInstruction
    eval_instruction: msg.EvaluateInstruction
    group_counts: np.ndarray | None = None
    engine: str = ""
    #: The server's own evaluator of the run, built from the registry entry's `server_evaluator` (None without one).
    evaluator: Any = None

    @property
    def common(self) -> dict[str, Any]:
        """The keyword arguments of :class:`SiloflStrategy` itself."""
        return {
            "eval_instruction": self.eval_instruction,
            "timeout": self.config.round_timeout,
            "instruction": self.instruction,
        }

    def tabular_spec(self) -> list[tuple[str, tuple[int, ...]]]:
        """The parameter names and shapes of the run's logistic regression or MLP."""
        from silofl.protocols.models import build_model, parameter_spec

        info = self.federation.info
        model = build_model(
            self.config.model, info.num_features, info.num_labels, hidden=getattr(self.config, "hidden", 64)
        )
        return parameter_spec(model)

    def counts(self) -> np.ndarray:
        if self.group_counts is None:
            raise ValueError(f"{self.config.algorithm} needs the silos' group counts (query.groups) for its prior")
        return self.group_counts


#: What :meth:`SiloflStrategy.start` calls with each completed round's record.
ProgressCallback = Callable[[RoundRecord], None]


def check_state_arrays(owner: str, arrays: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Refuse a checkpoint's strategy arrays unless they have `expected`'s names, shapes and dtypes (`owner`: the
    strategy, named in the error); nothing is restored from arrays that do not all fit."""
    if set(arrays) != set(expected):
        raise RoundError(
            f"the checkpoint holds strategy state {sorted(arrays)}, but {owner} keeps {sorted(expected)}: it was "
            "written by another algorithm or version"
        )
    for name, value in arrays.items():
        if value.shape != expected[name].shape or value.dtype != expected[name].dtype:
            raise RoundError(
                f"checkpoint: strategy array '{name}' is {value.dtype}{value.shape}, expected "
                f"{expected[name].dtype}{expected[name].shape}"
            )


class SiloflStrategy(Strategy):
    """Base of silofl's strategies: subclasses say what to send (`train_instruction`) and how to combine replies."""

    #: dtype of the model arrays the server holds and of the silos' train replies.
    array_dtype = "float32"

    def __init__(
        self,
        federation: Federation,
        param_spec: Sequence[tuple[str, tuple[int, ...]]],
        *,
        instruction: msg.TrainInstruction,
        eval_instruction: msg.EvaluateInstruction,
        timeout: float = 600.0,
    ) -> None:
        self.federation = federation
        self.param_spec = [(name, tuple(shape)) for name, shape in param_spec]
        self.instruction = instruction
        self.eval_instruction = eval_instruction
        self.timeout = timeout
        self.silo_reports: dict[int, msg.TrainReport] = {}
        self._current: dict[str, np.ndarray] | None = None
        #: The silos asked to train in the round under way (set by `configure_train`, read by `aggregate_train`).
        self._asked: tuple[SiloEntry, ...] = federation.silos
        self.history: RunHistory | None = None
        #: The summed test counts of the last federated evaluation (set by `aggregate_evaluate`).
        self._eval_counts: np.ndarray | None = None
        #: silo id -> the noise std of its last evaluation's counts (0: exact; `client.noised_evaluation`)
        self.evaluation_noise: dict[int, float] = {}

    # -- subclass API -----------------------------------------------------------------------------------------------
    def train_instruction(self, server_round: int) -> ConfigRecord:
        """What every silo is told this round: the run's instruction with the round number."""
        return self.instruction.model_copy(update={"server_round": server_round}).to_config_record()

    def initial_arrays(self) -> ArrayRecord | None:
        """The starting model when the algorithm fixes it (e.g. DP-mu2-FL's x_1 = 0); None: the seeded init."""
        return None

    def train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        """The array records of a train message: the model, plus whatever else the algorithm broadcasts."""
        return {msg.MODEL: arrays}

    def participants(self, server_round: int) -> Sequence[SiloEntry]:
        """The silos asked to train in `server_round` (and asked by `before_train`): every silo (cross-silo). An
        algorithm that samples silos overrides it with a function of the run's seed and the round, so that a resumed
        run asks the same silos."""
        return self.federation.silos

    def before_train(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> None:
        """An exchange with the round's participants before its train message (FedSC's correlation share); none by
        default. It checks every reply before it keeps anything, like `aggregate_train`."""

    def silo_records(self, server_round: int, silos: Sequence[SiloEntry]) -> dict[int, dict[str, ArrayRecord]]:
        """Array records for one silo only, by node id, added to its train message (FedSC's Rbar_{-j}); none by
        default."""
        return {}

    def reply_specs(self) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        """The array records a train reply must hold, with their names and shapes."""
        return {msg.UPDATE: self.param_spec}

    def read_update(self, entry: SiloEntry, reply: Message, what: str) -> dict[str, Arrays]:
        """The checked array records of one train reply (names, shapes, dtypes, finite values: `reply_specs`)."""
        specs = self.reply_specs()
        msg.check_records(reply.content, {*specs, msg.REPORT}, what=what)
        return {
            name: msg.check_arrays(reply.content, name, spec, dtype=self.array_dtype, what=what)
            for name, spec in specs.items()
        }

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        """The new model from the current one and the checked replies (in silo-id order)."""
        raise NotImplementedError

    def privacy_reports(self, updates: list[SiloUpdate]) -> dict[int, msg.TrainReport]:
        """The reports of the nodes that spend privacy budget this round, by id (the silos' train reports)."""
        return {entry.info.silo_id: report for entry, _, report in updates}

    def round_lr(self, server_round: int) -> float | None:
        """The silos' learning rate in `server_round` (None for an algorithm without one, e.g. DP-mu2-FL)."""
        return getattr(self.instruction, "lr", None)

    def result_state(self) -> dict[str, object]:
        """Server state beyond the model that belongs in result.json (e.g. SteFFLe's W)."""
        return {}

    def read_model(self, arrays: ArrayRecord) -> Arrays:
        """The server's model record as checked numpy arrays (the parameters' names, shapes and dtype)."""
        return msg.check_arrays(
            RecordDict({msg.MODEL: arrays}), msg.MODEL, self.param_spec, dtype=self.array_dtype, what="server model"
        )

    # -- Flower Strategy API ----------------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current = self.read_model(arrays)
        instruction = self.train_instruction(server_round)
        instruction.update(config)
        records = self.train_records(server_round, arrays)
        self._asked = tuple(self.participants(server_round))
        own = self.silo_records(server_round, self._asked)
        return [
            self._message({**records, **own.get(e.node_id, {})}, instruction, msg.TRAIN, e.node_id, server_round)
            for e in self._asked
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self._current is None:
            raise RoundError("aggregate_train called before configure_train")
        updates: list[SiloUpdate] = []
        for entry, reply in self._collect(server_round, replies, "train", self._asked):
            what = f"train reply from {entry.name} in round {server_round}"
            report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            self._check_count(report.num_examples, entry.info.n_train, entry, what)
            updates.append((entry, self.read_update(entry, reply, what), report))
        # silofl's strategies replace their state arrays in `combine`, never change them in place: references suffice.
        before = self._state_refs()
        new = self.combine(server_round, self._current, updates)
        bad = [name for name, value in new.items() if not np.isfinite(value).all()]
        bad += [name for name, value in self._state_refs().items() if not np.isfinite(value).all()]
        if bad:
            for name, value in before.items():  # nothing of a refused round is applied
                setattr(self, name, value)
            raise RoundError(
                f"round {server_round}: the aggregate of the silos' replies is not finite ({', '.join(bad)}); the "
                "round is refused and the server's state kept as of the previous round (lower the learning rate?)"
            )
        reports = self.privacy_reports(updates)
        self.silo_reports.update(reports)
        spent = max((r.epsilon_spent for r in reports.values()), default=0.0)
        metrics = MetricRecord({"epsilon-spent": spent})
        return msg.arrays_record(new), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        instruction = self.eval_instruction.model_copy(update={"server_round": server_round}).to_config_record()
        records = {msg.MODEL: arrays}
        return [
            self._message(records, instruction, msg.EVALUATE, e.node_id, server_round) for e in self.federation.silos
        ]

    def summed_evaluations(
        self, server_round: int, replies: Iterable[Message], shape: tuple[int, ...]
    ) -> tuple[np.ndarray, float, int, dict[int, float]]:
        """The evaluate replies' counts (each of `shape`, checked: exact ones sum to num-examples, noised ones lie
        within their noise), summed; their loss sums and num-examples summed; each node's noise std."""
        total = np.zeros(shape, dtype=np.int64)
        loss_sum, n = 0.0, 0
        noise: dict[int, float] = {}
        for entry, reply in self._collect(server_round, replies, "evaluate"):
            what = f"evaluate reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {msg.COUNTS, msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            self._check_count(report.num_examples, entry.info.n_test, entry, what, split="test")
            counts = msg.check_arrays(reply.content, msg.COUNTS, [("counts", shape)], dtype="int64", what=what)
            c = counts["counts"]
            check_evaluation_counts(c, report, what)
            noise[entry.info.silo_id] = report.noise_std
            total += c
            loss_sum += report.loss_sum
            n += report.num_examples
        return total, loss_sum, n, noise

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        info = self.federation.info
        shape = (info.num_groups, info.num_labels, info.num_labels)
        total, loss_sum, n, noise = self.summed_evaluations(server_round, replies, shape)
        self._eval_counts = total
        self.evaluation_noise = noise  # set only once every reply passed its checks: a refused round changes nothing
        return evaluation_metrics(total, loss_sum, n)

    def summary(self) -> None:
        log(
            INFO,
            "%s over %d silos, %d parameters",
            type(self).__name__,
            len(self.federation.silos),
            sum(int(np.prod(s)) for _, s in self.param_spec),
        )

    # -- server state (checkpoints) ---------------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The strategy's own state beyond the model, for a checkpoint: copies of its numpy-array attributes.

        SteFFLe's W and prior, DP-mu2-FL's w_t, x_t, x_{t-1}, the FedSGD weights: every silofl strategy keeps its
        round-to-round state in numpy arrays (everything else is derived from the run config and the federation).
        A strategy with other mutable state must override this and :meth:`restore_state_arrays`.
        """
        return {name: value.copy() for name, value in self._state_refs().items()}

    def _state_refs(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in vars(self).items() if isinstance(v, np.ndarray) and not k.startswith("_")}

    def restore_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Put back :meth:`state_arrays` of a checkpoint; refuse arrays that do not fit this strategy."""
        check_state_arrays(type(self).__name__, arrays, self.state_arrays())
        for name, value in arrays.items():
            setattr(self, name, value.copy())

    # -- run loop ---------------------------------------------------------------------------------------------------
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        eval_every: int = 1,
        on_round: ProgressCallback | None = None,
        first_round: int = 1,
        history: RunHistory | None = None,
    ) -> RunHistory:
        """Run rounds `first_round`..`num_rounds`; evaluate every `eval_every` rounds and after the last one.

        A fresh run starts at round 1. A resumed run passes the checkpoint's model as `initial_arrays`, its rounds
        in `history` and `first_round` = the checkpoint's round + 1 (the strategy's state restored beforehand).
        `history` is updated only when a round has completed (train and, if due, evaluation): if a round fails, it
        holds the state after the last completed round.
        """
        timeout = self.timeout if timeout is None else timeout
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        if history is None:
            history = RunHistory(arrays=initial_arrays)
        if first_round != len(history.rounds) + 1:
            raise RoundError(f"cannot start at round {first_round} with {len(history.rounds)} rounds of history")
        self.history = history  # kept up to the last completed round if a round fails
        arrays = initial_arrays
        for server_round in range(first_round, num_rounds + 1):
            t0 = time.perf_counter()
            self.before_train(grid, server_round, arrays)
            replies = grid.send_and_receive(
                self.configure_train(server_round, arrays, train_config, grid), timeout=timeout
            )
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = new_arrays
            record = RoundRecord(server_round=server_round, seconds=0.0, lr=self.round_lr(server_round))
            if metrics is not None and "epsilon-spent" in metrics:
                record.epsilon_spent = float(metrics["epsilon-spent"])
            if server_round % max(eval_every, 1) == 0 or server_round == num_rounds:
                final = server_round == num_rounds
                self.evaluate_round(grid, record, arrays, final=final, config=evaluate_config, timeout=timeout)
            record.seconds = time.perf_counter() - t0
            history.arrays = arrays
            history.rounds.append(record)
            history.silo_reports = dict(self.silo_reports)
            history.server_state = self.result_state()
            if on_round is not None:
                on_round(record)
        history.silo_reports = dict(self.silo_reports)
        history.server_state = self.result_state()
        return history

    def evaluate_round(
        self, grid: Grid, record: RoundRecord, arrays: ArrayRecord, *, final: bool, config: ConfigRecord, timeout: float
    ) -> None:
        """Evaluate `arrays` after `record`'s round into `record` (`final`: the run's last round): the federated
        evaluation on every silo's test split, with its summed counts and the silos' noise. An algorithm evaluated
        elsewhere overrides it (FedSC: at the server, on its own labelled data)."""
        server_round = record.server_round
        replies = grid.send_and_receive(self.configure_evaluate(server_round, arrays, config, grid), timeout=timeout)
        self._eval_counts = None
        self.evaluation_noise = {}
        ev = self.aggregate_evaluate(server_round, replies)
        record.evaluation = {k: float(v) for k, v in ev.items()} if ev is not None else None
        record.counts = self._eval_counts
        record.evaluation_noise = dict(self.evaluation_noise) or None

    # -- helpers ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _message(
        records: dict[str, ArrayRecord], config: ConfigRecord, kind: str, node_id: int, server_round: int
    ) -> Message:
        content = RecordDict({**records, msg.CONFIG: config})
        return Message(content, node_id, kind, group_id=str(server_round))

    def _collect(
        self, server_round: int, replies: Iterable[Message], kind: str, entries: Sequence[SiloEntry] | None = None
    ) -> list[tuple[SiloEntry, Message]]:
        return collect_replies(self.federation, server_round, replies, kind, self.timeout, entries)

    @staticmethod
    def _check_count(reported: int, declared: int, entry: SiloEntry, what: str, split: str = "training") -> None:
        """A reply's record count must be the one its node declared in the setup round: a count weighs the node's
        reply in the average (FedAvg) and the server's checks of its counts, so a node that claims 10^15 records
        would otherwise take the average over. The run stops, naming the node."""
        if reported != declared:
            raise RoundError(
                f"{what}: the reply's num-examples claims {reported} {split} records, but {entry.name} declared "
                f"{declared} in the setup round; the server refuses it and stops the run"
            )

    @staticmethod
    def _check_identity(silo_id: int, reply_round: int, entry: SiloEntry, server_round: int, what: str) -> None:
        if silo_id != entry.info.silo_id:
            raise RoundError(
                f"{what}: the reply says {entry.kind} {silo_id}, but node {entry.node_id} is {entry.kind} "
                f"{entry.info.silo_id}"
            )
        if reply_round != server_round:
            raise RoundError(f"{what}: the reply is for round {reply_round}, expected {server_round}")
