"""FedSC's server: correlation-matrix aggregation with a per-silo cache, then weight averaging (the FedSC paper's
Algorithm 1, "Server"; `protocols.fedsc` has the math). With algorithm "fedavg-sc" it is FedAvg+SC: no sharing,
alpha = 1.

Each round t (on the shared round loop of :class:`strategies.base.SiloflStrategy`, which checkpoints it):

1. participants J_t (:meth:`FedscStrategy.participants`): every silo in round 1 and in the first sharing round (so
   the cache holds every silo), else a random `participation` fraction (at least one silo) drawn from (seed, t);
2. if t is a sharing round (t >= share_start and (t - share_start) % share_every == 0), before the train message
   (:meth:`FedscStrategy.before_train`): ``query.correlation`` to the participants; each returns its DP correlation
   matrix R~_j (noised in the silo). The cache keeps every silo's latest R~_j and the round it was shared in;
3. ``train`` to the participants with this round's alpha_t (1 before the first share, then eq. 80's linear decay
   from alpha_start (the paper: 1) to alpha_end) and Rbar_{-j} = (R~ - q_j R~_j) / (1 - q_j), R~ = sum_j q_j R~_j
   with q_j = n_j / n normalised over the entries used: a silo's own noise cancels from what it receives. Which
   entries (`stale_shares`): "keep" = the whole cache, stale entries of the silos not sampled included (the paper's
   Algorithm 1, line 17); "drop" (the default) = the entries of the latest sharing round only. With every silo
   sharing in every sharing round (participation 1) the two are the same; under partial participation stale entries
   describe an encoder that has moved on, and a participant contrasts its records against where the other silos'
   representations were, not where they are: docs/FEDSC.md, "Stale shares under partial participation", measures
   what that costs. A participant with no other entry from the latest sharing round (one participant) falls back
   to the whole cache;
4. the new model is the n_j-weighted mean of the participants' weights (FedAvg over J_t), or, with
   `server_optimizer` "adam", an Adam step from the current model along that mean's displacement (FedAdam,
   `strategies.server_optimizer`).

The learning rate follows a cosine over the rounds (the paper's "lr 0.03 cosine"): the silos' lr with FedAvg; with
FedAdam the server's lr (the step size), while the silos' lr stays constant (it only scales the displacement Adam
normalizes). Evaluation is central
(the paper's protocol: a kNN monitor every `eval_every` rounds, a linear probe on frozen backbone features at the
end) through `evaluator`, a server-side object with the labelled evaluation data (`server.ssl_evaluation`); without
one the run trains only.

The server's state between rounds, beyond the model, is the cache with what each silo reported with its matrix and
the round it was shared in, the alphas so far and FedAdam's moments (:meth:`FedscStrategy.state_arrays`): a run
resumed from its checkpoint continues bit for bit (the participants and the silos' draws are functions of the seed
and the round).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from silofl.protocols import fedsc
from silofl.protocols import messages as msg
from silofl.protocols.privacy.calr import normalize_release
from silofl.strategies.base import SiloflStrategy, StrategyInputs, check_state_arrays
from silofl.strategies.federation import Federation, RoundError, RoundRecord, SiloEntry, _json_float
from silofl.strategies.replies import Arrays, SiloUpdate, collect_replies, weighted_sum
from silofl.strategies.server_optimizer import ServerOptimizer

#: The prefix of FedAdam's moments among the strategy's checkpointed arrays.
ADAM_PREFIX = "adam."


class Evaluator(Protocol):
    def monitor(self, arrays: Arrays) -> dict[str, float]: ...

    def final(self, arrays: Arrays) -> dict[str, float]: ...


def sharing_rounds(total_rounds: int, share_start: int, share_every: int) -> list[int]:
    """The rounds of the schedule in which participants share their correlation matrices."""
    return list(range(share_start, total_rounds + 1, share_every))


def cosine_lr(base: float, server_round: int, total_rounds: int) -> float:
    """lr_t = base * (1 + cos(pi (t - 1) / T)) / 2: base in round 1, decaying towards 0 at the end."""
    return base * 0.5 * (1.0 + math.cos(math.pi * (server_round - 1) / total_rounds))


class FedscStrategy(SiloflStrategy):
    """FedSC's server: correlation-matrix aggregation with a per-silo cache, then weight averaging (and FedAvg+SC's,
    FedSC's baseline, with no sharing: `build_fedavg_sc`).

    Jing, Yu, Zhang, Zhang, "FedSC: Provable Federated Self-supervised Learning with Spectral Contrastive Objective over
    Non-i.i.d. Data", ICML 2024 (Algorithm 1, "Server"; the silos' DP-CalR: Algorithm 2).

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`.
    initial : Arrays
        the starting backbone + projector.
    share_start, share_every : int
        the first sharing round and the rounds between shares.
    alpha_start, alpha_end : float
        alpha_t's linear decay (eq. 80) from the first share to the end.
    participation : float
        the fraction of silos sampled each round outside the first rounds.
    stale_shares : str
        "drop": Rbar_{-j} from the latest sharing round's entries only; "keep": from the whole cache (the paper).
    sharing : bool
        share correlation matrices (FedSC) or not (FedAvg+SC, alpha = 1).
    server_optimizer : str
        "avg" (FedAvg) or "adam" (FedAdam, `strategies.server_optimizer`).
    server_lr : float
        FedAdam's step size.
    evaluator : Evaluator or None
        the central kNN monitor and linear probe; None: the run trains only.
    """

    def __init__(
        self,
        federation: Federation,
        param_spec,
        *,
        instruction: msg.TrainInstruction,
        eval_instruction: msg.EvaluateInstruction,
        initial: Arrays,
        share_start: int,
        share_every: int,
        alpha_start: float = 1.0,
        alpha_end: float,
        participation: float,
        stale_shares: str = "drop",
        sharing: bool = True,
        server_optimizer: str = "avg",
        server_lr: float = 1e-3,
        evaluator: Evaluator | None,
        timeout: float = 600.0,
    ) -> None:
        super().__init__(
            federation, param_spec, instruction=instruction, eval_instruction=eval_instruction, timeout=timeout
        )
        self.initial = initial
        self.sharing = sharing
        self.share_rounds = set(sharing_rounds(instruction.total_rounds, share_start, share_every))
        self.alpha_start = alpha_start
        self.alpha_end = alpha_end
        self.participation = participation
        if stale_shares not in ("drop", "keep"):
            raise ValueError(f"stale_shares must be 'drop' or 'keep', got {stale_shares!r}")
        self.stale_shares = stale_shares
        self.evaluator = evaluator
        n = federation.n_train
        self.weights = {e.info.silo_id: e.info.n_train / n for e in federation.silos}
        self.cache: dict[int, np.ndarray] = {}
        self.shared_in: dict[int, int] = {}  # the round of each cache entry's share
        self.shares: dict[int, int] = {e.info.silo_id: 0 for e in federation.silos}
        self.correlation_epsilon: dict[int, float] = {}
        self.noise_std: dict[int, float] = {}
        self.alphas: list[float] = []
        self.server_optimizer = ServerOptimizer(server_optimizer)  # type: ignore[arg-type]
        self.server_lr = server_lr

    # -- schedule ---------------------------------------------------------------------------------------------------
    @property
    def planned_shares(self) -> int:
        return len(self.share_rounds) if self.sharing else 0

    @property
    def first_share(self) -> int | None:
        """The run's first sharing round (None: the run shares nothing)."""
        return min(self.share_rounds) if self.sharing and self.share_rounds else None

    def participants(self, server_round: int) -> list[SiloEntry]:
        """J_t: every silo in round 1 and the first sharing round, else a draw from (seed, t)."""
        silos = list(self.federation.silos)
        if server_round in (1, self.first_share) or self.participation >= 1.0:
            return silos
        k = max(1, math.ceil(self.participation * len(silos)))
        rng = np.random.default_rng([self.instruction.seed, server_round, 0xFED5C])
        chosen = sorted(rng.choice(len(silos), size=k, replace=False))
        return [silos[i] for i in chosen]

    def alpha(self, server_round: int) -> float:
        if not self.sharing or not self.cache:
            return 1.0
        total = self.instruction.total_rounds
        return fedsc.alpha_schedule(server_round, total, start=self.alpha_start, end=self.alpha_end)

    def silo_lr(self, server_round: int) -> float:
        """The silos' lr in `server_round`: the cosine schedule, or constant when the server's Adam takes the steps."""
        if self.server_optimizer.kind == "adam":
            return self.instruction.lr
        return cosine_lr(self.instruction.lr, server_round, self.instruction.total_rounds)

    def round_server_lr(self, server_round: int) -> float:
        """The server optimizer's lr in `server_round` (cosine; unused by "avg")."""
        return cosine_lr(self.server_lr, server_round, self.instruction.total_rounds)

    def round_lr(self, server_round: int) -> float:
        """The lr of `server_round` in result.json: the one that takes the step (the server's with FedAdam)."""
        if self.server_optimizer.kind == "adam":
            return self.round_server_lr(server_round)
        return self.silo_lr(server_round)

    def _instruction(self, server_round: int, alpha: float) -> msg.TrainInstruction:
        return self.instruction.model_copy(
            update={
                "server_round": server_round,
                "alpha": alpha,
                "lr": self.silo_lr(server_round),
                "planned_shares": self.planned_shares,
            }
        )

    # -- the correlation share (before the train message) ----------------------------------------------------------
    def before_train(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> None:
        """In a sharing round, the participants' correlation matrices into the cache (`share`)."""
        if self.sharing and server_round in self.share_rounds:
            self.share(grid, server_round, arrays, list(self.participants(server_round)))

    def share(self, grid: Grid, server_round: int, arrays: ArrayRecord, silos: list[SiloEntry]) -> None:
        """Collect the participants' DP correlation matrices into the cache (all checked before any is kept)."""
        h = self.instruction.projection_dim
        config = self._instruction(server_round, 1.0).to_config_record()
        messages = [
            Message(
                RecordDict({msg.MODEL: arrays, msg.CONFIG: config}),
                e.node_id,
                msg.CORRELATION,
                group_id=str(server_round),
            )
            for e in silos
        ]
        replies = grid.send_and_receive(messages, timeout=self.timeout)
        received: dict[int, tuple[np.ndarray, msg.CorrelationReport]] = {}
        for entry, reply in collect_replies(
            Federation(tuple(silos)), server_round, replies, "correlation", self.timeout
        ):
            what = f"correlation reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {msg.CORRELATION_MATRIX, msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.CorrelationReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            self._check_count(report.num_examples, entry.info.n_train, entry, what)
            matrix = msg.check_arrays(
                reply.content, msg.CORRELATION_MATRIX, [("R", (h, h))], dtype="float64", what=what
            )["R"]
            received[entry.info.silo_id] = (matrix, report)
        n_train = {e.info.silo_id: e.info.n_train for e in silos}
        for silo_id, (matrix, report) in received.items():
            # under add/remove the silo releases its noised sum / q; R~_j divides it by the public n_j here
            self.cache[silo_id] = normalize_release(
                matrix, self.instruction.calr_relation, self.instruction.calr_sampling_rate, n_train[silo_id]
            )
            self.shared_in[silo_id] = server_round
            self.shares[silo_id] = report.shares
            self.correlation_epsilon[silo_id] = report.epsilon_spent
            self.noise_std[silo_id] = report.noise_std

    def entries_used(self) -> dict[int, np.ndarray]:
        """The cache entries Rbar_{-j} is made of: all of them ("keep"), or those of the latest sharing round
        ("drop"; with participation 1 that is all of them)."""
        if self.stale_shares == "keep" or not self.shared_in:
            return self.cache
        latest = max(self.shared_in.values())
        return {j: r for j, r in self.cache.items() if self.shared_in.get(j) == latest}

    def others_for(self, silo_ids: list[int]) -> dict[int, np.ndarray]:
        """Rbar_{-j} of each silo from :meth:`entries_used`: one aggregate per round, q_j normalised over the entries
        used (as `fedsc.aggregate` weighs them); a silo with no other entry there gets the whole cache's."""
        used = self.entries_used()
        out = self._others_over(used, [j for j in silo_ids if j in used]) if len(used) >= 2 else {}
        rest = [j for j in silo_ids if j not in out]
        return out | (self._others_over(self.cache, rest) if rest else {})

    def _others_over(self, entries: dict[int, np.ndarray], silo_ids: list[int]) -> dict[int, np.ndarray]:
        """Rbar_{-j} of each of `silo_ids` (all in `entries`) from `entries`, q_j normalised over them."""
        total = fedsc.aggregate(entries, self.weights)
        q = fedsc.normalize_weights(self.weights, list(entries))
        return {j: fedsc.others(total, entries[j], q[j]) for j in silo_ids}

    # -- the train message and its replies --------------------------------------------------------------------------
    def initial_arrays(self) -> ArrayRecord:
        return msg.arrays_record(self.initial)

    def train_instruction(self, server_round: int) -> ConfigRecord:
        """The round's instruction: alpha_t (after this round's share), the silos' lr, the planned shares."""
        return self._instruction(server_round, self.alpha(server_round)).to_config_record()

    def silo_records(self, server_round: int, silos) -> dict[int, dict[str, ArrayRecord]]:
        """FedSC: each participant's Rbar_{-j} (zeros before the first share, when alpha = 1 ignores it)."""
        if not self.sharing:
            return {}
        h = self.instruction.projection_dim
        others = self.others_for([e.info.silo_id for e in silos]) if self.cache else {}
        return {
            e.node_id: {msg.OTHERS: msg.arrays_record({"R": others.get(e.info.silo_id, np.zeros((h, h)))})}
            for e in silos
        }

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        """The participants' n_j-weighted mean, or FedAdam's step along it."""
        total = sum(e.info.n_train for e, _, _ in updates)
        weights = [e.info.n_train / total for e, _, _ in updates]
        mean = {name: weighted_sum(weights, updates, msg.UPDATE, name) for name, _ in self.param_spec}
        self.alphas.append(self.alpha(server_round))
        return self.server_optimizer.step(current, mean, self.round_server_lr(server_round))

    def aggregate_train(self, server_round: int, replies) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The shared aggregation; the round's epsilon is the largest any silo reported with its correlation share
        (none while no silo has shared: FedAvg+SC)."""
        arrays, _ = super().aggregate_train(server_round, replies)
        spent = list(self.correlation_epsilon.values())
        return arrays, MetricRecord({"epsilon-spent": max(spent)}) if spent else None

    def evaluate_round(
        self, grid: Grid, record: RoundRecord, arrays: ArrayRecord, *, final: bool, config, timeout: float
    ) -> None:
        """Central evaluation: the linear probe after the last round, the kNN monitor before; none without an
        evaluator."""
        if self.evaluator is None:
            return
        model = self.read_model(arrays)
        record.evaluation = self.evaluator.final(model) if final else self.evaluator.monitor(model)

    # -- state ------------------------------------------------------------------------------------------------------
    def result_state(self) -> dict[str, object]:
        return {
            "sharing": self.sharing,
            "share_rounds": sorted(self.share_rounds) if self.sharing else [],
            "planned_shares": self.planned_shares,
            "shares": {str(k): v for k, v in self.shares.items()},
            "correlation_epsilon": {str(k): _json_float(v) for k, v in self.correlation_epsilon.items()},
            "noise_std": {str(k): v for k, v in self.noise_std.items()},
            "alphas": list(self.alphas),
            "participation": self.participation,
            "stale_shares": self.stale_shares,
            "server_optimizer": self.server_optimizer.kind,
        }

    def _cache_arrays(self) -> dict[str, np.ndarray]:
        """The cache and what came with it, one row per silo in id order (`cached`: the silos with an entry; NaN,
        or round 0, where none), and the alphas so far (NaN for the rounds to come)."""
        ids = [e.info.silo_id for e in self.federation.silos]
        h = self.instruction.projection_dim
        alphas = np.full(self.instruction.total_rounds, np.nan)
        alphas[: len(self.alphas)] = self.alphas
        return {
            "cached": np.array([j in self.cache for j in ids], dtype=bool),
            "correlation": np.stack([self.cache.get(j, np.zeros((h, h))) for j in ids]).astype(np.float64, copy=False),
            "shares": np.array([self.shares[j] for j in ids], dtype=np.int64),
            "shared_in": np.array([self.shared_in.get(j, 0) for j in ids], dtype=np.int64),
            "correlation_epsilon": np.array([self.correlation_epsilon.get(j, np.nan) for j in ids], dtype=np.float64),
            "noise_std": np.array([self.noise_std.get(j, np.nan) for j in ids], dtype=np.float64),
            "alphas": alphas,
        }

    def state_arrays(self) -> dict[str, np.ndarray]:
        """What the next round needs beyond the model: the cache (`_cache_arrays`) and FedAdam's moments."""
        adam = {ADAM_PREFIX + k: v for k, v in self.server_optimizer.state_arrays().items()}
        return self._cache_arrays() | adam

    def restore_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Put back :meth:`state_arrays` of a checkpoint; RoundError if they do not fit this run (silos, H, model,
        optimizer), before anything is restored."""
        adam = {k.removeprefix(ADAM_PREFIX): v for k, v in arrays.items() if k.startswith(ADAM_PREFIX)}
        own = {k: v for k, v in arrays.items() if not k.startswith(ADAM_PREFIX)}
        check_state_arrays(type(self).__name__, own, self._cache_arrays())
        try:
            self.server_optimizer.restore(adam, self.param_spec)
        except ValueError as exc:
            raise RoundError(f"checkpoint: {exc}") from None
        ids = [e.info.silo_id for e in self.federation.silos]
        rows = [i for i, cached in enumerate(own["cached"]) if cached]
        # id order, the order of the first share (every silo): `fedsc.aggregate` sums the cache in this order
        self.cache = {ids[i]: own["correlation"][i].copy() for i in rows}
        self.shares = {j: int(v) for j, v in zip(ids, own["shares"], strict=True)}
        self.shared_in = {ids[i]: int(own["shared_in"][i]) for i in rows}
        self.correlation_epsilon = {ids[i]: float(own["correlation_epsilon"][i]) for i in rows}
        self.noise_std = {ids[i]: float(own["noise_std"][i]) for i in rows}
        self.alphas = [float(a) for a in own["alphas"] if not np.isnan(a)]


def _build(inputs: StrategyInputs, *, sharing: bool) -> FedscStrategy:
    """The backbone + projector as the model; the central evaluator when the server holds the labelled data."""
    from silofl.protocols.models import get_parameters, parameter_spec
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    config, federation = inputs.config, inputs.federation
    try:
        shape = image_shape(federation.info.num_features)
    except ValueError as exc:
        raise ValueError(f"{config.algorithm} needs an image dataset: {exc}") from None
    model = build_ssl_model(
        config.model, shape, projection_dim=config.projection_dim, width=config.width, seed=config.seed
    )
    evaluator = inputs.evaluator  # the ServerApp's (server.ssl_evaluation.central_evaluator): None with eval-data none
    if config.eval_data == "central" and evaluator is None:
        raise ValueError(f"{config.algorithm} with eval-data central needs the server's evaluator (StrategyInputs)")
    schedule = (
        {
            "share_start": config.share_start,
            "share_every": config.share_every,
            "alpha_start": config.alpha_start,
            "alpha_end": config.alpha_end,
            "stale_shares": config.stale_shares,
        }
        if sharing
        else {"share_start": 1, "share_every": 1, "alpha_end": 1.0}
    )
    return FedscStrategy(
        federation,
        parameter_spec(model),
        initial=get_parameters(model),
        participation=config.participation,
        sharing=sharing,
        server_optimizer=config.server_optimizer,
        server_lr=config.server_lr,
        evaluator=evaluator,
        **schedule,
        **inputs.common,
    )


def build_fedsc(inputs: StrategyInputs) -> FedscStrategy:
    """FedSC's server (the `fedsc` registry entry): correlation sharing through DP-CalR, alpha decaying."""
    return _build(inputs, sharing=True)


def build_fedavg_sc(inputs: StrategyInputs) -> FedscStrategy:
    """FedAvg+SC's server (the `fedavg-sc` registry entry): the same training with alpha = 1, nothing shared."""
    return _build(inputs, sharing=False)
