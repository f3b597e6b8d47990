"""The ClientApp worker of silofl's SuperNode (``python -m silofl.client.supernode_runtime clientapp ...``): what
Flower's SuperExec and ``flwr-clientapp`` do, in one process that lives as long as its SuperNode.

Why. Flower 1.39 starts a fresh `flwr-clientapp` process for every message (through a SuperExec that polls every
1 s), which imports Flower, torch and the app again, three at once on a small machine.

What. The worker acquires the SuperNode's pending ClientApp tasks over the SuperNode's Runtime API (the API a
separately started process uses in ``--isolation process`` mode) and answers each exactly as ``flwr-clientapp``
does (:func:`flwr.supernode.runtime.run_clientapp.run_clientapp`): the task's Message, Context, Run and FAB pulled
with the task's own token, the app loaded from the installed FAB, the reply and the updated Context pushed back, a
failure reported as Flower's error reply. By default every task is answered in the worker itself
(:class:`ClientAppWorker`): the process start, the imports and loading the app are paid once, not per message; a
task for another FAB (a new version of the app) makes the worker replace itself with a fresh interpreter (``exec``)
before it touches that task, so that two apps' code never share a process. With ``per_message`` it starts a fresh
process for each task (``clientapp --single-task``), as Flower's SuperExec does.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from silofl.client.supernode import flower_log
from silofl.client.supernode.backoff import TASK_POLL, Backoff
from silofl.client.supernode.flower_patches import shorten_object_pulls
from silofl.client.supernode.stack_dumps import dump_stacks_on_signal

__all__ = ["MODULE", "ClientAppWorker", "clientapp_command", "run_single_task", "serve_clientapps"]

#: The runtime's command line (:mod:`silofl.client.supernode_runtime`) as `python -m` names it: the worker's command.
MODULE = "silofl.client.supernode_runtime"


class ClientAppWorker:
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
            flower_log.log(logging.ERROR, "ClientApp raised an exception", exc_info=ex)
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    try:
                        push_message(client, reply, context)
                    except Exception as ex:  # as run_clientapp: logged, the task still ends
                        flower_log.log(logging.ERROR, "Failed to push reply message", exc_info=ex)
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


def clientapp_command(address: str, root_certificates: str | None, parent_pid: int | None, *extra: str) -> list[str]:
    """The worker's command line (``python -m silofl.client.supernode_runtime clientapp ...``) with `extra`
    arguments; `parent_pid` is the process whose end ends the worker (its SuperNode)."""
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
    (but with this package's short object pulls); this process then only dispatches and imports nothing more."""
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
    worker = ClientAppWorker(runtime_api_address, root_certificates)
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
        command = clientapp_command(address, root_certificates, os.getpid(), "--token-fd", str(read_fd))
        code = subprocess.call([*command, "--single-task"], pass_fds=(read_fd,), stdin=subprocess.DEVNULL)
    finally:
        os.close(read_fd)
    if code != 0:
        flower_log.log(logging.WARNING, "the ClientApp process of a task exited with code %s", code)


def _exec_fresh(address: str, root_certificates: str | None, parent_pid: int | None, token: str) -> None:
    """Replace this process by a fresh worker (same pid) that starts with the task of `token`."""
    read_fd = _token_pipe(token)
    command = clientapp_command(address, root_certificates, parent_pid, "--token-fd", str(read_fd))
    flower_log.log(logging.INFO, "a task for another app version: continuing in a fresh ClientApp process")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def run_single_task(runtime_api_address: str, token: str, root_certificates: str | None = None) -> None:
    """One task in this fresh process, then return (per-message mode): Flower's `flwr-clientapp`, with this package's
    short object pulls."""
    shorten_object_pulls()
    ClientAppWorker(runtime_api_address, root_certificates).run_task(token)
