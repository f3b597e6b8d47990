"""silofl's SuperNode runtime (client/supernode/, its command line client/supernode_runtime.py) and the ServerApp's
polling Grid (server/polling.py), without processes: the Flower version pin and fingerprints (this file fails, naming
what changed, when Flower changes under the runtime), the backing-off polls, the patches of Flower's SuperNode loop
and object pulls, and the polling `send_and_receive`. The processes themselves (SuperNodes, long-lived ClientApp
workers) run in tests/system/test_deploy_loopback.py, tests/system/test_faults.py and
tests/system/test_docker_compose.py.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import logging
import os
import time
from types import SimpleNamespace

import pytest

from silofl.client import supernode_runtime as rt
from silofl.client.supernode import (
    backoff,
    exit_status,
    flower_check,
    flower_log,
    flower_patches,
    link_watch,
    node,
    worker,
)
from silofl.server.polling import WAITING_LOG_EVERY, PollingGrid, polling_grid

# --- the Flower this module was checked against -------------------------------------------------------------------


def test_installed_flower_is_the_one_the_runtime_was_checked_against() -> None:
    """Fails loudly when Flower changes under client/supernode_runtime.py: a new version, or the source of a function
    it patches or mirrors. Re-check those functions against the new Flower, then update CHECKED_FLOWER_VERSIONS and
    the fingerprints (`python -m silofl.client.supernode_runtime fingerprints`)."""
    from flwr.supercore.version import package_version

    assert package_version in flower_check.CHECKED_FLOWER_VERSIONS, (
        f"flwr {package_version} is installed, client/supernode_runtime.py was checked against "
        f"{flower_check.CHECKED_FLOWER_VERSIONS}: re-check the functions in its FINGERPRINTED "
        "(client/supernode/flower_check.py) against this Flower"
    )
    changed = {
        ref: digest for ref, digest in flower_check.fingerprints().items() if digest != flower_check.FINGERPRINTED[ref]
    }
    assert not changed, f"Flower's source changed under client/supernode_runtime.py: {sorted(changed)}"
    flower_check.check_flower()
    # what the patches rely on, beyond the fingerprints: the sleeps are the module's, the pull defaults are keywords
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    assert sci.time.sleep is not None and "time.sleep(3)" in inspect.getsource(sci.start_client_internal)
    utils = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    for function in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        assert set(flower_patches.OBJECT_PULL_RETRY) <= set(function.__kwdefaults__)


def test_check_flower_refuses_another_version_or_changed_source_naming_the_fix(monkeypatch) -> None:
    import flwr.supercore.version as version

    monkeypatch.setattr(version, "package_version", "1.40.0")
    with pytest.raises(flower_check.FlowerChangedError, match=r"flwr 1\.40\.0 is installed.*--runtime flower"):
        flower_check.check_flower()
    monkeypatch.undo()
    ref = "flwr.supernode.start_client_internal:_push_messages"
    monkeypatch.setitem(flower_check.FINGERPRINTED, ref, "0" * 64)
    with pytest.raises(flower_check.FlowerChangedError, match=rf"the source of {ref} differs.*--runtime flower"):
        flower_check.check_flower()


# --- backing-off polls ----------------------------------------------------------------------------------------------


def test_backoff_is_a_share_of_the_wait_between_floor_and_cap() -> None:
    poll = backoff.Backoff(floor=0.01, cap=1.0, ratio=0.1)
    assert poll.step(0.0) == 0.01 and poll.step(0.05) == 0.01
    assert poll.step(2.0) == pytest.approx(0.2)
    assert poll.step(3600.0) == 1.0
    with pytest.raises(ValueError, match="floor <= cap"):
        backoff.Backoff(floor=2.0, cap=1.0)
    # the production settings: fast while messages flow, never slower than Flower's own steps when idle
    assert backoff.IDLE_PULL.cap <= backoff.FLOWER_IDLE_SLEEP and backoff.REPLY_WAIT.cap <= backoff.FLOWER_REPLY_SLEEP
    assert max(backoff.IDLE_PULL.floor, backoff.REPLY_WAIT.floor, backoff.TASK_POLL.floor) <= 0.01


def _fake_time():
    now = [100.0]
    slept: list[float] = []
    return now, slept, (lambda: now[0]), slept.append


def test_poll_clock_replaces_flowers_two_sleeps_and_nothing_else() -> None:
    now, slept, clock, sleep = _fake_time()
    poll = flower_patches.PollClock(backoff.Backoff(0.01, 1.0), backoff.Backoff(0.002, 0.5), sleep=sleep, clock=clock)
    poll.message_handled()
    poll.sleep(3)  # Flower's idle sleep right after a message: the floor
    now[0] += 5.0
    poll.sleep(3)  # 5 s without a message: 10% of it
    now[0] += 600.0
    poll.sleep(3)  # long idle: the cap
    poll.reply_wait_started()
    poll.sleep(0.5)  # Flower's reply-wait step: the reply floor
    now[0] += 1.0
    poll.sleep(0.5)
    poll.sleep(0.2)  # any other sleep is passed through
    assert slept == [0.01, pytest.approx(0.5), 1.0, 0.002, pytest.approx(0.1), 0.2]
    assert poll.monotonic is time.monotonic  # the rest of the `time` module is the real one


def test_poll_patches_hook_flowers_supernode_loop(monkeypatch) -> None:
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    replies = iter([None, 7])
    calls: list[str] = []
    monkeypatch.setattr(sci, "_pull_and_store_message", lambda **kw: next(replies))
    monkeypatch.setattr(sci, "_push_messages", lambda **kw: calls.append("push"))
    monkeypatch.setattr(sci, "time", time)  # restored after the test: the patch replaces the module's `time`
    monkeypatch.setattr(sci, "pull_objects", sci.pull_objects)  # and its `pull_objects` (dropped stopped runs)
    now, slept, clock, sleep = _fake_time()
    poll = flower_patches.PollClock(sleep=sleep, clock=clock)
    first: list[int] = []
    flower_patches.install_poll_patches(poll, on_first_pull=lambda: first.append(1))
    assert sci.time is poll
    now[0] += 50.0
    assert sci._pull_and_store_message() is None  # nothing came: the clock still counts from its start
    sci.time.sleep(3)
    assert slept[-1] == backoff.IDLE_PULL.cap
    assert sci._pull_and_store_message() == 7  # a message: poll fast again
    sci.time.sleep(3)
    assert slept[-1] == backoff.IDLE_PULL.floor
    now[0] += 30.0
    sci._push_messages()  # the reply left: fast again (the next round's message), however long the ClientApp took
    sci.time.sleep(3)
    assert slept[-1] == backoff.IDLE_PULL.floor and calls == ["push"] and first == [1]  # the callback ran once


def _receive_one_message(pull_and_store, *, stops_at: str) -> tuple[int | None, list[str]]:
    """Flower's SuperNode receiving one message of run 42 into a real NodeState and ObjectStore, the SuperLink
    answering that the run is not running when the SuperNode pulls the message's objects (`stops_at="pull"`) or
    confirms it (`"confirm"`), or never (`""`). Returns what the pull returned and the statuses of the node's tasks."""
    import time

    import numpy as np
    from flwr.app import ArrayRecord, Message, Metadata, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run, RunNotRunningException
    from flwr.supernode.nodestate import NodeStateFactory

    factory = NodeStateFactory(ObjectStoreFactory())
    state, store = factory.state(), factory.objectstore_factory.store()
    state.set_node_id(7)
    state.store_run(Run.create_empty(run_id=42))
    metadata = Metadata(
        run_id=42, message_id="", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="4",
        created_at=time.time(), ttl=3600.0, message_type="train",
    )  # fmt: skip
    message = Message(RecordDict({"model": ArrayRecord([np.ones(3)])}), metadata=metadata)
    objects = {key: obj.deflate() for key, obj in get_all_nested_objects(message).items()}

    def link(step: str, answer):
        def call(*args):
            if stops_at == step:
                raise RunNotRunningException
            return answer(*args)

        return call

    returned = pull_and_store(
        state=state, object_store=store, node_config={}, receive=lambda: (message, get_object_tree(message)),
        get_run=None, get_fab=None, pull_object=link("pull", lambda run, key: objects[key]),
        confirm_message_received=link("confirm", lambda run, key: None), trusted_entities=None,
    )  # fmt: skip
    return returned, [task.status.status for task in state.get_tasks()]


