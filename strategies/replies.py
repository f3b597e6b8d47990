"""Collecting and checking the silos' replies, and what the server computes from them.

The server checks every reply on receipt: :func:`collect_replies` matches the replies of a round to the nodes asked
(an error reply, an unknown sender, a duplicate or a missing node refuses the round, naming the silo), and
:func:`check_evaluation_counts` checks a silo's evaluation counts. :func:`weighted_sum` sums the checked replies in
silo-id order and :func:`evaluation_metrics` turns the summed evaluation counts into the run's metrics. The shared
round loop (:class:`strategies.base.SiloflStrategy`) and the strategies with exchanges of their own use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import Message, MetricRecord
from flwr.common.constant import SUPERLINK_NODE_ID

from silofl.protocols import messages as msg
from silofl.protocols.fairness_metrics import fairness_from_counts
from silofl.strategies.federation import Federation, RoundError, SiloEntry

Arrays = dict[str, np.ndarray]
#: One silo's checked train reply: who sent it, its array records by name, its report.
SiloUpdate = tuple[SiloEntry, dict[str, Arrays], msg.TrainReport]


def weighted_sum(weights: Sequence[float], updates: list[SiloUpdate], record: str, name: str) -> np.ndarray:
    """sum_j w_j * (array `name` of record `record` of silo j), in float64, in the given (silo-id) order."""
    return sum(
        (w * arrays[record][name].astype(np.float64) for w, (_, arrays, _) in zip(weights, updates, strict=True)),
        start=np.zeros((), dtype=np.float64),
    )


def superlink_error(reply: Message) -> str | None:
    """The reason, if `reply` is an error the SuperLink wrote itself in place of a node's reply (Flower 1.39: source
    node SUPERLINK_NODE_ID, e.g. "Node Unavailable" for a SuperNode that stopped sending heartbeats); else None."""
    if reply.metadata.src_node_id != SUPERLINK_NODE_ID or not reply.has_error():
        return None
    return str(reply.error.reason)


def collect_replies(
    federation: Federation,
    server_round: int,
    replies: Iterable[Message],
    kind: str,
    timeout: float,
    entries: Sequence[SiloEntry] | None = None,
) -> list[tuple[SiloEntry, Message]]:
    """Match replies to the nodes asked (`entries`; default the silos); refuse the round on an error reply, an
    unknown sender, a duplicate or a missing node.

    Returned in id order so that every sum is taken in the same order on every engine.
    """
    asked = tuple(federation.silos if entries is None else entries)
    by_node = {e.node_id: e for e in asked}
    got: dict[int, Message] = {}
    unreachable: list[str] = []
    for reply in replies:
        node = reply.metadata.src_node_id
        entry = by_node.get(node)
        if entry is None and (reason := superlink_error(reply)) is not None:
            unreachable.append(reason)
            continue
        if entry is None:
            raise RoundError(
                f"round {server_round}: a {kind} reply came from node {node}, which was not asked "
                f"(asked: {sorted(by_node)})"
            )
        if reply.has_error():
            raise RoundError(f"{entry.name} failed in round {server_round} ({kind}): {reply.error.reason}")
        if node in got:
            raise RoundError(f"{entry.name} answered twice in round {server_round} ({kind})")
        got[node] = reply
    missing = [e.name for e in asked if e.node_id not in got]
    if missing and unreachable:
        raise RoundError(
            f"round {server_round} ({kind}): no reply from {', '.join(missing)}; the SuperLink reports "
            f"{'; '.join(sorted(set(unreachable)))!r}; start it again (a `silofl deploy up` federation: `silofl "
            "deploy restart --dir DIR`), then continue the run with resume=true; the server's model is kept as of "
            "the previous round"
        )
    if missing:
        raise RoundError(
            f"round {server_round} ({kind}): no reply from {', '.join(missing)} within {timeout:g} s; the "
            "server's model is kept as of the previous round"
        )
    return [(e, got[e.node_id]) for e in asked]


#: The most a noised count may exceed the test split's size, in noise standard deviations (a Gaussian draw beyond it
#: has probability below 1e-20: a silo claiming it is not adding the noise it reports).
NOISED_COUNT_SLACK = 10.0


def check_evaluation_counts(c: np.ndarray, report: msg.EvaluateReport, what: str) -> None:
    """Exact counts (``noise_std`` 0) are non-negative and sum to num-examples; a noised evaluation's counts
    (`client.noised_evaluation`: rounded, clipped at 0) are non-negative and each within the noise of the split."""
    if report.noise_std == 0.0:
        # Each count is at most num-examples, so the int64 sum cannot wrap around.
        if (c < 0).any() or (c > report.num_examples).any() or int(c.sum()) != report.num_examples:
            raise RoundError(f"{what}: counts must be non-negative and sum to num-examples={report.num_examples}")
        return
    limit = report.num_examples + NOISED_COUNT_SLACK * report.noise_std + 1
    if (c < 0).any() or (c > limit).any():
        raise RoundError(
            f"{what}: noised counts (noise std {report.noise_std:g}) must be non-negative and at most "
            f"num-examples + {NOISED_COUNT_SLACK:g} std = {limit:g}"
        )


def evaluation_metrics(counts: np.ndarray, loss_sum: float, n: int) -> MetricRecord:
    """A federated evaluation's metrics from the summed (group, label, prediction) counts and losses."""
    fair = fairness_from_counts(counts)
    return MetricRecord(
        {
            "accuracy": fair.accuracy,
            "error": fair.error,
            "loss": loss_sum / max(n, 1),
            "dp_violation": fair.dp_violation,
            "eo_violation": fair.eo_violation,
            "eopp_violation": fair.eopp_violation,
            "num_examples": n,
        }
    )
