"""SteFFLe's server with separate feature and sensitive parties (../shared/specs/steffle-hybrid.md, "One round";
SteFFLe Section 4 and Appendix F): the same SGDA step as :class:`strategies.noisy_aggregation.NoisyAggregation`,
with two exchanges through the server per round.

1. theta_t -> every feature party j; reply: the mean loss gradient g_j over its Poisson sample J_j (rate
   q_f = m / n_j), and the rows (id, y, F(x_i), J_F(x_i)) of the sampled records (of all, `share-rows = all`;
   `client.rounds.steffle_parties.feature_train`).
2. W_t, the prior and all rows -> EVERY sensitive party, every round; reply: the noised sums of the clipped
   d psi / d theta and of the s-dependent d psi / d W over the ids it holds (pure noise of the same shape if it holds
   none; `client.rounds.steffle_parties.sensitive_round`).
3. g = sum_j (n_j / n) g_j (weighted as the silo mode weights silos);
   h = (sum over c of the noisy sums) / (q_s * the rows sent) (`combine_sensitive_sums` of
   `client.algorithms.steffle_parties`);
   the s-independent part of the W-gradient, -2 W (.) F_i, from the rows (`client.algorithms.steffle.w_gradient_base`,
   the mean over all sampled rows); then theta and W as in the silo mode.

The server needs no map from ids to sensitive parties: it broadcasts. Evaluation: the feature parties send test
predictions (id, y, yhat), the sensitive parties count them by group (`client.parties`).

The privacy reports of a round are the sensitive parties' (they alone read s and add noise); result.json's
`per_silo` block lists them by party id.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from protocols import messages as msg
from protocols import parties as pm
from protocols.ermi import GroupPrior
from strategies.base import (
    Arrays,
    RoundError,
    SiloEntry,
    SiloUpdate,
    check_evaluation_counts,
    collect_replies,
    evaluation_metrics,
    weighted_sum,
)
from strategies.noisy_aggregation import NoisyAggregation
from strategies.party_evaluation import debiased_counts, feature_records, grouped_messages, randomized_groups


class PartiesNoisyAggregation(NoisyAggregation):
    """NoisyAggregation over feature parties (`federation.silos`) and sensitive parties (`federation.sensitive`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._grid: Grid | None = None
        self._sensitive_reports: dict[int, msg.TrainReport] = {}
        self._num_params = sum(int(np.prod(shape)) for _, shape in self.param_spec)
        self._test_ids: list[np.ndarray] | None = None
        self._eval_arrays: ArrayRecord | None = None
        self._group_epsilons: list[float] = []

    # -- step 1: the feature parties ---------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._grid = grid  # step 2 of the round is sent from aggregate_train
        return super().configure_train(server_round, arrays, config, grid)

    @property
    def sealed(self) -> bool:
        """Whether the parties exchanged their records sealed at setup (`share-rows sealed`): the rounds then carry
        the model, W and noised sums only."""
        return self.instruction.share_rows == "sealed"

    def train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        if self.sealed:  # a feature party computes the s-independent part of the W-gradient itself
            return super().train_records(server_round, arrays)
        return {msg.MODEL: arrays}  # W and the prior go to the sensitive parties only

    def read_update(self, entry: SiloEntry, reply: Message, what: str) -> dict[str, Arrays]:
        if self.sealed:
            msg.check_records(reply.content, {msg.UPDATE, pm.W_BASE, msg.REPORT}, what=what)
            update = msg.check_arrays(reply.content, msg.UPDATE, self.param_spec, what=what)
            w_base = msg.check_arrays(reply.content, pm.W_BASE, [("w", tuple(self.w.shape))], what=what)
            return {msg.UPDATE: update, pm.W_BASE: w_base}
        msg.check_records(reply.content, {msg.UPDATE, pm.ROWS, pm.OUTPUTS, msg.REPORT}, what=what)
        info = entry.info
        rows = pm.read_columns(reply.content, pm.ROWS, ("ids", "labels"), max_rows=info.n_train, what=what)
        pm.check_ids(rows["ids"], what)
        if rows["labels"].size and (rows["labels"].min() < 0 or rows["labels"].max() >= info.num_labels):
            raise RoundError(f"{what}: labels outside 0..{info.num_labels - 1}")
        outputs, jacobians = pm.read_outputs(
            reply.content, rows=len(rows["ids"]), num_labels=info.num_labels, num_params=self._num_params, what=what
        )
        update = msg.check_arrays(reply.content, msg.UPDATE, self.param_spec, what=what)
        return {msg.UPDATE: update, pm.ROWS: rows, pm.OUTPUTS: {"outputs": outputs, "jacobians": jacobians}}

    # -- steps 2 and 3 -----------------------------------------------------------------------------------------------
    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        if self.sealed:
            return self._combine_sealed(server_round, current, updates)
        from client.algorithms.steffle import w_gradient_base
        from client.algorithms.steffle_parties import combine_sensitive_sums

        sampled = [len(arrays[pm.ROWS]["ids"]) for _, arrays, _ in updates]
        g = {name: weighted_sum(self.weights, updates, msg.UPDATE, name) for name in current}
        if self.lam == 0:
            return self.sgda_step(server_round, current, g, None, None)
        ids = np.concatenate([arrays[pm.ROWS]["ids"] for _, arrays, _ in updates])
        if np.unique(ids).size != ids.size:
            raise RoundError(f"round {server_round}: two feature parties sampled the same record id")
        labels = np.concatenate([arrays[pm.ROWS]["labels"] for _, arrays, _ in updates])
        outputs = np.concatenate([arrays[pm.OUTPUTS]["outputs"] for _, arrays, _ in updates])
        jacobians = np.concatenate([arrays[pm.OUTPUTS]["jacobians"] for _, arrays, _ in updates])
        sums = self._ask_sensitive(server_round, ids, labels, outputs, jacobians)
        keep_rate = float(self.instruction.keep_rate)
        h_theta, h_w = combine_sensitive_sums(sums, sum(sampled), keep_rate)
        prior = GroupPrior(self.instruction.fairness, self.prior.astype(np.float64), num_labels=self.prior_labels)
        w_base = w_gradient_base(
            torch.from_numpy(outputs).double(), torch.from_numpy(labels), torch.from_numpy(self.w), prior
        )
        h, offset = {}, 0
        for name, shape in self.param_spec:
            size = int(np.prod(shape))
            h[name] = h_theta[offset : offset + size].reshape(shape).numpy()
            offset += size
        return self.sgda_step(server_round, current, g, h, w_base.numpy() + h_w.numpy())

    def _combine_sealed(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        """g and the s-independent W part: the feature parties' means weighted n_j / n (as silos'); h: the sensitive
        parties' noised means weighted n_c / n, n_c the records each received (they sum to n)."""
        g = {name: weighted_sum(self.weights, updates, msg.UPDATE, name) for name in current}
        if self.lam == 0:
            return self.sgda_step(server_round, current, g, None, None)
        w_base = weighted_sum(self.weights, updates, pm.W_BASE, "w")
        content = {
            msg.MODEL: msg.arrays_record(
                {name: np.asarray(value, dtype=np.float32) for name, value in current.items()}
            ),
            msg.FAIRNESS: msg.arrays_record({"w": self.w.astype(np.float32), "prior": self.prior}),
        }
        replies = self._sensitive_replies(server_round, content)
        n = sum(entry.info.n_train for entry in self.federation.silos)
        received = sum(report.num_examples for _, _, report in replies)
        if received != n:
            raise RoundError(
                f"round {server_round}: the sensitive parties answered for {received} records, but the feature "
                f"parties hold {n}; each record counts at the one sensitive party that received it"
            )
        theta = sum(fair["theta"].astype(np.float64) * (report.num_examples / n) for _, fair, report in replies)
        h_w = sum(fair["w"].astype(np.float64) * (report.num_examples / n) for _, fair, report in replies)
        h, offset = {}, 0
        for name, shape in self.param_spec:
            size = int(np.prod(shape))
            h[name] = theta[offset : offset + size].reshape(shape)
            offset += size
        return self.sgda_step(server_round, current, g, h, w_base + h_w)

    @property
    def prior_labels(self) -> int:
        return self.federation.info.num_labels

    def _ask_sensitive(
        self, server_round: int, ids: np.ndarray, labels: np.ndarray, outputs: np.ndarray, jacobians: np.ndarray
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Step 2: every sensitive party's noised sums (float64 tensors), in party-id order; their reports kept."""
        content = {
            msg.FAIRNESS: msg.arrays_record({"w": self.w.astype(np.float32), "prior": self.prior}),
            pm.ROWS: pm.int_record(ids=ids, labels=labels),
            pm.OUTPUTS: msg.arrays_record({"outputs": outputs, "jacobians": jacobians}),
        }
        return [
            (torch.from_numpy(fair["theta"]).double(), torch.from_numpy(fair["w"]).double())
            for _, fair, _ in self._sensitive_replies(server_round, content)
        ]

    def _sensitive_replies(
        self, server_round: int, content: dict[str, ArrayRecord]
    ) -> list[tuple[SiloEntry, dict[str, np.ndarray], msg.TrainReport]]:
        """`content` + the train instruction to every sensitive party; each reply's checked arrays (theta, w) and
        report, in party-id order; the reports kept for the privacy block. With rows (not sealed) a party reports
        its declared records; with sealed records, the records it received (at most those it declared)."""
        if self._grid is None:
            raise RoundError("aggregate_train called before configure_train")
        content = {**content, msg.CONFIG: self.train_instruction(server_round)}
        federation = self.federation
        messages = [
            Message(RecordDict(dict(content)), e.node_id, pm.SENSITIVE_QUERY, group_id=str(server_round))
            for e in federation.sensitive
        ]
        replies = self._grid.send_and_receive(messages, timeout=self.timeout)
        kind = pm.SENSITIVE_QUERY
        spec = [("theta", (self._num_params,)), ("w", tuple(self.w.shape))]
        out, reports = [], {}
        for entry, reply in collect_replies(
            federation, server_round, replies, kind, self.timeout, federation.sensitive
        ):
            what = f"sensitive reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {msg.FAIR_UPDATE, msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            if not self.sealed:
                self._check_count(report.num_examples, entry.info.n_train, entry, what)
            elif report.num_examples > entry.info.n_train:
                raise RoundError(
                    f"{what}: the reply claims {report.num_examples} records, but {entry.name} declared "
                    f"{entry.info.n_train} in the setup round"
                )
            out.append((entry, msg.check_arrays(reply.content, msg.FAIR_UPDATE, spec, what=what), report))
            reports[entry.info.silo_id] = report
        self._sensitive_reports = reports
        return out

    def privacy_reports(self, updates: list[SiloUpdate]) -> dict[int, msg.TrainReport]:
        """The sensitive parties' reports (the feature parties release nothing that depends on s)."""
        return dict(self._sensitive_reports)

    # -- evaluation --------------------------------------------------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._grid = grid
        if self.sealed:  # the model to every party: feature parties sum their loss, sensitive ones count
            self._eval_arrays = arrays
            instruction = self.eval_instruction.model_copy(update={"server_round": server_round}).to_config_record()
            return [
                Message(
                    RecordDict({msg.MODEL: arrays, msg.CONFIG: instruction}),
                    e.node_id,
                    pm.LOSS_QUERY,
                    group_id=f"eval-{server_round}",
                )
                for e in self.federation.silos
            ]
        if not self.grouped_evaluation:
            return super().configure_evaluate(server_round, arrays, config, grid)
        instruction = self.eval_instruction.model_copy(update={"server_round": server_round})
        if self._test_ids is None:  # asked once per run (also a resumed one): the ids are not private here
            records = feature_records(grid, self.federation, instruction, self.timeout)
            self._test_ids = [r["test"]["ids"] for r in records]
        rows, self._group_epsilons = randomized_groups(grid, self.federation, instruction, self.timeout)
        return grouped_messages(
            self.federation, self._test_ids, rows, arrays, instruction.to_config_record(), server_round
        )

    @property
    def grouped_evaluation(self) -> bool:
        """Whether a feature party answers evaluations noised (its setup said so): then every feature party counts
        its test records by the sensitive parties' randomized groups (`strategies.party_evaluation`). Not with
        sealed records: the sensitive parties count them, noised if a feature party's policy says so."""
        return not self.sealed and any(e.info.evaluation == "noised" for e in self.federation.silos)

    def _aggregate_grouped(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """The feature parties' counts by (source, randomized group, label, prediction), summed and debiased."""
        info = self.federation.info
        shape = (len(self.federation.sensitive), info.num_groups, info.num_labels, info.num_labels)
        total, loss_sum, n, noise = self.summed_evaluations(server_round, replies, shape)
        estimated = debiased_counts(total, self._group_epsilons)
        self._eval_counts = estimated
        self.evaluation_noise = noise  # set only once every reply passed its checks
        return evaluation_metrics(estimated, loss_sum, n)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The feature parties' predictions, counted by group at the sensitive parties; every test record counted
        once. With a feature party answering noised: their counts by randomized group, debiased."""
        if self._grid is None:
            raise RoundError("aggregate_evaluate called before configure_evaluate")
        if self.grouped_evaluation:
            return self._aggregate_grouped(server_round, replies)
        if self.sealed:
            return self._aggregate_sealed(server_round, replies)
        columns, loss_sum, n = [], 0.0, 0
        for entry, reply in self._collect(server_round, replies, "evaluate"):
            what = f"evaluate reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {pm.ROWS, msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            self._check_count(report.num_examples, entry.info.n_test, entry, what, split="test")
            rows = pm.read_columns(
                reply.content, pm.ROWS, ("ids", "labels", "predictions"), max_rows=entry.info.n_test, what=what
            )
            if len(rows["ids"]) != report.num_examples:
                raise RoundError(f"{what}: {len(rows['ids'])} predictions for num-examples={report.num_examples}")
            columns.append(rows)
            loss_sum += report.loss_sum
            n += report.num_examples
        rows = {key: np.concatenate([c[key] for c in columns]) for key in ("ids", "labels", "predictions")}
        return self._counted(server_round, {pm.ROWS: pm.int_record(**rows)}, loss_sum, n)

    def _aggregate_sealed(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """The feature parties' summed test losses (exact or noised), then the sensitive parties' counts of the test
        records they received, predicted by the same model."""
        loss_sum, n, noise = 0.0, 0, {}
        for entry, reply in self._collect(server_round, replies, pm.LOSS_QUERY):
            what = f"loss reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            self._check_count(report.num_examples, entry.info.n_test, entry, what, split="test")
            loss_sum += report.loss_sum
            n += report.num_examples
            noise[entry.info.silo_id] = report.noise_std
        metrics = self._counted(server_round, {msg.MODEL: self._eval_arrays}, loss_sum, n)
        self.evaluation_noise = noise  # the loss's; the counts' noise is logged by _counted
        return metrics

    def _counted(self, server_round: int, records: dict[str, ArrayRecord], loss_sum: float, n: int) -> MetricRecord:
        """`records` (the predictions, or the model) + the evaluation instruction to every sensitive party; their
        (group, label, prediction) counts summed, every one of the n test records counted once; the metrics."""
        info = self.federation.info
        instruction = self.eval_instruction.model_copy(update={"server_round": server_round}).to_config_record()
        content = {**records, msg.CONFIG: instruction}
        messages = [
            Message(RecordDict(dict(content)), e.node_id, pm.CONFUSION, group_id=f"eval-{server_round}")
            for e in self.federation.sensitive
        ]
        replies = self._grid.send_and_receive(messages, timeout=self.timeout)
        shape = (info.num_groups, info.num_labels, info.num_labels)
        total = np.zeros(shape, dtype=np.int64)
        counted, noised = 0, []
        for entry, reply in collect_replies(
            self.federation, server_round, replies, pm.CONFUSION, self.timeout, self.federation.sensitive
        ):
            what = f"confusion reply from {entry.name} in round {server_round}"
            msg.check_records(reply.content, {msg.COUNTS, msg.REPORT}, what=what)
            report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT, what=what)
            self._check_identity(report.silo_id, report.server_round, entry, server_round, what)
            counts = msg.check_arrays(reply.content, msg.COUNTS, [("counts", shape)], dtype="int64", what=what)[
                "counts"
            ]
            check_evaluation_counts(counts, report, what)  # exact: they sum to num-examples; noised: within the noise
            if report.noise_std > 0:
                noised.append(entry.name)
            total += counts
            counted += report.num_examples
        if noised:
            log(
                INFO,
                "round %d: the confusion counts of %s are noised (their policies)",
                server_round,
                ", ".join(noised),
            )
        if counted != n:
            raise RoundError(
                f"round {server_round}: the sensitive parties counted {counted} of the {n} test predictions; "
                "every test record's sensitive value must be held by exactly one sensitive party"
            )
        self._eval_counts = total
        return evaluation_metrics(total, loss_sum, n)
