"""The processes of a local deployment, as the operating system sees them (Linux /proc): which of them run, what
runs below them, what they logged, their ports, and stopping them (SIGTERM, then SIGKILL).

Why apart from :mod:`silofl.server.deploy.local`: `up`, `restart` and `down` decide what to start and stop; this
module only knows pids. A pid is recorded with its start time (:class:`ProcessInfo`), so that a recycled pid is
never taken for ours, and below a process counts what Flower started for it even once orphaned (a SuperExec's
``--parent-pid``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ProcessInfo",
    "alive",
    "descendants",
    "free_port",
    "live",
    "log_since",
    "log_tail",
    "port_open",
    "proc_stat",
    "reap",
    "signal_all",
    "stop",
    "stop_with_leftovers",
]


@dataclass
class ProcessInfo:
    """One process a deployment started (`up`, `restart`), and what it takes to start it again."""

    name: str
    pid: int
    start_time: int  # /proc/<pid>/stat field 22: tells our process from a later one that reuses the pid
    log: str
    port: int = 0
    #: the exact command line, its working directory (also its FLWR_HOME) and the variables set on top of
    #: :func:`silofl.server.deploy.flower_setup.flower_env`: what `restart` runs again (empty in a deploy.json written
    #: before restarts existed)
    command: list[str] = field(default_factory=list)
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    #: the size of `log` when this process started (a restarted process appends to the log of its predecessor)
    log_start: int = 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a live process from /proc, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def alive(proc: ProcessInfo) -> bool:
    """Whether `proc` still runs: its pid is live, not a zombie, and started when `proc` did (not a reused pid)."""
    stat = proc_stat(proc.pid)
    return stat is not None and stat[0] != "Z" and stat[2] == proc.start_time


def _pid_namespace(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _parent_pid_arg(pid: int) -> int | None:
    """The `--parent-pid P` a Flower SuperExec was started with (it watches P): its Flower parent, even orphaned.

    Only for processes in our pid namespace: in a container, P is a pid of the container's namespace."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if b"--parent-pid" not in args or _pid_namespace(pid) != _pid_namespace("self"):
        return None
    with contextlib.suppress(ValueError, IndexError):
        return int(args[args.index(b"--parent-pid") + 1])
    return None


def descendants(roots: Sequence[ProcessInfo]) -> list[int]:
    """Every live process below `roots` in the process tree, counting a SuperExec as the child of its --parent-pid:
    a SuperNode that exits by itself leaves its SuperExec to init until the SuperExec notices. A root that is gone
    adopts only processes started after it (its pid may have been reused since)."""
    table: dict[int, tuple[int, int, int | None]] = {}  # pid -> (ppid, start time, --parent-pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None and stat[0] != "Z":
            table[int(entry.name)] = (stat[1], stat[2], _parent_pid_arg(int(entry.name)))
    dead_roots = {p.pid: p.start_time for p in roots if not alive(p)}
    children: dict[int, list[int]] = {}
    orphans: list[int] = []  # SuperExecs whose Flower parent (a root) is gone
    for pid, (ppid, started, parent_arg) in table.items():
        children.setdefault(ppid, []).append(pid)
        if parent_arg is not None and parent_arg != ppid:
            if parent_arg in table:
                children.setdefault(parent_arg, []).append(pid)
            elif parent_arg in dead_roots and started >= dead_roots[parent_arg]:
                orphans.append(pid)
    found: list[int] = []
    stack = [p.pid for p in roots if alive(p)] + orphans
    found += orphans
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.append(child)
                stack.append(child)
    return found


def log_tail(path: str | Path, lines: int = 15) -> str:
    """The last `lines` lines of the log at `path` (for an error message), "(no log)" if there is none."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def log_since(proc: ProcessInfo) -> str:
    """What `proc` wrote to its log (not its predecessors' lines, when it is a restarted process)."""
    try:
        with open(proc.log, "rb") as fh:
            fh.seek(proc.log_start)
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def signal_all(pids: Sequence[int], sig: int) -> None:
    """Send `sig` to each of `pids` that still exists (and may be signalled)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def reap(pids: Sequence[int]) -> None:
    """Collect the exit status of our own children (a zombie would look alive to `kill -0`)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def live(pids: Sequence[int]) -> list[int]:
    """Those of `pids` that run (not gone, not zombies)."""
    return [pid for pid in pids if (stat := proc_stat(pid)) is not None and stat[0] != "Z"]


def stop(pids: list[int], grace: float) -> list[int]:
    """SIGTERM `pids`, wait up to `grace` seconds, SIGKILL the rest; the pids that needed SIGKILL."""
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap(pids)
        if not live(pids):
            return []
        time.sleep(0.1)
    killed = live(pids)
    signal_all(killed, signal.SIGKILL)
    for _ in range(50):
        reap(killed)
        if not live(killed):
            break
        time.sleep(0.1)
    return killed


def stop_with_leftovers(proc: ProcessInfo, grace: float) -> list[int]:
    """Stop `proc` if it runs, and whatever of it is left (SuperExec, ServerApp, ClientApp processes: a killed
    SuperLink's ServerApp may still be writing the run's out-dir, which a resumed run writes too); the pids."""
    ours = [proc.pid] if alive(proc) else []
    pids = ours + [pid for pid in descendants([proc]) if pid not in ours]
    stop(pids, grace)
    return pids
