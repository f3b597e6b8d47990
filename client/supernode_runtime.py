"""A silo's SuperNode with short, backing-off polls and one long-lived ClientApp process: the only module that
reaches into Flower's internals, checked against the Flower versions in :data:`CHECKED_FLOWER_VERSIONS`.

Why. A deployed round of Flower 1.39 costs seconds that no app can save (docs/DEPLOYMENT.md, "Cost of a round"):

* the SuperNode sleeps 3 s after every pull that finds no message, and in 0.5 s steps while it waits for the
  ClientApp's reply (`flwr.supernode.start_client_internal`, `time.sleep(3)` / `time.sleep(0.5)`, no option);
* every message starts a fresh `flwr-clientapp` process (through a SuperExec that polls every 1 s) which imports
  Flower, torch and the app again, three at once on a small machine;
* an object (an array) pulled before it has been uploaded is retried after 1 s, 2 s, 4 s ... (Flower's
  `pull_objects`), which fast polls hit on every message: a message's header travels before its arrays.

What. Two entry points, both run as ``python -m silofl.client.supernode_runtime ...`` (`silofl silo start` builds the
command, :func:`client.silo_cli.supernode_command`):

``supernode [--clientapp-process long-lived|per-message] FLOWER-SUPERNODE-ARGS``
    Flower's own `flower-supernode` (same arguments, same process, same exit codes) with its two sleeps replaced by
    short polls that back off while nothing happens (:class:`PollClock`): a SuperNode that has just handled a
    message polls every few milliseconds, an idle one every 3 s at most, as Flower's does. It runs in Flower's
    ``--isolation process`` mode and starts the ClientApp worker below next to it once it has been accepted by the
    SuperLink, restarting it if it dies (:class:`_WorkerSupervisor`).

``clientapp --runtime-api-address HOST:PORT [--parent-pid PID] [--per-message]``
    The ClientApp worker: what Flower's SuperExec and ``flwr-clientapp`` do. It acquires the SuperNode's pending
    ClientApp tasks over the SuperNode's Runtime API (the API a separately started process uses in ``--isolation
    process`` mode) and answers each exactly as ``flwr-clientapp`` does
    (:func:`flwr.supernode.runtime.run_clientapp.run_clientapp`): the task's Message, Context, Run and FAB pulled
    with the task's own token, the app loaded from the installed FAB, the reply and the updated Context pushed back,
    a failure reported as Flower's error reply. By default (``long-lived``) every task is answered in the worker
    itself: the process start, the imports (Flower, torch, the app) and loading the app are paid once, not per
    message. The Context still lives in the SuperNode and travels with every task, as in Flower; a task for another
    FAB (a new version of the app) makes the worker replace itself with a fresh interpreter (``exec``) before it
    touches that task, so that two apps' code never share a process. With ``--per-message`` the worker starts a
    fresh process for each task (``clientapp --single-task``), as Flower's SuperExec does (to compare, or for a
    site that wants a process per message).

Every process of this module (and the ServerApp, :func:`server.polling.polling_grid`) also retries early object
pulls within milliseconds (:func:`shorten_object_pulls`).

The SuperNode also says in its log, naming the SuperLink's address, when it loses the SuperLink and when it has it
back (:class:`LinkWatch`), and, when the SuperLink no longer knows its key (a SuperLink restarted without its
database forgets every registration), what to do: Flower 1.39 itself only logs "Connection attempt failed, retrying
in N seconds" and, when the SuperLink refuses the node, "SuperNode terminated gracefully.".

Everything here depends on Flower's private functions named in :data:`_FINGERPRINTED`: :func:`check_flower` refuses to
run on a Flower whose version is not in :data:`CHECKED_FLOWER_VERSIONS` or whose sources of those functions differ
from the ones checked (sha256 of their source), naming the fix (`silofl silo start --runtime flower` runs Flower's
stock SuperNode). `tests/test_supernode_runtime.py` fails the same way when Flower changes under this module.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHECKED_FLOWER_VERSIONS",
    "CLIENTAPP_PROCESS_MODES",
    "Backoff",
    "FlowerChangedError",
    "LinkWatch",
    "PollClock",
    "check_flower",
    "main",
    "serve_clientapps",
    "supernode_main",
]

#: Flower versions whose internals this module was checked against (their sources' fingerprints below).
CHECKED_FLOWER_VERSIONS: tuple[str, ...] = ("1.39.0",)

#: sha256 of the source of every Flower function whose behaviour this module relies on or mirrors, as of the
#: versions above. `python -m silofl.client.supernode_runtime fingerprints` prints the installed Flower's.
_FINGERPRINTED: dict[str, str] = {
    # the SuperNode's main loop: `time.sleep(3)` after an empty pull, `_pull_and_store_message` returning None when
    # nothing came, `_push_messages` after a message; runtime_api_address and isolation passed by keyword
    "flwr.supernode.start_client_internal:start_client_internal": (
        "bb3df95a5f63b9849fef3ba5fac74c1d01677207e268c37d6895fb6d14399eff"
    ),
    "flwr.supernode.start_client_internal:_pull_and_store_message": (
        "eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be"
    ),
    # `time.sleep(0.5)` while waiting for the ClientApp's reply and for its objects
    "flwr.supernode.start_client_internal:_push_messages": (
        "5f09f2f7a86ced070a9cb343920c8e3ba0c20fda956e7b6d2088965b428f42d2"
    ),
    # calls `start_client_internal` (imported by name into its module) after starting the Runtime API
    "flwr.supernode.cli.flower_supernode:flower_supernode": (
        "e6c32050e07cf3aa3df198b97346adeac80b501b87d051c31470ff69da321286"
    ),
    # one task of a ClientApp process: what `_ClientAppWorker.run_task` does, step by step
    "flwr.supernode.runtime.run_clientapp:run_clientapp": (
        "0df7b3272ecdc6e6b52fa24a72d6e394c42a412ebed0cfbad31990e7abebf59b"
    ),
    "flwr.supernode.runtime.run_clientapp:pull_task_input": (
        "5607a23e1673ee876930c1b35685b8dfdfd8b3776a436560b0467042e15fc695"
    ),
    "flwr.supernode.runtime.run_clientapp:push_message": (
        "07cb512c93e065a93a4cba3facc7d37dd99758c56835065a63fdfbfc604dcd8a"
    ),
    "flwr.supernode.runtime.run_clientapp:push_task_output": (
        "9206407456e79e17338d367de7c21e2d840d939de378c03ac61da6cc2b57a3c6"
    ),
    # object pulls retried after 1 s, 2 s, 4 s ... (keyword defaults that `shorten_object_pulls` lowers); their
    # callers use the defaults: the SuperNode's pull from the SuperLink, the ClientApp's from the SuperNode, and the
    # ServerApp's Grid's from the SuperLink
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": (
        "31bb2de46b450e6acfadb7a8bb15e3f2074bb112199826a40a5eaa648bad5b2b"
    ),
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": (
        "139811483a15e4a6c1f8523614c12f28dd3049194e5713816be0931387adb1cf"
    ),
    "flwr.superlink.grid.http_grid:HttpGrid.pull_messages": (
        "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83"
    ),
    # the task heartbeat the worker sends as `_heartbeat_fn` (Flower's, minus the SIGINT on a refused one)
    "flwr.supercore.heartbeat:make_task_heartbeat_fn_http": (
        "a50247986fc79b04c5f3a555d3d6eaf6b72fd72d43d0753103f9b68c43ed0326"
    ),
    # the SuperExec's loop (AcquireTask, launch) that the worker's loop replaces
    "flwr.supercore.superexec.run_superexec:run_superexec": (
        "0cc169d016ac4b3bfe8ddebe9a2ac9a70849828b5e8aaa74e6bda68e1f357fb9"
    ),
    "flwr.supercore.servicer.runtime.runtime_handlers:acquire_task": (
        "e3701406b5547001d679f65d5aeb1ebdaf1e53a680fca9e39455d55ea3b0e003"
    ),
    # the Fleet connection's RetryInvoker that `LinkWatch` hooks: made by `_make_fleet_connection_retry_invoker`
    # (looked up by name in `_init_connection`) from `make_simple_grpc_retry_invoker`, which retries UNAVAILABLE at
    # most MAX_RETRY_DELAY (20 s) apart and stops the SuperNode (SIGINT) on UNAUTHENTICATED
    "flwr.supernode.start_client_internal:_init_connection": (
        "1393636f81d05d40b32e380bee2039a9ddd1bb5b94052e6c9350f6a3b09e0c8c"
    ),
    "flwr.supernode.start_client_internal:_make_fleet_connection_retry_invoker": (
        "2723add5e3c66c5ead5f81adb8690f2ba430c138da662ed11daa8cb3a9c3a280"
    ),
    # opens the Fleet channel with `grpc.secure_channel` / `grpc.insecure_channel(..., options=...)`, looked up on the
    # module's `grpc` (which `install_fast_reconnect` replaces), called by name from the grpc_rere connection
    "flwr.supercore.grpc:create_channel": "6d71819bdc98bae2041f4670b4403968bbd2b598b54a344054f76accf47094fc",
    "flwr.supercore.retry.grpc_retry:make_simple_grpc_retry_invoker": (
        "261143c8938e2b35478aae49b6f20311af6cd608d384fbb4ded6e4184ae3836d"
    ),
}

CLIENTAPP_PROCESS_MODES: tuple[str, ...] = ("long-lived", "per-message")

# The two sleeps of Flower's SuperNode loop that PollClock replaces (in seconds, as written in Flower's source).
FLOWER_IDLE_SLEEP = 3
FLOWER_REPLY_SLEEP = 0.5

#: This module as `python -m` names it (``__name__`` is ``__main__`` when it runs that way).
MODULE = "silofl.client.supernode_runtime"


def _log(level: int, text: str, *args: Any, exc_info: BaseException | None = None) -> None:
    """Into Flower's log (the SuperNode's output), as Flower's own messages."""
    from flwr.supercore import log

    log(level, text, *args, exc_info=exc_info)


