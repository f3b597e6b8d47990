"""Small factories shared by the tests: objects several test modules build the same way, with their defaults.

Import them as `from tests.factories import ...`.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context, Message, RecordDict

from silofl.protocols import messages as msg
from silofl.protocols.config import RunConfig


def silo_info(silo_id: int, n_train: int, **fields: Any) -> msg.SiloInfo:
    """The SiloInfo a silo of a small synthetic federation reports at setup: silo `silo_id` with `n_train` training
    records, role "silo", dataset "t", 2 features, 2 labels ("0", "1"), 2 groups ("a", "b"), 4 test records,
    schema hash "abc", exact evaluation; `fields` override any of these."""
    values: dict[str, Any] = {
        "silo_id": silo_id,
        "role": "silo",
        "dataset": "t",
        "num_features": 2,
        "num_labels": 2,
        "num_groups": 2,
        "n_train": n_train,
        "n_test": 4,
        "schema_hash": "abc",
        "label_names": ("0", "1"),
        "group_names": ("a", "b"),
        "evaluation": "exact",
    } | fields
    return msg.SiloInfo(**values)


#: The data a silo of `silo_context()` loads at setup unless a test sends another: the synthetic set in 2 silos, seed 0.
SYNTHETIC_SPEC = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0)


def silo_context(partition: int = 0, *, state: RecordDict | None = None, **node_config: Any) -> Context:
    """The Flower Context of a real silo (run 1, node 5): partition `partition` of 2, `node_config` added to the
    node config, and a copy of `state` (default: a fresh, empty state) as its state."""
    from silofl.server.inprocess_grid import copy_content

    return Context(
        run_id=1,
        node_id=5,
        node_config={"partition-id": partition, "num-partitions": 2, **node_config},
        state=copy_content(state) if state is not None else RecordDict(),
        run_config={},
    )


def deliver_to_silo(context: Context, content: RecordDict, kind: str, server_round: int = 1) -> Message:
    """The real ClientApp's reply to a Message of type `kind` holding `content`, sent to node 5 in group
    `server_round` (default 1) with message id "m" (an exception in the ClientApp becomes an error reply)."""
    from silofl.client.app import app
    from silofl.server.inprocess_grid import deliver

    message = Message(content, 5, kind, group_id=str(server_round))
    message.metadata.__dict__["_message_id"] = "m"
    return deliver(app, message, context)


def setup_silo(context: Context, spec: msg.DataSpec = SYNTHETIC_SPEC) -> msg.SiloInfo:
    """Set the silo of `context` up with the data of `spec` (default SYNTHETIC_SPEC) and return the SiloInfo it
    reports."""
    reply = deliver_to_silo(context, RecordDict({msg.CONFIG: spec.to_config_record()}), msg.SETUP)
    return msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)


def steffle_config(**extra: Any) -> RunConfig:
    """A small SteFFLe run (`RunConfig.parse`): the synthetic set in 3 silos (or 3 feature parties), 4 rounds,
    evaluated every 2, epsilon 1; `extra` (kebab-case keys, e.g. ``topology="divided"``) overrides or adds keys."""
    values = {
        "algorithm": "steffle",
        "dataset": "synthetic",
        "num-silos": 3,
        "rounds": 4,
        "eval-every": 2,
        "epsilon": 1.0,
    } | extra
    return RunConfig.parse(values)


def every_algorithms_keys(config: dict) -> dict:
    """`config` as result.json files of versions before the algorithm registry stored it: every key of every
    algorithm (here each algorithm's default), the run's own values over them."""
    from silofl.protocols import algorithms
    from silofl.server.plots.runs import config_defaults

    return {k: v for name in algorithms.names() for k, v in config_defaults(name).items()} | config


def copy_message(message: Message) -> Message:
    """A copy of `message` to deliver to a second (twin) silo: its content deep-copied, the same destination node,
    message type, group id and message id."""
    from silofl.server.inprocess_grid import copy_content

    twin = type(message)(
        copy_content(message.content),
        message.metadata.dst_node_id,
        message.metadata.message_type,
        group_id=message.metadata.group_id,
    )
    twin.metadata.__dict__["_message_id"] = message.metadata.message_id
    return twin
