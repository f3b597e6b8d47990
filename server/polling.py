"""The ServerApp's side of a deployed round without Flower's 3 s pulls: `send_and_receive` over the public
`push_messages` / `pull_messages`, polling for the replies with a short interval that backs off while they take long.

Flower 1.39's deployment Grid (`flwr.superlink.grid.http_grid.HttpGrid`, what `flwr run` against a SuperLink hands
the ServerApp) pulls the replies of a round every 3 s, so a round costs at least 3 s whatever the silos do.
:class:`PollingGrid` wraps that Grid and keeps everything but `send_and_receive`: the messages are pushed exactly as
before, and the replies pulled until all have come or `timeout` runs out, with the same result (the replies that
came, in the order they came); only the pauses between pulls change: :data:`REPLY_POLL` waits a small share of the
time already waited (a reply that takes 20 ms is seen within a few ms, one that takes 60 s within a second).

:func:`polling_grid` wraps a Flower deployment Grid and returns any other Grid (the in-process engine, Ray
simulation's) as it is: their numbers and timing are not touched. The strategies keep calling
`grid.send_and_receive`; nothing else changes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from logging import INFO
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log as flower_log

from silofl.client.supernode.backoff import Backoff  # the SuperNode's backing-off poll; stdlib-only at import

__all__ = ["REPLY_POLL", "WAITING_LOG_EVERY", "PollingGrid", "bounded_object_pulls", "polling_grid"]


#: The ServerApp's pulls of a round's replies (HTTP to the SuperLink's local Runtime API).
REPLY_POLL = Backoff(floor=0.005, cap=1.0, ratio=0.1)
#: The least time a pull of a reply's objects is given, even when the round's timeout is (nearly) spent.
MIN_OBJECT_PULL = 1.0
#: While replies are missing, the ServerApp's log says every this many seconds which nodes it still waits for.
WAITING_LOG_EVERY = 30.0


class PollingGrid(Grid):
    """A Flower Grid whose `send_and_receive` pushes, then pulls with :data:`REPLY_POLL`'s pauses; every other
    method (and attribute) is the wrapped Grid's."""

    def __init__(
        self,
        grid: Grid,
        poll: Backoff = REPLY_POLL,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[..., None] | None = None,
    ) -> None:
        self._grid = grid
        self._poll = poll
        self._sleep, self._clock = sleep, clock
        self._log = log or flower_log

    @property
    def wrapped(self) -> Grid:
        """The Flower Grid underneath."""
        return self._grid

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push `messages`, then pull their replies until all have come or `timeout` seconds have passed (None:
        no limit), as Flower's `send_and_receive` does, with short pauses that grow with the wait."""
        messages = list(messages)
        destinations = [m.metadata.dst_node_id for m in messages]
        ids = list(self._grid.push_messages(messages))
        node_of = dict(zip(ids, destinations, strict=True))
        pending = set(ids)
        del messages
        start = self._clock()
        told = start
        replies: list[Message] = []
        while timeout is None or self._clock() - start < timeout:
            left = None if timeout is None else max(MIN_OBJECT_PULL, timeout - (self._clock() - start))
            with bounded_object_pulls(left):
                got = list(self._grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending:
                break
            waited = self._clock() - start
            if self._clock() - told >= WAITING_LOG_EVERY:
                told = self._clock()
                self._log(
                    INFO,
                    "silofl: waiting %.0f s so far%s for the replies of nodes %s (%d of %d answered); a node that "
                    "lost its SuperLink answers once it has reconnected",
                    waited,
                    "" if timeout is None else f" (at most {timeout:.0f} s)",
                    sorted({node_of[i] for i in pending}),
                    len(ids) - len(pending),
                    len(ids),
                )
            pause = self._poll.step(waited)
            if timeout is not None:
                pause = min(pause, max(0.0, timeout - waited))
            self._sleep(pause)
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


@contextlib.contextmanager
def bounded_object_pulls(max_time: float | None) -> Iterator[None]:
    """Within the block, this process's pulls of a message's objects give up after `max_time` s (None: Flower's own
    limit, 2 h): the objects of a reply whose SuperNode died while pushing it never come, and Flower's Grid would wait
    for them far past the round's timeout. A reply whose objects did not come in time becomes Flower's error reply
    ("Reply message objects are unavailable", from the SuperLink's node), which the round then names as the silo's
    missing reply (`strategies.replies.collect_replies`)."""
    if max_time is None:
        yield
        return
    from flwr.supercore.inflatable import inflatable_utils

    defaults = inflatable_utils.pull_objects.__kwdefaults__
    before = defaults["max_time"]
    defaults["max_time"] = max_time if before is None else min(before, max_time)
    try:
        yield
    finally:
        defaults["max_time"] = before


def polling_grid(grid: Grid) -> Grid:
    """`grid` wrapped in a :class:`PollingGrid` if it is Flower's deployment Grid (whose `send_and_receive`
    sleeps 3 s between pulls); any other Grid unchanged.

    With a Flower version that the SuperNode runtime was checked against (:mod:`client.supernode.flower_check`),
    this process's object pulls also retry within milliseconds
    (:func:`client.supernode.flower_patches.shorten_object_pulls`: a reply seen before its arrays were uploaded
    otherwise costs 1 s); with another version the pulls stay Flower's, and a warning says so.
    """
    from flwr.superlink.grid.http_grid import HttpGrid

    if not (isinstance(grid, HttpGrid) and type(grid).send_and_receive is HttpGrid.send_and_receive):
        return grid
    from silofl.client.supernode.flower_check import FlowerChangedError, check_flower
    from silofl.client.supernode.flower_patches import shorten_object_pulls

    try:
        check_flower()
    except FlowerChangedError as exc:
        from logging import WARNING

        from flwr.supercore import log

        log(WARNING, "silofl: replies' arrays pulled with Flower's retries (1 s and more): %s", exc)
    else:
        shorten_object_pulls()
    return PollingGrid(grid)
