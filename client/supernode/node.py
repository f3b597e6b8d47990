"""The SuperNode of silofl's runtime (``python -m silofl.client.supernode_runtime supernode ...``): Flower's own
`flower-supernode` (same arguments, same process, same exit codes) with this package's patches, in Flower's
``--isolation process`` mode next to the ClientApp worker (:mod:`silofl.client.supernode.worker`), which it starts
once the SuperLink has accepted it and starts again if it dies (:class:`_WorkerSupervisor`).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from silofl.client.supernode import flower_log
from silofl.client.supernode.flower_check import check_flower
from silofl.client.supernode.flower_patches import PollClock, install_poll_patches, shorten_object_pulls
from silofl.client.supernode.link_watch import install_fast_reconnect, install_link_watch
from silofl.client.supernode.stack_dumps import dump_stacks_on_signal
from silofl.client.supernode.worker import clientapp_command

__all__ = ["CLIENTAPP_PROCESS_MODES", "flag_value", "supernode_main", "worker_command"]

#: How the ClientApp worker answers tasks: in itself (one process for every message) or in a fresh process each.
CLIENTAPP_PROCESS_MODES: tuple[str, ...] = ("long-lived", "per-message")


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
                flower_log.log(
                    logging.ERROR,
                    "the ClientApp worker exited %d times in a row right after starting (last exit code %s); "
                    "stopping the SuperNode: its log above says why",
                    quick_exits,
                    code,
                )
                os.kill(os.getpid(), signal.SIGTERM)
                return
            flower_log.log(logging.WARNING, "the ClientApp worker exited (code %s); starting it again", code)


def worker_command(kwargs: dict[str, Any], per_message: bool = False) -> list[str]:
    """The `clientapp` command for a SuperNode started with `kwargs` (start_client_internal's keyword arguments)."""
    from flwr.supercore.address import resolve_bind_address

    certificates = None
    if kwargs.get("runtime_certificates") is not None:
        certificates = str(kwargs["runtime_root_certificates_path"])
    address = resolve_bind_address(str(kwargs["runtime_api_address"]))
    return clientapp_command(address, certificates, os.getpid(), *(["--per-message"] if per_message else []))


def supernode_main(argv: Sequence[str], clientapp_process: str = "long-lived") -> None:
    """Run Flower's `flower-supernode` with `argv` in this process, polls replaced, in Flower's process isolation
    mode next to this package's ClientApp worker (long-lived, or dispatching a fresh process per message)."""
    check_flower()
    dump_stacks_on_signal()
    if clientapp_process not in CLIENTAPP_PROCESS_MODES:
        raise SystemExit(
            f"--clientapp-process {clientapp_process!r}: choose one of {', '.join(CLIENTAPP_PROCESS_MODES)}"
        )
    argv = list(argv)
    isolation = flag_value(argv, "--isolation")
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
        command = worker_command(kwargs, per_message=clientapp_process == "per-message")
        launch["start"] = _WorkerSupervisor(command).start
        install_link_watch(str(kwargs["server_address"]))
        install_fast_reconnect()
        return start_client_internal(**kwargs)

    cli.start_client_internal = with_worker
    install_poll_patches(PollClock(), on_first_pull=lambda: launch["start"]())
    sys.argv = ["flower-supernode", *argv]
    cli.flower_supernode()


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (``--flag VALUE`` or ``--flag=VALUE``), None if it is not given."""
    for k, arg in enumerate(argv):
        if arg == flag and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
