"""How a process of silofl's SuperNode runtime ends: with the status its main meant, at once (standard library only).

Why. Flower 1.39's SuperNode exits through a `SystemExit` raised inside a signal handler, and its cleanup can raise
again while that unwinds; and once its main has ended, the interpreter's finalization can wait for ever
(:func:`run_and_exit`). ``python -m silofl.client.supernode_runtime`` runs its main through :func:`run_and_exit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable

__all__ = ["exit_code", "run_and_exit"]


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
    tests/system/test_deploy_faults.py, a SuperLink restarted without its database): both SuperNodes printed their last
    traceback and were still alive 90 s later, their ClientApp workers polling a closed Runtime API. Flower's own
    guard (`flwr_exit` starts a daemon thread that calls `os._exit` after 5 s) cannot fire once finalization has
    stopped daemon threads, and something in finalization waited. What a SuperNode must do before it ends has run by
    then: Flower's exit handlers (in `flwr_exit`) and the runtime's (the worker supervisor); the logs are flushed
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