class FlowerChangedError(RuntimeError):
    """The installed Flower is not one this module was checked against; the message names the fix."""


@dataclass(frozen=True)
class Backoff:
    """A poll interval that grows with the time already waited: `ratio` of it, between `floor` and `cap` seconds.

    Waiting `w` seconds for something that then arrives costs at most `ratio * w + floor` extra: a few milliseconds
    while messages flow, and an idle poller wakes at most every `cap` seconds (about log(cap/floor)/ratio polls to
    get there, then one per `cap`)."""

    floor: float
    cap: float
    ratio: float = 0.1

    def __post_init__(self) -> None:
        if not (0 < self.floor <= self.cap) or not self.ratio > 0:
            raise ValueError(f"Backoff needs 0 < floor <= cap and ratio > 0, got {self}")

    def step(self, waited: float) -> float:
        """Seconds to sleep before the next poll, after `waited` seconds of waiting."""
        return min(self.cap, max(self.floor, self.ratio * waited))


#: SuperNode -> SuperLink pulls (gRPC, TLS, a signed request each): backing off to Flower's own 3 s when idle.
IDLE_PULL = Backoff(floor=0.01, cap=3.0, ratio=0.1)
#: SuperNode waiting for its ClientApp's reply (in-memory state, no I/O): Flower's step of 0.5 s as the cap.
REPLY_WAIT = Backoff(floor=0.002, cap=FLOWER_REPLY_SLEEP, ratio=0.1)
#: The ClientApp worker asking its SuperNode for a task (local HTTP): Flower's SuperExec default of 1 s as the cap.
TASK_POLL = Backoff(floor=0.005, cap=1.0, ratio=0.1)

