"""What silofl's SuperNode says about its link to the SuperLink, and how fast it gets the link back.

Why. Flower 1.39's SuperNode only logs "Connection attempt failed, retrying in N seconds" when it loses its
SuperLink and, when the SuperLink refuses the node, "SuperNode terminated gracefully.". A :class:`LinkWatch`
(:func:`install_link_watch`) says in the node's log, naming the SuperLink's address, when the link is lost, when it
is back and, when the SuperLink no longer knows the node's key (a SuperLink restarted without its database forgets
every registration), what to do. gRPC's own reconnection pauses grow to 2 min, during which every call fails
without trying: :func:`install_fast_reconnect` keeps them within 2 s (docs/FAULTS.md).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from silofl.client.supernode import flower_log

__all__ = [
    "FAST_RECONNECT_OPTIONS",
    "MAX_RECONNECT_PAUSE",
    "UNKNOWN_NODE_DETAIL",
    "LinkWatch",
    "install_fast_reconnect",
    "install_link_watch",
]

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
        self._log, self._clock = log or flower_log.log, clock
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
