"""SteFFLe's server with separate feature and sensitive parties (SteFFLe Section 4 and Appendix F; the sealed records of
SECURITY.md, "`steffle` with separate parties"): the same SGDA step as
:class:`strategies.steffle.SteffleStrategy`, with two exchanges through the server per round, after the
sealed record exchange of setup (`server.parties.sealed_exchange`: each sensitive party received the features and labels
of the records whose sensitive attribute it holds, encrypted end to end).

1. theta_t, W_t and the prior -> every feature party j; reply: its mean loss gradient g_j and the mean s-independent
   part of the W-gradient, -2 W (.) F_i, over its Poisson sample at q = m / n_j (`client.rounds.steffle_parties`
   `feature_train`: a silo's non-sensitive division).
2. theta_t, W_t and the prior -> every sensitive party; reply: the noised means of the clipped d psi / d theta and of
   the s-dependent d psi / d W over its own secret Poisson sample of the records it received (`sensitive_round`: a
   silo's sensitive division).
3. g and the W part weighted n_j / n, h weighted n_c / n (n_c: the records party c received; they sum to n); then
   theta and W as in the silo mode.

Evaluation: the model to every party; the feature parties send their summed test loss, the sensitive parties their
(group, label, prediction) counts of the test records they received (`client.parties`), exact or noised as each
party's policy says. The server sees no record id, feature, label, output or Jacobian.

The privacy reports of a round are the sensitive parties' (they alone read s and add noise); result.json's
`per_silo` block lists them by party id.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.strategies.federation import RoundError, SiloEntry
from silofl.strategies.replies import (
    Arrays,
    SiloUpdate,
    check_evaluation_counts,
    collect_replies,
    evaluation_metrics,
    weighted_sum,
)
from silofl.strategies.steffle import SteffleStrategy


class SteffleSeparatePartiesStrategy(SteffleStrategy):
    """SteFFLe's server with separate parties: feature parties (`federation.silos`) and sensitive parties
    (`federation.sensitive`) instead of silos holding both divisions.

    SteFFLe (Gupta, Poornash, Lowy, Razaviyayn, 2024), Section 4 and Appendix F. Parameters: those of
    :class:`~strategies.steffle.SteffleStrategy` (the same SGDA step, the same schedule, prior, W shape, radius and
    step size); the federation's `sensitive` entries are the sensitive parties.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._grid: Grid | None = None
        self._sensitive_reports: dict[int, msg.TrainReport] = {}
        self._num_params = sum(int(np.prod(shape)) for _, shape in self.param_spec)
        self._eval_arrays: ArrayRecord | None = None

    # -- step 1: the feature parties ---------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._grid = grid  # step 2 of the round is sent from aggregate_train
        return super().configure_train(server_round, arrays, config, grid)

    def read_update(self, entry: SiloEntry, reply: Message, what: str) -> dict[str, Arrays]:
        msg.check_records(reply.content, {msg.UPDATE, pm.W_BASE, msg.REPORT}, what=what)
        update = msg.check_arrays(reply.content, msg.UPDATE, self.param_spec, what=what)
        w_base = msg.check_arrays(reply.content, pm.W_BASE, [("w", tuple(self.w.shape))], what=what)
        return {msg.UPDATE: update, pm.W_BASE: w_base}

    # -- steps 2 and 3 -----------------------------------------------------------------------------------------------
    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        """Steps 2 and 3: g and the s-independent W part, the feature parties' means weighted n_j / n (as silos'); h,
        the sensitive parties' noised means weighted n_c / n, n_c the records each received (they sum to n)."""
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

    def _sensitive_replies(
        self, server_round: int, content: dict[str, ArrayRecord]
    ) -> list[tuple[SiloEntry, dict[str, np.ndarray], msg.TrainReport]]:
        """`content` + the train instruction to every sensitive party; each reply's checked arrays (theta, w) and
        report, in party-id order; the reports kept for the privacy block. A party reports the records it received (at
        most those it declared)."""
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
            if report.num_examples > entry.info.n_train:
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
        self._grid = grid  # the model to every party: feature parties sum their loss, sensitive ones count
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

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The feature parties' summed test losses (exact or noised), then the sensitive parties' counts of the test
        records they received, predicted by the same model; every test record counted once."""
        if self._grid is None:
            raise RoundError("aggregate_evaluate called before configure_evaluate")
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
        """`records` (the model) + the evaluation instruction to every sensitive party; their
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