#: Retries of an object that is not there yet (Flower: after 1 s, doubling to 10 s, 500 tries): after 5 ms, doubling
#: to 0.5 s, with as many tries as keep Flower's patience (its 2 h `max_time` still bounds every pull).
OBJECT_PULL_RETRY = {"initial_backoff": 0.005, "backoff_cap": 0.5, "max_tries_per_object": 20_000}


# -- the Flower check ----------------------------------------------------------------------------------------------


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def fingerprints() -> dict[str, str]:
    """sha256 of the installed Flower's source of every function in :data:`_FINGERPRINTED`."""
    return {ref: hashlib.sha256(inspect.getsource(_resolve(ref)).encode()).hexdigest() for ref in _FINGERPRINTED}


def check_flower() -> None:
    """FlowerChangedError unless the installed Flower is one this module was checked against (version and the
    sources of the functions it relies on)."""
    from flwr.supercore.version import package_version

    fix = (
        "silofl's fast SuperNode runtime (client/supernode_runtime.py) was checked against flwr "
        f"{', '.join(CHECKED_FLOWER_VERSIONS)}; install that (`pip install flwr=={CHECKED_FLOWER_VERSIONS[-1]}`) or "
        "start Flower's stock SuperNode with `silofl silo start --runtime flower` (slower rounds)"
    )
    if package_version not in CHECKED_FLOWER_VERSIONS:
        raise FlowerChangedError(f"flwr {package_version} is installed; {fix}")
    try:
        found = fingerprints()
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        raise FlowerChangedError(
            f"flwr {package_version}: a function this module relies on is gone ({exc}); {fix}"
        ) from None
    changed = sorted(ref for ref, digest in found.items() if digest != _FINGERPRINTED[ref])
    if changed:
        raise FlowerChangedError(f"flwr {package_version}: the source of {', '.join(changed)} differs; {fix}")


# -- object pulls ------------------------------------------------------------------------------------------------


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


