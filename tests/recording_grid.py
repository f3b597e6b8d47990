"""The in-process engine keeping every message the server sends and every reply it receives (after the copy a
transport makes): what the server saw, for tests of what leaves a party."""

from __future__ import annotations

from flwr.app import Message

from silofl.server.inprocess_grid import InProcessGrid


class RecordingGrid(InProcessGrid):
    """:class:`server.inprocess_grid.InProcessGrid` with `log`: (message sent, its reply) pairs, in order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[Message, Message]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        by_node = {r.metadata.src_node_id: r for r in replies}
        self.log += [(m, by_node[m.metadata.dst_node_id]) for m in messages if m.metadata.dst_node_id in by_node]
        return replies
