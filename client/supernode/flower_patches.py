"""The patches of Flower's SuperNode loop (`flwr.supernode.start_client_internal`) in this process.

Why (docs/DEPLOYMENT.md, "Cost of a round"): Flower 1.39's SuperNode sleeps 3 s after every pull that finds no
message and in 0.5 s steps while it waits for the ClientApp's reply (:class:`PollClock` makes them backing-off
polls, :func:`install_poll_patches`); an object pulled before it has been uploaded is retried after 1 s, 2 s, 4 s
... (:func:`shorten_object_pulls`: within milliseconds); and a message whose run stops while it is received leaves
a task that hangs the node (:func:`drop_messages_of_stopped_runs`). Every function patched here is fingerprinted
(:mod:`silofl.client.supernode.flower_check`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from silofl.client.supernode.backoff import FLOWER_IDLE_SLEEP, FLOWER_REPLY_SLEEP, IDLE_PULL, REPLY_WAIT, Backoff

__all__ = [
    "OBJECT_PULL_RETRY",
    "PollClock",
    "RunStoppedWhileReceiving",
    "drop_messages_of_stopped_runs",
    "install_poll_patches",
    "shorten_object_pulls",
]

#: Retries of an object that is not there yet (Flower: after 1 s, doubling to 10 s, 500 tries): after 5 ms, doubling
#: to 0.5 s, with as many tries as keep Flower's patience (its 2 h `max_time` still bounds every pull).
OBJECT_PULL_RETRY = {"initial_backoff": 0.005, "backoff_cap": 0.5, "max_tries_per_object": 20_000}


def shorten_object_pulls() -> None:
    """Retry an object that is not available yet after milliseconds, not Flower's 1 s, 2 s, 4 s (this process).

    A message's header travels before its objects (the arrays): Flower's SuperLink hands a message to a SuperNode
    while the ServerApp still uploads its arrays, a SuperNode creates the ClientApp's task before it has pulled the
    arrays, the ServerApp sees a reply before the SuperNode has pushed its arrays. A pull that comes that early waits
    1 s (then 2 s, 4 s ...) in Flower's `pull_objects`, which its slow polls rarely hit and fast ones always do.
    Idempotent; changes only the keyword defaults of Flower's two pull functions, which every caller uses."""
    utils = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    for function in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        function.__kwdefaults__.update(OBJECT_PULL_RETRY)


class PollClock:
    """Stands in for the `time` module inside `flwr.supernode.start_client_internal`, which only calls
    `time.sleep`: Flower's idle sleep (3 s) becomes :data:`IDLE_PULL`'s step after the last message handled, its
    reply-wait step (0.5 s) :data:`REPLY_WAIT`'s step after the wait began; any other call is the real `time`'s."""

    def __init__(
        self, idle: Backoff = IDLE_PULL, reply: Backoff = REPLY_WAIT, *, sleep=time.sleep, clock=time.monotonic
    ):
        self._idle, self._reply = idle, reply
        self._sleep, self._clock = sleep, clock
        self._last_message = self._wait_started = clock()

    def message_handled(self) -> None:
        """A message arrived or a reply went out: the next one is likely soon, poll fast again."""
        self._last_message = self._clock()

    def reply_wait_started(self) -> None:
        self._wait_started = self._clock()

    def sleep(self, seconds: float) -> None:
        now = self._clock()
        if seconds == FLOWER_IDLE_SLEEP:
            self._sleep(self._idle.step(now - self._last_message))
        elif seconds == FLOWER_REPLY_SLEEP:
            self._sleep(self._reply.step(now - self._wait_started))
        else:
            self._sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def install_poll_patches(clock: PollClock, on_first_pull: Callable[[], None] | None = None) -> None:
    """Give Flower's SuperNode loop `clock` for its sleeps, and tell `clock` when a message came and a reply left.

    `on_first_pull` runs once, when the SuperNode first polls the SuperLink (it has connected and been accepted)."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")

    pull, push = sci._pull_and_store_message, sci._push_messages
    first = [on_first_pull]

    def pull_and_store_message(*args: Any, **kwargs: Any) -> int | None:
        if first[0] is not None:
            callback, first[0] = first[0], None
            callback()
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            clock.message_handled()
        return run_id

    def push_messages(*args: Any, **kwargs: Any) -> None:
        clock.reply_wait_started()
        try:
            push(*args, **kwargs)
        finally:
            clock.message_handled()

    sci._pull_and_store_message = drop_messages_of_stopped_runs(pull_and_store_message)
    sci._push_messages = push_messages
    sci.time = clock  # type: ignore[assignment]  # the module's only use of `time` is time.sleep


class RunStoppedWhileReceiving(RuntimeError):
    """The SuperLink said a message's run is no longer running while this SuperNode was pulling the message's
    objects or confirming it (:func:`drop_messages_of_stopped_runs`)."""


def _run_stopped_is_an_error(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, raising :class:`RunStoppedWhileReceiving` (an Exception) where it raised Flower's
    `RunNotRunningException` (a BaseException)."""
    from flwr.supercore.run import RunNotRunningException

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except RunNotRunningException:
            raise RunStoppedWhileReceiving(
                "its run is no longer running on the SuperLink (stopped, or ended while the SuperLink was away): "
                "the message is dropped and never answered"
            ) from None

    return call


def drop_messages_of_stopped_runs(pull_and_store: Callable[..., int | None]) -> Callable[..., int | None]:
    """Wrap Flower's `_pull_and_store_message` so that a message whose run stops while it is received is dropped.

    Flower 1.39 creates the message's task and stores the message *before* pulling its objects; when the SuperLink
    then answers that the run is not running (a SuperLink restarted mid-run hands out the stopped run's last
    message), Flower's `RunNotRunningException`, a BaseException, passes its `except Exception` cleanup: the task
    stays pending with objects that never arrive. The ClientApp worker takes that task first (the oldest), waits for
    its objects for ever, and the SuperNode, which handles one message at a time, waits for its reply: the node never
    answers again (seen in tests/system/test_deploy_faults.py's SuperLink-kill test). Raised as an Exception instead,
    the same failure takes Flower's own cleanup path (message and objects deleted, task finished as failed)."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    sci.pull_objects = getattr(sci, "_silofl_pull_objects", sci.pull_objects)
    sci._silofl_pull_objects = sci.pull_objects  # Flower's, so that installing twice does not wrap twice
    sci.pull_objects = _run_stopped_is_an_error(sci.pull_objects)

    def pull_and_store_message(*args: Any, **kwargs: Any) -> int | None:
        if "confirm_message_received" in kwargs:  # passed by keyword by start_client_internal (fingerprinted)
            kwargs["confirm_message_received"] = _run_stopped_is_an_error(kwargs["confirm_message_received"])
        return pull_and_store(*args, **kwargs)

    return pull_and_store_message
