"""An in-process engine: a Flower :class:`~flwr.serverapp.Grid` that hands each message straight to the ClientApp.

Ray simulation pays ~200 ms per round in Flower's polling (`InMemoryGrid.pull_interval` = 0.1 s, twice per round) and a
deployment on Flower's own runtime ~6 s (docs/DEPLOYMENT.md, "Cost of a round in deployment"). SteFFLe and DP-mu2-FL
take one step per round, so tests and sweeps run the very same ServerApp, strategies and ClientApp through this Grid
instead: no threads, no polling, no serialization shortcuts in the apps themselves. Each simulated silo has its own
:class:`~flwr.app.Context` (node config with `partition-id` and `num-partitions`, exactly as Flower's simulation engine
sets them, and a persistent `state`).

Fidelity choices:
* the content is copied on the way in and out (Flower serializes messages; a ClientApp must not be able to mutate the
  server's arrays, nor the other way round);
* an exception in the ClientApp becomes an error reply (`Message(Error(...), reply_to=...)`), as in Flower's engines;
* the run identity (`TaskIdentity`) is set the way `run_simulation` sets it, because Flower 1.39's strategies and the
  `Message` constructor read it.

Faults (tests/system/test_faults.py): :meth:`InProcessGrid.restart_silo` gives a silo a fresh Context, as a restarted
SuperNode has (Flower keeps `context.state` in the SuperNode's memory); with `enforce_timeout=True`,
`send_and_receive` delivers each message in a worker thread and gives up on a silo that has not answered within the
round's `timeout`, as Flower's engines do (a stalled silo's reply is then missing; its thread finishes in the
background and its late reply is dropped). Silos still run one after the other (they share cached model shells), so
each gets the whole timeout from the moment its message is delivered, as parallel silos would. Off by default: silos
then run on the server's thread, which keeps runs bit for bit reproducible and free of thread overhead.
"""

from __future__ import annotations

import copy
import itertools
import secrets
import threading
import traceback
from collections.abc import Iterable, Mapping
from uuid import uuid4

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from silofl.protocols.party_keys import PARTY_SECRET_KEY

#: Flower's error code for an exception raised inside a ClientApp.
CLIENT_APP_RAISED_EXCEPTION = 0
SUPERLINK_NODE_ID = 1


