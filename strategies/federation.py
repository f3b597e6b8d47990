"""The federation a run runs on and what the run records: the nodes that answered the setup round, each round's
record, the run's history, and the error that refuses a round.

:class:`Federation` is built once from the setup round's replies and checked there (one schema, one kind of node, no
id twice); every strategy sums its silos' replies in its sorted order. :class:`RoundRecord` is one row of result.json's
`rounds`; :class:`RunHistory` is what the round loop (:meth:`strategies.base.SiloflStrategy.start`) returns and what a
server checkpoint holds. :class:`RoundError` is raised for anything that stops a round, naming the silo and the
round; the server's state stays that of the last good round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from silofl.protocols import messages as msg


class RoundError(RuntimeError):
    """A round could not be completed; the message names the silo(s) and the round. State is that of the last round."""


@dataclass(frozen=True)
class SiloEntry:
    """One silo of the federation: the Flower node it runs on and what it said about itself at setup."""

    node_id: int
    info: msg.SiloInfo

    @property
    def kind(self) -> str:
        """The node's kind in messages: "silo", "features party" or "sensitive party"."""
        return "silo" if self.info.role == "silo" else f"{self.info.role} party"

    @property
    def name(self) -> str:
        return f"{self.kind} {self.info.silo_id} (node {self.node_id})"


@dataclass(frozen=True)
class Federation:
    """The nodes of a run, sorted by id: the silos (or feature parties), which train, and the separate sensitive
    parties of a topology (`protocols.parties`; none when silos hold both divisions). Sorted order is the order every
    aggregate is summed in, for reproducibility."""

    silos: tuple[SiloEntry, ...]
    sensitive: tuple[SiloEntry, ...] = ()

    def __post_init__(self) -> None:
        if not self.silos:
            raise RoundError("no silo (or feature party) answered the setup round")
        first = self.silos[0].info
        for entry in (*self.silos[1:], *self.sensitive):
            if entry.info.schema_hash != first.schema_hash:
                raise RoundError(
                    f"{entry.name} describes its data differently from {self.silos[0].name} (features, labels or "
                    "sensitive groups differ): every node must be prepared with the same schema"
                )
        roles = {e.info.role for e in self.silos}
        if len(roles) > 1:
            raise RoundError(
                "the federation mixes silos (both divisions on one node) and feature parties: "
                + ", ".join(f"node {e.node_id} is a {e.info.role}" for e in self.silos)
                + "; start every node with the same kind of data"
            )
        if self.sensitive and roles != {"features"}:
            raise RoundError("sensitive parties need feature parties beside them, not silos")
        if roles == {"features"} and not self.sensitive:
            raise RoundError(
                "feature parties answered but no sensitive party: the sensitive attributes are held by none; start "
                "the sensitive party (role 'sensitive')"
            )
        for group in (self.silos, self.sensitive):
            ids = [e.info.silo_id for e in group]
            if len(set(ids)) != len(ids):
                raise RoundError(f"two nodes claim the same {group[0].kind} id: {', '.join(e.name for e in group)}")

    @property
    def info(self) -> msg.SiloInfo:
        return self.silos[0].info

    @property
    def n_train(self) -> int:
        return sum(e.info.n_train for e in self.silos)

    @property
    def by_node(self) -> dict[int, SiloEntry]:
        return {e.node_id: e for e in (*self.silos, *self.sensitive)}


@dataclass
class RoundRecord:
    """What the server learned in one round (one row of `rounds` in result.json)."""

    server_round: int
    seconds: float
    lr: float | None = None
    epsilon_spent: float | None = None
    evaluation: dict[str, float] | None = None
    #: The summed (group, label, prediction) test counts of this round's evaluation (not in `to_json`: result.json
    #: reports the last one as `fairness_groups`; not kept in checkpoints).
    counts: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: silo id -> the noise std of its evaluation counts this round (0: exact; `client.noised_evaluation`); None when
    #: unknown (no evaluation, a strategy that does not record it, a round read back from a checkpoint)
    evaluation_noise: dict[int, float] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"round": self.server_round, "seconds": self.seconds}
        if self.lr is not None:
            out["lr"] = self.lr
        if self.epsilon_spent is not None:
            out["epsilon_spent"] = _json_float(self.epsilon_spent)
        if self.evaluation is not None:
            out.update(self.evaluation)
        return out


@dataclass
class RunHistory:
    """The result of `start`: final arrays, per-round records, per-silo privacy reports."""

    arrays: ArrayRecord
    rounds: list[RoundRecord] = field(default_factory=list)
    silo_reports: dict[int, msg.TrainReport] = field(default_factory=dict)
    server_state: dict[str, object] = field(default_factory=dict)

    @property
    def last_evaluation(self) -> dict[str, float] | None:
        for record in reversed(self.rounds):
            if record.evaluation is not None:
                return record.evaluation
        return None

    @property
    def last_evaluation_counts(self) -> np.ndarray | None:
        """The summed test counts ``(groups, labels, labels)`` of the last evaluation (None if it did not keep them)."""
        for record in reversed(self.rounds):
            if record.evaluation is not None:
                return record.counts
        return None


def _json_float(value: float) -> float | str:
    return "inf" if math.isinf(value) else value