# -- the SuperNode's polls -----------------------------------------------------------------------------------------


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
    answers again (seen in tests/test_deploy_faults.py's SuperLink-kill test). Raised as an Exception instead, the
    same failure takes Flower's own cleanup path (message and objects deleted, task finished as failed)."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    sci.pull_objects = getattr(sci, "_silofl_pull_objects", sci.pull_objects)
    sci._silofl_pull_objects = sci.pull_objects  # Flower's, so that installing twice does not wrap twice
    sci.pull_objects = _run_stopped_is_an_error(sci.pull_objects)

    def pull_and_store_message(*args: Any, **kwargs: Any) -> int | None:
        if "confirm_message_received" in kwargs:  # passed by keyword by start_client_internal (fingerprinted)
            kwargs["confirm_message_received"] = _run_stopped_is_an_error(kwargs["confirm_message_received"])
        return pull_and_store(*args, **kwargs)

    return pull_and_store_message


# -- the SuperNode's link to its SuperLink ---------------------------------------------------------------------------

#: Flower 1.39's longest pause between two attempts to reach the SuperLink (`flwr.common.constant.MAX_RETRY_DELAY`).
MAX_RECONNECT_PAUSE = 20
#: What Flower's SuperLink answers (UNAUTHENTICATED) to a node whose key it does not know (any more).
UNKNOWN_NODE_DETAIL = "Invalid node ID"


class LinkWatch:
    """Says in the SuperNode's log, naming the SuperLink, what happens to the link and what the operator can do.

    Hooked into the RetryInvoker of the SuperNode's Fleet connection (:meth:`install`), which every call to the
    SuperLink goes through (pulls, pushes, heartbeats): the first failed call of a streak logs that the SuperLink is
    lost (or not reachable yet) and that the node keeps retrying; the first successful call after it logs that it is
    back and after how long; an UNAUTHENTICATED answer logs that the SuperLink refuses this node, and with Flower's
    "Invalid node ID" that it no longer knows this node's key, and how to register it again (Flower then stops the
    SuperNode: "SuperNode terminated gracefully.")."""

    def __init__(
        self, address: str, *, log: Callable[..., None] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.address = address
        self._log, self._clock = log or _log, clock
        self._lock = threading.Lock()
        self._connected = False  # a call to the SuperLink has succeeded since this SuperNode started
        self._lost_since: float | None = None
        self._refused = False  # the refusal was logged: the calls still under way when Flower stops are refused too

    def install(self, invoker: Any) -> Any:
        """Chain this watch's hooks before `invoker`'s own (Flower's logs and give-up rules are kept); `invoker`."""
        on_backoff, on_success, should_giveup = invoker.on_backoff, invoker.on_success, invoker.should_giveup

        def backoff(state: Any) -> None:
            self.failed(state.exception)
            if on_backoff is not None:
                on_backoff(state)

        def success(state: Any) -> None:
            self.succeeded()
            if on_success is not None:
                on_success(state)

        def giveup(exc: Exception) -> bool:
            self.refused(exc)
            return bool(should_giveup(exc)) if should_giveup is not None else False

        invoker.on_backoff, invoker.on_success, invoker.should_giveup = backoff, success, giveup
        return invoker

    @staticmethod
    def _describe(exc: BaseException | None) -> str:
        code = getattr(exc, "code", None)
        details = getattr(exc, "details", None)
        if callable(code):
            text = str(code())
            if callable(details) and details():
                text += f": {details()}"
            return text
        return repr(exc)

    def failed(self, exc: BaseException | None) -> None:
        """A call to the SuperLink failed and will be retried: say so once per streak of failures."""
        with self._lock:
            if self._lost_since is not None:
                return
            self._lost_since = self._clock()
            connected = self._connected
        what = "lost the SuperLink" if connected else "cannot reach the SuperLink"
        self._log(
            logging.WARNING,
            "silofl SuperNode: %s at %s (%s); retrying, at most %d s apart, until it answers. A SuperLink restarted "
            "with its database (`flower-superlink --database FILE`, as `silofl deploy up` starts it) still knows "
            "this node, which then reconnects by itself; if it stays away, start it again (`silofl deploy restart "
            "--dir DIR` for a `silofl deploy up` federation)",
            what,
            self.address,
            self._describe(exc),
            MAX_RECONNECT_PAUSE,
        )

    def succeeded(self) -> None:
        """A call to the SuperLink succeeded: if calls had failed, say that the link is back."""
        with self._lock:
            self._connected = True
            since, self._lost_since = self._lost_since, None
        if since is not None:
            self._log(
                logging.INFO,
                "silofl SuperNode: reconnected to the SuperLink at %s after %.1f s",
                self.address,
                self._clock() - since,
            )

    def refused(self, exc: BaseException) -> None:
        """Called for every failed call before Flower decides whether to retry it: an UNAUTHENTICATED answer (on
        which Flower stops the SuperNode) is logged with what to do, once."""
        code = getattr(exc, "code", None)
        if not callable(code) or getattr(code(), "name", "") != "UNAUTHENTICATED":
            return
        with self._lock:
            if self._refused:
                return
            self._refused = True
        details = getattr(exc, "details", None)
        detail = str(details() if callable(details) else "")
        if UNKNOWN_NODE_DETAIL in detail:
            self._log(
                logging.ERROR,
                "silofl SuperNode: the SuperLink at %s no longer knows this node's key (%s): it was restarted "
                "without its database (`--database`), or the key was unregistered. This SuperNode stops. Register "
                "the key again on the SuperLink: `flwr supernode register NODE.pub CONNECTION` (NODE.pub: this "
                "node's public key), then start this node again with the same command and state-dir (`silofl "
                "deploy restart --dir DIR` for a `silofl deploy up` federation)",
                self.address,
                detail,
            )
        else:
            self._log(
                logging.ERROR,
                "silofl SuperNode: the SuperLink at %s refuses this node (UNAUTHENTICATED: %s). This SuperNode "
                "stops; check its key and the clocks of both hosts, then start it again",
                self.address,
                detail,
            )


#: gRPC channel arguments of the SuperNode's Fleet connection. gRPC's own defaults pause a channel's reconnection
#: attempts 1 s, 1.6 s, 2.6 s ... up to 120 s (+-20 %) apart, and a call made during a pause fails at once with the
#: last error ("Connection refused") without trying: measured with grpcio 1.85, a channel whose server was away 80 s
#: reconnected 27 s after it came back (2.5 s with these), and after a longer outage up to 2.4 min. Flower's retries
#: (at most :data:`MAX_RECONNECT_PAUSE` s apart) already pace the calls; with these, each of its retries really tries.
FAST_RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class _GrpcWithChannelOptions:
    """Stands in for the `grpc` module inside `flwr.supercore.grpc`: `secure_channel` and `insecure_channel` get
    `options` plus :data:`FAST_RECONNECT_OPTIONS`; everything else is the real module's."""

    def __init__(self, module: Any, options: Sequence[tuple[str, int]]) -> None:
        self._module, self._options = module, tuple(options)

    def _with_options(self, make: Callable[..., Any]) -> Callable[..., Any]:
        def channel(*args: Any, options: Sequence[tuple[str, Any]] | None = None, **kwargs: Any) -> Any:
            given = list(options or [])
            names = {name for name, _ in given}
            return make(*args, options=given + [o for o in self._options if o[0] not in names], **kwargs)

        return channel

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._module, name)
        return self._with_options(found) if name in ("secure_channel", "insecure_channel") else found


def install_fast_reconnect(options: Sequence[tuple[str, int]] = FAST_RECONNECT_OPTIONS) -> None:
    """Give every channel Flower's `create_channel` opens in this process (the SuperNode's Fleet connection) short
    reconnection pauses (:data:`FAST_RECONNECT_OPTIONS`), so that a SuperNode has its SuperLink back within seconds
    of its return, however long it was away. Idempotent."""
    module = importlib.import_module("flwr.supercore.grpc")
    real = getattr(module.grpc, "_module", module.grpc)
    module.grpc = _GrpcWithChannelOptions(real, options)


def install_link_watch(address: str) -> LinkWatch:
    """Hook a :class:`LinkWatch` for `address` into the Fleet connection's RetryInvoker of Flower's SuperNode (made
    when the SuperNode connects, by `_make_fleet_connection_retry_invoker`, which `_init_connection` calls by name)."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    make_invoker = getattr(sci, "_silofl_make_invoker", sci._make_fleet_connection_retry_invoker)
    watch = LinkWatch(address)

    def make_watched_invoker(*args: Any, **kwargs: Any) -> Any:
        return watch.install(make_invoker(*args, **kwargs))

    sci._silofl_make_invoker = make_invoker  # Flower's, so that installing twice does not chain two watches
    sci._make_fleet_connection_retry_invoker = make_watched_invoker
    return watch


# -- the SuperNode, with its ClientApp worker ------------------------------------------------------------------------


class _WorkerSupervisor:
    """Starts the ClientApp worker next to the SuperNode and starts it again if it exits (a crash, a kill): a
    SuperNode without its worker would accept messages it never answers. Gives up, stopping the SuperNode, after
    :attr:`MAX_QUICK_EXITS` exits each within :attr:`QUICK` seconds of their start (a worker that cannot start)."""

    MAX_QUICK_EXITS = 5
    QUICK = 10.0
    RESTART_DELAY = 1.0

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()

    def start(self) -> None:
        from flwr.supercore.exit import add_exit_handler

        add_exit_handler(self.stopping.set)  # the SuperNode is shutting down: its worker's exit is expected
        threading.Thread(target=self._run, name="silofl-clientapp-supervisor", daemon=True).start()

    def _run(self) -> None:
        quick_exits = 0
        while True:
            started = time.monotonic()
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
            code = self.process.wait()
            if self.stopping.wait(self.RESTART_DELAY):
                return
            quick_exits = quick_exits + 1 if time.monotonic() - started < self.QUICK else 0
            if quick_exits >= self.MAX_QUICK_EXITS:
                _log(
                    logging.ERROR,
                    "the ClientApp worker exited %d times in a row right after starting (last exit code %s); "
                    "stopping the SuperNode: its log above says why",
                    quick_exits,
                    code,
                )
                os.kill(os.getpid(), signal.SIGTERM)
                return
            _log(logging.WARNING, "the ClientApp worker exited (code %s); starting it again", code)


def _worker_command(kwargs: dict[str, Any], per_message: bool = False) -> list[str]:
    """The `clientapp` command for a SuperNode started with `kwargs` (start_client_internal's keyword arguments)."""
    from flwr.supercore.address import resolve_bind_address

    certificates = None
    if kwargs.get("runtime_certificates") is not None:
        certificates = str(kwargs["runtime_root_certificates_path"])
    address = resolve_bind_address(str(kwargs["runtime_api_address"]))
    return _clientapp_command(address, certificates, os.getpid(), *(["--per-message"] if per_message else []))


def dump_stacks_on_signal() -> None:
    """On SIGUSR1, print every thread's Python stack to stderr (the node's log) and go on: how an operator, or a
    failed deployment test, sees where a SuperNode or its ClientApp worker waits (`kill -USR1 PID`)."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def supernode_main(argv: Sequence[str], clientapp_process: str = "long-lived") -> None:
    """Run Flower's `flower-supernode` with `argv` in this process, polls replaced, in Flower's process isolation
    mode next to this module's ClientApp worker (long-lived, or dispatching a fresh process per message)."""
    check_flower()
    dump_stacks_on_signal()
    if clientapp_process not in CLIENTAPP_PROCESS_MODES:
        raise SystemExit(
            f"--clientapp-process {clientapp_process!r}: choose one of {', '.join(CLIENTAPP_PROCESS_MODES)}"
        )
    argv = list(argv)
    isolation = _flag_value(argv, "--isolation")
    if isolation not in (None, "process"):
        raise SystemExit(
            f"--isolation {isolation}: silofl's ClientApp worker runs in Flower's process isolation mode; drop "
            "--isolation (or run Flower's stock SuperNode: `silofl silo start --runtime flower`)"
        )
    if "--allow-runtime-dependency-installation" in argv:
        raise SystemExit(
            "--allow-runtime-dependency-installation: silofl's ClientApp worker runs in this environment and "
            "installs nothing; drop the flag (or run Flower's stock SuperNode: `silofl silo start --runtime flower`)"
        )
    if isolation is None:
        argv += ["--isolation", "process"]

    # the module, not the function of the same name that flwr.supernode.cli exports
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    shorten_object_pulls()
    start_client_internal = cli.start_client_internal
    launch: dict[str, Callable[[], None]] = {}

    def with_worker(**kwargs: Any) -> None:
        if kwargs.get("superexec_auth_secret") is not None:
            raise SystemExit("--superexec-auth-secret-file is not supported by silofl's ClientApp worker")
        command = _worker_command(kwargs, per_message=clientapp_process == "per-message")
        launch["start"] = _WorkerSupervisor(command).start
        install_link_watch(str(kwargs["server_address"]))
        install_fast_reconnect()
        return start_client_internal(**kwargs)

    cli.start_client_internal = with_worker
    install_poll_patches(PollClock(), on_first_pull=lambda: launch["start"]())
    sys.argv = ["flower-supernode", *argv]
    cli.flower_supernode()


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for k, arg in enumerate(argv):
        if arg == flag and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# -- the long-lived ClientApp worker ---------------------------------------------------------------------------------


class _ClientAppWorker:
    """Answers ClientApp tasks one after another in this process (`run_task`), as `flwr-clientapp` answers one."""

    def __init__(self, runtime_api_address: str, root_certificates: str | None) -> None:
        self.address = runtime_api_address
        self.root_certificates = root_certificates
        self.fab_hash: str | None = None  # the FAB whose ClientApp this process has loaded
        self.client_app: Any = None
        self.tainted = False  # loading an app failed half-way: its modules may be half-imported

    def needs_fresh_process(self, fab_hash: str) -> bool:
        """True if a task of `fab_hash` must run in a fresh interpreter: another app's code is loaded here."""
        return self.tainted or (self.fab_hash is not None and bool(fab_hash) and fab_hash != self.fab_hash)

    def client(self, interceptors: list[Any]) -> Any:
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        certificates = None
        if self.root_certificates is not None:
            with open(self.root_certificates, "rb") as fh:
                certificates = fh.read()
        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.root_certificates is None,
            root_certificates=certificates,
            interceptors=interceptors,
            retry_invoker=make_simple_http_retry_invoker(),
        )

    def _load(self, run: Any, fab: Any) -> Any:
        """The run's ClientApp, installed from its FAB and imported the first time (then kept)."""
        if self.client_app is not None and fab.hash_str == self.fab_hash:
            return self.client_app
        if self.fab_hash is not None:  # needs_fresh_process() is checked before a task is started
            raise RuntimeError(f"FAB {fab.hash_str} in a process that loaded FAB {self.fab_hash}")
        from flwr.cli.install import install_from_fab
        from flwr.clientapp.utils import get_load_client_app_fn

        self.tainted = True
        install_from_fab(fab.content, skip_prompt=True)
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        self.client_app = load(run.fab_id, run.fab_version, fab.hash_str)
        self.fab_hash, self.tainted = fab.hash_str, False
        return self.client_app

    def run_task(self, token: str) -> None:
        """One ClientApp task, the steps of Flower's `run_clientapp` (pull input, load, call, push reply and
        context), with no process exit at the end."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.clientapp.client_app import LoadClientAppError
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

        client = self.client(
            [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)]
        )
        heartbeat = HeartbeatSender(_heartbeat_fn(client))
        message = reply = context = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            client_app = self._load(run, fab)
            reply = client_app(message=message, context=context)
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # as run_clientapp: the error goes back to the server as the reply
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            if isinstance(ex, LoadClientAppError):
                reason, code = (
                    "An exception was raised when attempting to load `ClientApp`",
                    ErrorCode.LOAD_CLIENT_APP_EXCEPTION,
                )
            _log(logging.ERROR, "ClientApp raised an exception", exc_info=ex)
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    try:
                        push_message(client, reply, context)
                    except Exception as ex:  # as run_clientapp: logged, the task still ends
                        _log(logging.ERROR, "Failed to push reply message", exc_info=ex)
                push_task_output(client=client, context=context, sub_status=sub_status, details=details)
            finally:
                if heartbeat.is_running:
                    heartbeat.stop()
                client.close()


def _heartbeat_fn(client: Any) -> Callable[[], bool]:
    """Flower's task heartbeat (`flwr.supercore.heartbeat.make_task_heartbeat_fn_http`), except that a refused
    heartbeat (the task was cancelled, e.g. by `flwr stop`) does not interrupt the process: Flower's raises SIGINT,
    which ends its one-message process; here the message is finished, the SuperNode refuses its reply, and the
    worker goes on with the next task."""
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    request = SendTaskHeartbeatRequest()

    def fn() -> bool:
        try:
            client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (httpx.codes.SERVICE_UNAVAILABLE, httpx.codes.GATEWAY_TIMEOUT):
                return False
            raise
        return True

    return fn


def _token_pipe(token: str) -> int:
    """A pipe's read end holding `token` (for a process this one starts or becomes: never on a command line)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, token.encode("ascii"))
    os.close(write_fd)
    os.set_inheritable(read_fd, True)
    return read_fd


def _clientapp_command(address: str, root_certificates: str | None, parent_pid: int | None, *extra: str) -> list[str]:
    command = [sys.executable, "-m", MODULE, "clientapp", "--runtime-api-address", address, *extra]
    if root_certificates is not None:
        command += ["--root-certificates", root_certificates]
    if parent_pid is not None:
        command += ["--parent-pid", str(parent_pid)]
    return command


def serve_clientapps(
    runtime_api_address: str,
    *,
    root_certificates: str | None = None,
    parent_pid: int | None = None,
    first_token: str | None = None,
    per_message: bool = False,
    preload: Sequence[str] = ("torch",),
    poll: Backoff = TASK_POLL,
) -> None:
    """The worker's loop: acquire the SuperNode's next ClientApp task, answer it, poll again (backing off).

    A task is answered in this process (the long-lived ClientApp), or with `per_message` in a fresh process started
    for it alone (`clientapp --single-task`), as Flower's SuperExec starts a `flwr-clientapp` process per message
    (but with this module's short object pulls); this process then only dispatches and imports nothing more."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)  # SIGINT to this process when the SuperNode is gone
    dump_stacks_on_signal()
    shorten_object_pulls()
    for name in () if per_message else preload:  # paid now, while idle, instead of by the first message
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    worker = _ClientAppWorker(runtime_api_address, root_certificates)
    if first_token:
        worker.run_task(first_token)
    acquirer = worker.client([RuntimeVersionHttpInterceptor(component_name="SuperExec")])
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
    last = time.monotonic()
    while True:
        res = acquirer.AcquireTask(request)
        if res.HasField("task") and res.token:
            if per_message:
                _run_in_fresh_process(runtime_api_address, root_certificates, res.token)
            else:
                if worker.needs_fresh_process(res.task.fab_hash):
                    acquirer.close()
                    _exec_fresh(runtime_api_address, root_certificates, parent_pid, res.token)
                worker.run_task(res.token)
            last = time.monotonic()
            continue
        time.sleep(poll.step(time.monotonic() - last))


def _run_in_fresh_process(address: str, root_certificates: str | None, token: str) -> None:
    """Answer the task of `token` in a new process that exits after it (per-message mode); wait for it (a SuperNode
    hands out one message at a time)."""
    read_fd = _token_pipe(token)
    try:
        command = _clientapp_command(address, root_certificates, os.getpid(), "--token-fd", str(read_fd))
        code = subprocess.call([*command, "--single-task"], pass_fds=(read_fd,), stdin=subprocess.DEVNULL)
    finally:
        os.close(read_fd)
    if code != 0:
        _log(logging.WARNING, "the ClientApp process of a task exited with code %s", code)


def _exec_fresh(address: str, root_certificates: str | None, parent_pid: int | None, token: str) -> None:
    """Replace this process by a fresh worker (same pid) that starts with the task of `token`."""
    read_fd = _token_pipe(token)
    command = _clientapp_command(address, root_certificates, parent_pid, "--token-fd", str(read_fd))
    _log(logging.INFO, "a task for another app version: continuing in a fresh ClientApp process")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def run_single_task(runtime_api_address: str, token: str, root_certificates: str | None = None) -> None:
    """One task in this fresh process, then return (per-message mode): Flower's `flwr-clientapp`, with this module's
    short object pulls."""
    shorten_object_pulls()
    _ClientAppWorker(runtime_api_address, root_certificates).run_task(token)


# -- command line ----------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m silofl.client.supernode_runtime supernode|clientapp|fingerprints ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("supernode", "clientapp", "fingerprints"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "fingerprints":
        for ref, digest in fingerprints().items():
            print(f"{digest}  {ref}")
        return 0
    if command == "supernode":
        parser = argparse.ArgumentParser(prog=f"python -m {MODULE} supernode", allow_abbrev=False)
        parser.add_argument("--clientapp-process", choices=CLIENTAPP_PROCESS_MODES, default="long-lived")
        ours, flower_args = parser.parse_known_args(rest)
        try:
            supernode_main(flower_args, ours.clientapp_process)
        except FlowerChangedError as exc:
            print(f"silofl SuperNode: {exc}", file=sys.stderr)
            return 2
        return 0
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE} clientapp", allow_abbrev=False)
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--per-message", action="store_true", help="answer each task in a fresh process")
    parser.add_argument("--token-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single-task", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(rest)
    token = None
    if args.token_fd is not None:
        with os.fdopen(args.token_fd, "rb") as fh:
            token = fh.read().decode("ascii").strip()
    try:
        if args.single_task:  # started by a checked dispatcher of this same installation: no second check (~1 s)
            if token is None:
                raise SystemExit("--single-task needs the task's token (--token-fd)")
            if args.parent_pid is not None:
                from flwr.supercore.app_utils import start_parent_process_monitor

                start_parent_process_monitor(args.parent_pid)
            run_single_task(args.runtime_api_address, token, args.root_certificates)
            return 0
        try:
            check_flower()
        except FlowerChangedError as exc:
            print(f"silofl ClientApp worker: {exc}", file=sys.stderr)
            return 2
        serve_clientapps(
            args.runtime_api_address,
            root_certificates=args.root_certificates,
            parent_pid=args.parent_pid,
            first_token=token,
            per_message=args.per_message,
        )
    except KeyboardInterrupt:  # the SuperNode is gone (parent monitor) or Ctrl-C
        return 0
    return 0


def _unwinding_exit(exc: BaseException) -> SystemExit | None:
    """`exc` if it is a SystemExit, else the SystemExit that was unwinding when `exc` was raised (if any)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SystemExit):
            return current
        seen.add(id(current))
        current = current.__context__
    return None