@pytest.mark.parametrize("stops_at", ["pull", "confirm"])
def test_a_message_whose_run_stopped_while_it_arrived_leaves_no_task_behind(monkeypatch, stops_at: str) -> None:
    """A SuperLink restarted mid-run hands out the stopped run's last message, then says the run is not running.
    Flower 1.39 alone leaves that message's task pending for ever (its objects never come), which the ClientApp
    worker takes first and waits on while the node's next run waits behind it (seen in CI: the SuperLink-kill test
    of tests/system/test_deploy_faults.py). With silofl's patch the task ends as failed and nothing is left pending."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    monkeypatch.setattr(sci, "pull_objects", sci.pull_objects)
    flowers = sci._pull_and_store_message
    assert _receive_one_message(flowers, stops_at=stops_at) == (None, ["pending"])  # Flower's own: the leak

    patched = flower_patches.drop_messages_of_stopped_runs(flowers)
    flower_patches.drop_messages_of_stopped_runs(flowers)  # installing twice wraps Flower's pull once
    utils = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    assert sci._silofl_pull_objects is utils.pull_objects
    assert _receive_one_message(patched, stops_at=stops_at) == (None, ["finished"])
    assert _receive_one_message(patched, stops_at="") == (42, ["pending"])  # a live run's message: as before


def test_object_pulls_retry_within_milliseconds(monkeypatch) -> None:
    utils = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    for function in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(function, "__kwdefaults__", dict(function.__kwdefaults__))  # restored afterwards
    assert utils.pull_objects.__kwdefaults__["initial_backoff"] == 1  # Flower's: a pull that comes early waits 1 s
    flower_patches.shorten_object_pulls()
    flower_patches.shorten_object_pulls()  # idempotent
    for function in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        assert function.__kwdefaults__["initial_backoff"] == 0.005 and function.__kwdefaults__["backoff_cap"] == 0.5
        assert function.__kwdefaults__["max_time"] == 7200  # Flower's patience is kept
    attempts: list[float] = []

    def pull(object_id: str) -> bytes:
        attempts.append(time.monotonic())
        if len(attempts) < 4:
            raise utils.ObjectUnavailableError(object_id)
        return b"content"

    t0 = time.monotonic()
    assert utils.pull_objects(["a"], pull) == {"a": b"content"}
    assert time.monotonic() - t0 < 0.5  # three misses: about 35 ms instead of Flower's 7 s


# --- what the SuperNode says about its SuperLink -------------------------------------------------------------------


class _RpcError(Exception):
    """Stands in for a grpc.RpcError: `code()` and `details()`."""

    def __init__(self, code: str, details: str) -> None:
        import grpc

        super().__init__(details)
        self._code, self._details = getattr(grpc.StatusCode, code), details

    def code(self):
        return self._code

    def details(self) -> str:
        return self._details


def test_link_watch_says_once_that_the_superlink_is_lost_and_when_it_is_back() -> None:
    now, _, clock, _ = _fake_time()
    said: list[tuple[int, str]] = []
    watch = link_watch.LinkWatch(
        "link.example:9092", log=lambda level, text, *args: said.append((level, text % args)), clock=clock
    )
    down = _RpcError("UNAVAILABLE", "failed to connect to all addresses")
    watch.failed(down)  # before any success: not reachable yet
    watch.succeeded()
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]
    assert said[0][1].startswith(
        "silofl SuperNode: cannot reach the SuperLink at link.example:9092 (StatusCode.UNAVAILABLE"
    )
    said.clear()
    watch.succeeded()  # nothing was lost: nothing to say
    watch.failed(down)
    now[0] += 12.5
    watch.failed(down)  # the same streak: said once
    watch.succeeded()
    assert len(said) == 2
    assert said[0][1].startswith(
        "silofl SuperNode: lost the SuperLink at link.example:9092 (StatusCode.UNAVAILABLE: failed to connect to all "
        "addresses); retrying, at most 20 s apart"
    )
    assert "silofl deploy restart --dir DIR" in said[0][1]
    assert said[1] == (
        logging.INFO,
        "silofl SuperNode: reconnected to the SuperLink at link.example:9092 after 12.5 s",
    )


def test_link_watch_names_the_fix_when_the_superlink_forgets_the_node() -> None:
    said: list[tuple[int, str]] = []
    watch = link_watch.LinkWatch("127.0.0.1:9092", log=lambda level, text, *args: said.append((level, text % args)))
    watch.refused(_RpcError("UNAVAILABLE", "down"))  # retried, not refused: nothing said
    watch.refused(_RpcError("UNAUTHENTICATED", "Invalid node ID"))
    watch.refused(_RpcError("UNAUTHENTICATED", "Invalid node ID"))  # a heartbeat refused while Flower stops: said once
    assert [level for level, _ in said] == [logging.ERROR]
    assert said[0][1].startswith(
        "silofl SuperNode: the SuperLink at 127.0.0.1:9092 no longer knows this node's key (Invalid node ID)"
    )
    assert "`flwr supernode register NODE.pub CONNECTION`" in said[0][1] and "same command and state-dir" in said[0][1]
    other = link_watch.LinkWatch("127.0.0.1:9092", log=lambda level, text, *args: said.append((level, text % args)))
    other.refused(_RpcError("UNAUTHENTICATED", "Invalid timestamp"))
    assert said[1][1].startswith("silofl SuperNode: the SuperLink at 127.0.0.1:9092 refuses this node (UNAUTHENTICATED")


def test_link_watch_hooks_the_fleet_connections_retry_invoker_and_keeps_flowers_rules(monkeypatch) -> None:
    """Installed into Flower's own invoker factory (the one `_init_connection` calls by name): the watch sees every
    failed call first, Flower still logs, retries UNAVAILABLE and gives up on other codes."""
    sci = importlib.import_module("flwr.supernode.start_client_internal")
    flowers = sci._make_fleet_connection_retry_invoker
    monkeypatch.setattr(sci, "_make_fleet_connection_retry_invoker", flowers)  # restored after the test
    monkeypatch.setattr(sci, "_silofl_make_invoker", flowers, raising=False)
    said: list[str] = []
    monkeypatch.setattr(flower_log, "log", lambda level, text, *args: said.append(text % args))
    link_watch.install_link_watch("127.0.0.1:9092")
    link_watch.install_link_watch("127.0.0.1:9092")  # installing twice does not chain two watches
    invoker = sci._make_fleet_connection_retry_invoker(max_retries=3)
    invoker.wait_function = lambda seconds: None
    calls = iter([_RpcError("UNAVAILABLE", "down"), _RpcError("UNAVAILABLE", "down"), None])

    def call() -> str:
        error = next(calls)
        if error is not None:
            raise error
        return "pulled"

    invoker.recoverable_exceptions = _RpcError  # Flower's: grpc.RpcError, which the stand-in does not derive from
    assert invoker.invoke(call) == "pulled"
    assert len(said) == 2
    assert said[0].startswith("silofl SuperNode: cannot reach the SuperLink at 127.0.0.1:9092 (StatusCode.UNAVAILABLE")
    assert said[1].startswith("silofl SuperNode: reconnected to the SuperLink at 127.0.0.1:9092 after ")
    with pytest.raises(_RpcError):  # Flower gives up on codes it does not retry
        invoker.invoke(lambda: (_ for _ in ()).throw(_RpcError("INVALID_ARGUMENT", "bad")))


# --- the supernode command ----------------------------------------------------------------------------------------


def test_the_command_line_names_its_commands_and_prints_the_fingerprints(capsys) -> None:
    """`python -m silofl.client.supernode_runtime` (the entry of client/supernode/): without a known command it
    prints its docstring and exits 2; `fingerprints` prints the installed Flower's, one `DIGEST  REF` a line."""
    assert rt.main([]) == 2 and rt.main(["--help"]) == 2
    assert "supernode [--clientapp-process long-lived|per-message]" in capsys.readouterr().err
    assert rt.main(["fingerprints"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{digest}  {ref}" for ref, digest in flower_check.fingerprints().items()]


def test_supernode_main_refuses_what_its_clientapp_worker_cannot_do() -> None:
    with pytest.raises(SystemExit, match="--isolation subprocess: silofl's ClientApp worker"):
        node.supernode_main(["--insecure", "--isolation", "subprocess"], "long-lived")
    with pytest.raises(SystemExit, match="--allow-runtime-dependency-installation"):
        node.supernode_main(["--insecure", "--allow-runtime-dependency-installation"], "long-lived")
    with pytest.raises(SystemExit, match="choose one of long-lived, per-message"):
        node.supernode_main(["--insecure"], "warm")
    assert node.flag_value(["--port", "9", "--isolation=process"], "--isolation") == "process"
    assert node.flag_value(["--port", "9"], "--isolation") is None


def test_exit_code_is_the_unwinding_exits_when_flowers_cleanup_raises_again() -> None:
    """Flower 1.39's SuperNode exits by a SystemExit from a signal handler; its cleanup may raise while it unwinds."""

    def raised(make):
        try:
            make()
        except BaseException as exc:
            return exc
        raise AssertionError("nothing raised")

    def cleanup_fails_during(code):
        try:
            raise SystemExit(code)
        finally:
            raise RuntimeError("Heartbeat sender is not running.")

    assert exit_status.exit_code(None) == 0 and exit_status.exit_code(2) == 2
    assert exit_status.exit_code(SystemExit(0)) == 0 and exit_status.exit_code(SystemExit(3)) == 3
    assert exit_status.exit_code(SystemExit("--flag: bad")) == 1
    assert exit_status.exit_code(raised(lambda: cleanup_fails_during(0))) == 0
    assert exit_status.exit_code(raised(lambda: cleanup_fails_during(1))) == 1
    assert exit_status.exit_code(RuntimeError("a bug")) == 1
    assert exit_status.exit_code(KeyboardInterrupt()) == 130


def test_run_and_exit_ends_the_process_even_if_a_thread_would_hold_it(tmp_path) -> None:
    """A process whose main ended must end: here a non-daemon thread that never ends would keep the interpreter's
    finalization waiting forever (the SuperNodes of the CI at 9672847 lived on 90 s after their last traceback)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(rt.__file__).resolve().parents[1]

    def run(body: str) -> subprocess.CompletedProcess[str]:
        script = tmp_path / "main.py"
        script.write_text("from client.supernode.exit_status import run_and_exit\n" + body + "run_and_exit(main)\n")
        env = {"PYTHONPATH": str(root)}
        return subprocess.run(
            [sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=60
        )

    done = run(
        "import threading\n"
        "def main():\n"
        "    threading.Thread(target=threading.Event().wait).start()\n"
        "    try:\n"
        "        raise SystemExit(0)\n"
        "    finally:\n"
        "        raise RuntimeError('Heartbeat sender is not running.')\n"
    )
    assert done.returncode == 0, done.stderr
    assert "RuntimeError: Heartbeat sender is not running. (raised by Flower while it was exiting)" in done.stderr
    done = run("def main():\n    raise ValueError('x')\n")
    assert done.returncode == 1 and "Traceback" in done.stderr and "ValueError: x" in done.stderr


def test_worker_command_follows_the_supernodes_runtime_api() -> None:
    command = node.worker_command({"runtime_api_address": "0.0.0.0:9094", "runtime_certificates": None})
    assert command[1:4] == ["-m", "silofl.client.supernode_runtime", "clientapp"] and "--per-message" not in command
    assert "--per-message" in node.worker_command({"runtime_api_address": "a:1"}, per_message=True)
    assert command[command.index("--runtime-api-address") + 1] == "127.0.0.1:9094"  # as Flower's SuperExec dials
    assert command[command.index("--parent-pid") + 1] == str(os.getpid())  # `silofl deploy down` finds it
    secure = node.worker_command(
        {
            "runtime_api_address": "[::]:9",
            "runtime_certificates": (b"", b"", b""),
            "runtime_root_certificates_path": "c",
        }
    )
    assert secure[secure.index("--root-certificates") + 1] == "c"


def test_worker_keeps_one_app_and_starts_fresh_for_another() -> None:
    app_worker = worker.ClientAppWorker("127.0.0.1:1", None)
    assert not app_worker.needs_fresh_process("abc")  # nothing loaded yet
    app_worker.fab_hash = "abc"
    assert not app_worker.needs_fresh_process("abc") and app_worker.needs_fresh_process("def")
    app_worker.tainted = True  # an app failed to load half-way: its modules may be half-imported
    assert app_worker.needs_fresh_process("abc")


# --- the ServerApp's polling Grid -----------------------------------------------------------------------------------


def _messages(*nodes: int) -> list[SimpleNamespace]:
    """Stand-ins for Flower Messages to `nodes` (only their destination is read before they are pushed)."""
    return [SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node)) for node in nodes]


class _FakeGrid:
    """Replies to `m1`, `m2`, `m3` become available at given times of a fake clock."""

    def __init__(self, now: list[float], ready: dict[str, float]) -> None:
        self.now, self.ready, self.pulls = now, ready, 0
        self.pushed: list = []

    def push_messages(self, messages):
        self.pushed = list(messages)
        return list(self.ready)

    def pull_messages(self, message_ids):
        self.pulls += 1
        due = [i for i in message_ids if self.ready[i] <= self.now[0]]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in due]


def test_polling_grid_pulls_fast_then_backs_off_and_keeps_flowers_result() -> None:
    now, slept, clock, _ = _fake_time()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    fake = _FakeGrid(now, {"m1": 100.02, "m2": 100.05, "m3": 112.0})
    grid = PollingGrid(fake, backoff.Backoff(floor=0.005, cap=1.0, ratio=0.1), sleep=sleep, clock=clock)
    sent = _messages(1, 2, 3)
    replies = grid.send_and_receive(sent, timeout=None)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m1", "m2", "m3"]
    assert fake.pushed == sent
    assert slept[0] == 0.005 and max(slept) == 1.0  # milliseconds at first, capped at 1 s
    assert 12.0 <= now[0] - 100.0 <= 12.0 * 1.1 + 0.01  # seen within 10% of the wait
    assert fake.pulls < 100  # 69: ten at the floor, then 10% more each; at a fixed 5 ms, 2400


def test_polling_grid_returns_what_came_when_the_timeout_runs_out() -> None:
    now, slept, clock, _ = _fake_time()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    fake = _FakeGrid(now, {"m1": 100.0, "m2": 1e9})
    grid = PollingGrid(fake, sleep=sleep, clock=clock)
    replies = grid.send_and_receive(_messages(1, 2), timeout=3.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m1"]
    assert now[0] - 100.0 == pytest.approx(3.0)  # no pause past the timeout


def test_polling_grid_says_which_nodes_it_still_waits_for() -> None:
    """A round whose replies are late (a silo reconnecting to a restarted SuperLink) is not silent: every
    WAITING_LOG_EVERY s the ServerApp's log names the nodes it still waits for."""
    now, slept, clock, _ = _fake_time()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    said: list[str] = []
    fake = _FakeGrid(now, {"m1": 100.0, "m2": 175.0})
    grid = PollingGrid(fake, sleep=sleep, clock=clock, log=lambda level, text, *args: said.append(text % args))
    replies = grid.send_and_receive(_messages(7, 9), timeout=600.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m1", "m2"]
    assert len(said) == int(75 // WAITING_LOG_EVERY) == 2, said
    assert "for the replies of nodes [9] (1 of 2 answered)" in said[0] and "(at most 600 s)" in said[0]


def test_polling_grid_wraps_only_flowers_deployment_grid() -> None:
    from flwr.superlink.grid.http_grid import HttpGrid

    from silofl.server.inprocess_grid import InProcessGrid

    http = HttpGrid("127.0.0.1:1", insecure=True, token="t")  # not connected until used
    wrapped = polling_grid(http)
    assert isinstance(wrapped, PollingGrid) and wrapped.wrapped is http
    assert wrapped._insecure is True  # anything else is the wrapped Grid's
    inprocess = object.__new__(InProcessGrid)
    assert polling_grid(inprocess) is inprocess


def test_fast_reconnect_gives_the_fleet_channel_short_reconnection_pauses(monkeypatch) -> None:
    """After `install_fast_reconnect`, the channel Flower's `create_channel` opens (as the SuperNode's Fleet
    connection does) carries Flower's own options and gRPC reconnection pauses of at most 2 s (gRPC's default grows
    to 120 s, during which every call fails without trying); installing twice wraps the real module once."""
    import grpc
    from flwr.supercore import grpc as flower_grpc

    monkeypatch.setattr(flower_grpc, "grpc", grpc)  # restored after the test
    opened: list[tuple[str, list[tuple[str, int]]]] = []

    def recording(make):
        def channel(target, *args, options=None, **kwargs):
            opened.append((target, list(options)))
            return make(target, *args, options=options, **kwargs)

        return channel

    monkeypatch.setattr(grpc, "insecure_channel", recording(grpc.insecure_channel))
    monkeypatch.setattr(grpc, "secure_channel", recording(grpc.secure_channel))
    link_watch.install_fast_reconnect()
    link_watch.install_fast_reconnect()
    assert flower_grpc.grpc._module is grpc
    for insecure, certificates in ((True, None), (False, None)):
        channel = flower_grpc.create_channel("127.0.0.1:9092", insecure=insecure, root_certificates=certificates)
        assert isinstance(channel, grpc.Channel)
        channel.close()
    assert [target for target, _ in opened] == ["127.0.0.1:9092"] * 2
    for _, options in opened:
        given = dict(options)
        assert given["grpc.max_reconnect_backoff_ms"] == 2000 and given["grpc.initial_reconnect_backoff_ms"] == 250
        assert given["grpc.max_send_message_length"] == given["grpc.max_receive_message_length"] > 0  # Flower's
        assert len(given) == len(options)  # no option given twice


def test_polling_grid_bounds_the_pull_of_a_replys_objects_by_the_round_timeout() -> None:
    """A reply whose SuperNode died while pushing it has a header and no arrays: each pull of its objects is given
    at most what is left of the round's timeout (Flower's own limit is 2 h), and Flower's limit is back afterwards."""
    from flwr.supercore.inflatable import inflatable_utils

    now, slept, clock, _ = _fake_time()
    limits: list[float | None] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    class Recording(_FakeGrid):
        def pull_messages(self, message_ids):
            limits.append(inflatable_utils.pull_objects.__kwdefaults__["max_time"])
            return super().pull_messages(message_ids)

    flowers = inflatable_utils.pull_objects.__kwdefaults__["max_time"]
    grid = PollingGrid(Recording(now, {"m1": 100.0, "m2": 1e9}), sleep=sleep, clock=clock)
    grid.send_and_receive(_messages(1, 2), timeout=20.0)
    assert limits[0] == pytest.approx(20.0) and limits[-1] == pytest.approx(1.0)  # never below MIN_OBJECT_PULL
    assert all(a >= b for a, b in itertools.pairwise(limits))
    assert inflatable_utils.pull_objects.__kwdefaults__["max_time"] == flowers
    PollingGrid(Recording(now, {"m1": 100.0}), sleep=sleep, clock=clock).send_and_receive(_messages(1), timeout=None)
    assert limits[-1] == flowers  # no timeout: Flower's limit


def test_bounded_object_pulls_give_up_on_objects_that_never_come() -> None:
    """Flower's `pull_objects` (as the ServerApp's Grid calls it) raises ObjectPullError once the bound is spent,
    which Flower's Grid turns into an error reply; unbounded it would retry for hours."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError

    from silofl.server.polling import bounded_object_pulls

    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    with bounded_object_pulls(0.2), pytest.raises(ObjectPullError):
        inflatable_utils.pull_objects(["abc"], pull_object_fn=never)


@pytest.mark.slow
def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on() -> None:
    """How a failed deployment test (tests/system/test_deploy_faults.py `_logs`) or an operator sees where a node
    waits."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(rt.__file__).resolve().parents[1]
    code = "from client.supernode.stack_dumps import dump_stacks_on_signal as d\nd()\nimport time\ntime.sleep(4)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    os.kill(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # the signal did not end it
    assert "most recent call first" in err and "<module>" in err
