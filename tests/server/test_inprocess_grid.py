"""The in-process Grid delivers messages like Flower's engines do: copies, error replies, per-silo contexts."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from silofl.protocols import messages as msg
from silofl.server.inprocess_grid import InProcessGrid

app = ClientApp()


@app.train()
def _train(message: Message, context: Context) -> Message:
    arrays = message.content[msg.MODEL]
    value = arrays["w"].numpy().copy()
    value += 1.0
    count = int(context.state["calls"]["n"]) + 1 if "calls" in context.state else 1
    context.state["calls"] = ConfigRecord({"n": count})
    reply = RecordDict(
        {
            msg.UPDATE: msg.arrays_record({"w": value}),
            msg.REPORT: ConfigRecord({"partition": context.node_config["partition-id"], "n": count}),
        }
    )
    return Message(reply, reply_to=message)


@app.evaluate()
def _boom(message: Message, context: Context) -> Message:
    raise ValueError("silo exploded")


def _send(grid: InProcessGrid, kind: str, value: float = 0.0) -> list[Message]:
    content = RecordDict({msg.MODEL: msg.arrays_record({"w": np.full(2, value, np.float32)})})
    return list(grid.send_and_receive([Message(content, node, kind, group_id="1") for node in grid.get_node_ids()]))


def test_each_silo_has_its_own_persistent_context() -> None:
    grid = InProcessGrid(app, 3)
    _send(grid, "train")
    replies = _send(grid, "train")
    parts = sorted(int(r.content[msg.REPORT]["partition"]) for r in replies)
    assert parts == [0, 1, 2]
    assert all(int(r.content[msg.REPORT]["n"]) == 2 for r in replies)
    assert {r.metadata.src_node_id for r in replies} == set(grid.get_node_ids())


def test_replies_are_matched_and_carry_results() -> None:
    grid = InProcessGrid(app, 2)
    replies = _send(grid, "train", 1.5)
    assert all(np.array_equal(r.content[msg.UPDATE]["w"].numpy(), [2.5, 2.5]) for r in replies)
    assert all(r.metadata.reply_to_message_id for r in replies)


def test_exception_in_client_becomes_error_reply() -> None:
    grid = InProcessGrid(app, 2)
    replies = _send(grid, "evaluate")
    assert len(replies) == 2 and all(r.has_error() for r in replies)
    assert "silo exploded" in replies[0].error.reason


def test_message_to_unknown_node_is_refused() -> None:
    grid = InProcessGrid(app, 1)
    content = RecordDict({msg.MODEL: msg.arrays_record({"w": np.zeros(2, np.float32)})})
    with pytest.raises(ValueError, match="unknown node 7"):
        grid.push_messages([Message(content, 7, "train", group_id="1")])


def test_node_configs_are_merged_with_partition_ids() -> None:
    grid = InProcessGrid(app, 2, node_configs=[{"epsilon-budget": 1.0}, {}])
    ctx = grid.context(next(iter(grid.get_node_ids())))
    assert ctx.node_config["partition-id"] == 0 and ctx.node_config["epsilon-budget"] == 1.0


def test_copy_content_shares_nothing_mutable() -> None:
    from flwr.app import MetricRecord

    from silofl.server.inprocess_grid import copy_content

    original = RecordDict(
        {
            msg.MODEL: msg.arrays_record({"w": np.arange(3, dtype=np.float32)}),
            msg.CONFIG: ConfigRecord({"names": ["a", "b"], "x": 1}),
            msg.REPORT: MetricRecord({"m": [1.0, 2.0]}),
        }
    )
    clone = copy_content(original)
    clone[msg.MODEL]["w"] = msg.arrays_record({"w": np.zeros(3, np.float32)})["w"]
    clone[msg.CONFIG]["names"].append("c")
    clone[msg.REPORT]["m"].append(3.0)
    value = clone[msg.MODEL]["w"].numpy()
    value += 1
    assert np.array_equal(original[msg.MODEL]["w"].numpy(), [0, 1, 2])
    assert original[msg.CONFIG]["names"] == ["a", "b"] and original[msg.REPORT]["m"] == [1.0, 2.0]