def exit_code(outcome: BaseException | int | None) -> int:
    """The exit status of a process whose main ended with `outcome` (what it returned, or what it raised), as the
    interpreter gives it, except for an exception raised while a `SystemExit` was unwinding: that exit's status.

    Flower 1.39's SuperNode exits through a `SystemExit` raised inside a signal handler (`flwr_exit`, e.g. once the
    SuperLink refused the node); while it unwinds, Flower's connection cleanup can raise again (`RuntimeError:
    Heartbeat sender is not running.`: its exit handlers stopped that sender already), which would turn an intended
    exit into a crash."""
    if outcome is None or isinstance(outcome, int):
        return int(outcome or 0)
    intended = _unwinding_exit(outcome)
    if intended is not None:
        code = intended.code
        return int(code or 0) if code is None or isinstance(code, int) else 1  # sys.exit("text") exits 1
    return 130 if isinstance(outcome, KeyboardInterrupt) else 1


def run_and_exit(entry: Callable[[], int | None]) -> None:
    """Run `entry` (a process's main), then end the process at once with its status (:func:`exit_code`), without
    the interpreter's finalization.

    Why: once the SuperNode's main has ended, the process must end. Measured (CI at 9672847,
    tests/test_deploy_faults.py, a SuperLink restarted without its database): both SuperNodes printed their last
    traceback and were still alive 90 s later, their ClientApp workers polling a closed Runtime API. Flower's own
    guard (`flwr_exit` starts a daemon thread that calls `os._exit` after 5 s) cannot fire once finalization has
    stopped daemon threads, and something in finalization waited. What a SuperNode must do before it ends has run by
    then: Flower's exit handlers (in `flwr_exit`) and this module's (the worker supervisor); the logs are flushed
    here. The ClientApp worker ends with its parent (`start_parent_process_monitor`)."""
    import traceback

    outcome: BaseException | int | None
    try:
        outcome = entry()
    except BaseException as exc:  # every way out of main ends the process below
        outcome = exc
        intended = _unwinding_exit(exc)
        if intended is None:
            if not isinstance(exc, KeyboardInterrupt):
                traceback.print_exception(exc)
        elif intended is not exc:
            print(f"silofl: {type(exc).__name__}: {exc} (raised by Flower while it was exiting)", file=sys.stderr)
        elif exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    for handler in logging.getLogger().handlers + logging.getLogger("flwr").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(exit_code(outcome))


if __name__ == "__main__":
    run_and_exit(main)