class InProcessGrid(Grid):
    """Deliver messages synchronously to `client_app`, one Context per simulated silo."""

    def __init__(
        self,
        client_app: ClientApp,
        num_silos: int,
        *,
        node_configs: Iterable[Mapping[str, str | int | float | bool]] | None = None,
        run_id: int = 1,
        copy_messages: bool = True,
        enforce_timeout: bool = False,
    ) -> None:
        if num_silos < 1:
            raise ValueError(f"num_silos must be >= 1, got {num_silos}")
        self._client_app = client_app
        self._run = Run.create_empty(run_id=run_id)
        self._run.primary_task_id = 1
        configs = list(node_configs) if node_configs is not None else [{} for _ in range(num_silos)]
        if len(configs) != num_silos:
            raise ValueError(f"got {len(configs)} node configs for {num_silos} silos")
        self._run_id = run_id
        self._contexts: dict[int, Context] = {}
        # the simulated parties' shared secret, from which each derives its keys for the sealed record exchange
        # (`protocols.party_keys.simulated_keys`): in their node configs only, never the ServerApp's
        party_secret = {PARTY_SECRET_KEY: secrets.token_bytes(32).hex()}
        for partition_id, extra in enumerate(configs):
            node_id = 1000 + partition_id  # stable ids, distinct from the SuperLink's
            node_config = {"partition-id": partition_id, "num-partitions": num_silos, **party_secret, **extra}
            self._contexts[node_id] = self._fresh_context(node_id, node_config)
        self._replies: dict[str, Message] = {}
        self._copy = copy_messages
        self._enforce_timeout = enforce_timeout
        self._timeout: float | None = None
        self._counter = itertools.count()
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    # -- Grid API -------------------------------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def context(self, node_id: int) -> Context:
        """The persistent Context of one simulated silo (for tests and inspection)."""
        return self._contexts[node_id]

    def restart_silo(self, node_id: int) -> None:
        """Restart one simulated silo: same node id and node config, an empty `context.state` (what a SuperNode
        restart leaves: Flower keeps the state in memory). What the silo kept in its `state-dir` survives."""
        old = self._contexts[node_id]
        self._contexts[node_id] = self._fresh_context(node_id, dict(old.node_config))

    def silo_states(self) -> dict[int, dict[str, object]]:
        """What each simulated silo without a `state-dir` holds in `context.state` (its ledger, calibration, ...),
        by partition id, for the server's checkpoint (:mod:`server.checkpoint`); the data spec and a sensitive party's
        sealed records (exchanged again when the run resumes) are left out.

        In simulation the server and the silos are one process and die together: a snapshot of both after the same
        round is a consistent state of the whole federation, from which a restarted process continues. The records
        are referenced, not copied: silofl replaces a state record, it never changes one in place."""
        from silofl.client.party_exchange import SEALED_KEY
        from silofl.client.privacy_state import DATA_SPEC_KEY, STATE_DIR_KEY

        skip = (DATA_SPEC_KEY, SEALED_KEY)  # the sealed records: received again when a run resumes
        return {
            int(ctx.node_config["partition-id"]): {k: v for k, v in ctx.state.items() if k not in skip}
            for ctx in self._contexts.values()
            if not ctx.node_config.get(STATE_DIR_KEY)
        }

    def restore_silo_states(self, states: Mapping[int, Mapping[str, object]]) -> None:
        """Put back :meth:`silo_states` of a checkpoint into the silos of a restarted process."""
        by_partition = {int(ctx.node_config["partition-id"]): ctx for ctx in self._contexts.values()}
        for partition_id, records in states.items():
            if partition_id not in by_partition:
                raise ValueError(f"the checkpoint holds the state of silo partition {partition_id}, not in this grid")
            for name, record in records.items():
                by_partition[partition_id].state[name] = record

    def _fresh_context(self, node_id: int, node_config: dict) -> Context:
        return Context(run_id=self._run_id, node_id=node_id, node_config=node_config, state=RecordDict(), run_config={})

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            node_id = msg.metadata.dst_node_id
            if node_id not in self._contexts:
                raise ValueError(f"message for unknown node {node_id}; nodes: {sorted(self._contexts)}")
            msg_id = f"{next(self._counter)}-{uuid4().hex[:8]}"
            msg.metadata.__dict__["_message_id"] = msg_id
            incoming = Message(
                copy_content(msg.content) if self._copy else msg.content,
                node_id,
                msg.metadata.message_type,
                ttl=msg.metadata.ttl,
                group_id=msg.metadata.group_id,
            )
            incoming.metadata.__dict__["_message_id"] = msg_id
            if self._timeout is not None:
                reply = self._deliver_within(incoming, self._contexts[node_id], self._timeout)
                if reply is None:  # the silo did not answer in time: no reply, as on Flower's engines
                    ids.append(msg_id)
                    continue
            else:
                reply = deliver(self._client_app, incoming, self._contexts[node_id])
            if self._copy and reply.has_content():
                reply = Message(copy_content(reply.content), reply_to=incoming)
            self._replies[msg_id] = reply
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        if self._enforce_timeout and timeout is not None:
            self._timeout = timeout
        try:
            return self.pull_messages(list(self.push_messages(messages)))
        finally:
            self._timeout = None

    def _deliver_within(self, message: Message, context: Context, timeout: float) -> Message | None:
        """Run the ClientApp in a worker thread; its reply, or None if it is not done within `timeout` seconds."""
        box: list[Message] = []
        worker = threading.Thread(
            target=lambda: box.append(deliver(self._client_app, message, context)), name="silo", daemon=True
        )
        worker.start()
        worker.join(timeout)
        return box[0] if box else None


def copy_content(content: RecordDict) -> RecordDict:
    """A copy that shares nothing mutable with `content`, as a serialized message would.

    Records, `Array` objects and lists are copied; `Array` payloads and scalars are immutable and are shared (copying
    them is what made `copy.deepcopy` cost a tenth of a small model's round). Every `Array` and every list goes
    through Flower's item checks again, as on a deserialized message; each `Array` is built once (the
    `ArrayRecord(dict)` constructor would build every one a second time), and a config or metric record's scalars,
    checked when they were set, are not checked again (Flower's per-item type check was ~40% of a copy).
    """
    out = RecordDict()
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            arrays = ArrayRecord()
            for key, a in record.items():
                arrays[key] = Array(a.dtype, tuple(a.shape), a.stype, a.data)
            out[name] = arrays
        elif isinstance(record, ConfigRecord | MetricRecord):
            # Scalars are immutable and were checked by Flower when they were set: shared. Lists are copied and set
            # again, so Flower checks their elements (a list can be changed in place after it was set).
            values = record.copy()
            for key, value in record.items():
                if isinstance(value, list):
                    values[key] = list(value)
            out[name] = values
        else:  # pragma: no cover - RecordDict admits only the three record types
            out[name] = copy.deepcopy(record)
    return out


def deliver(client_app: ClientApp, message: Message, context: Context) -> Message:
    """Run `client_app` on one message; an exception becomes an error reply, as in Flower's engines."""
    try:
        return client_app(message, context)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, ValueError | RuntimeError | FileNotFoundError):  # user-facing errors: message only
            reason += "\n" + traceback.format_exc(limit=5)
        return Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
