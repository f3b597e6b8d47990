"""A silo's SuperNode with short, backing-off polls and one long-lived ClientApp process: the command line of the
only code that reaches into Flower's internals (:mod:`silofl.client.supernode`, one job a module), checked against
the Flower versions in :data:`CHECKED_FLOWER_VERSIONS`.

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

Everything here depends on Flower's private functions named in :data:`FINGERPRINTED`: :func:`check_flower` refuses to
run on a Flower whose version is not in :data:`CHECKED_FLOWER_VERSIONS` or whose sources of those functions differ
from the ones checked (sha256 of their source), naming the fix (`silofl silo start --runtime flower` runs Flower's
stock SuperNode). `tests/client/test_supernode_runtime.py` fails the same way when Flower changes under the runtime.

Where. This module is the command line; the runtime is the package :mod:`silofl.client.supernode`: the Flower check
(`flower_check`), the poll intervals (`backoff`), the patches of Flower's SuperNode loop (`flower_patches`), the watch
of the link to the SuperLink (`link_watch`), the ClientApp worker (`worker`), the SuperNode with its worker
supervisor (`node`), the exit status (`exit_status`) and the SIGUSR1 stack dumps (`stack_dumps`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from silofl.client.supernode.backoff import Backoff
from silofl.client.supernode.exit_status import run_and_exit
from silofl.client.supernode.flower_check import (
    CHECKED_FLOWER_VERSIONS,
    FlowerChangedError,
    check_flower,
    fingerprints,
)
from silofl.client.supernode.flower_patches import PollClock
from silofl.client.supernode.link_watch import LinkWatch
from silofl.client.supernode.node import CLIENTAPP_PROCESS_MODES, supernode_main
from silofl.client.supernode.worker import MODULE, run_single_task, serve_clientapps

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


if __name__ == "__main__":
    run_and_exit(main)
