"""SIGUSR1 stack dumps of silofl's SuperNode and ClientApp worker processes (standard library only)."""

from __future__ import annotations

import signal

__all__ = ["dump_stacks_on_signal"]


def dump_stacks_on_signal() -> None:
    """On SIGUSR1, print every thread's Python stack to stderr (the node's log) and go on: how an operator, or a
    failed deployment test, sees where a SuperNode or its ClientApp worker waits (`kill -USR1 PID`)."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
