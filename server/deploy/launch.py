"""Starting one process of a local deployment and waiting until it is up: the SuperLink (its APIs open) or a
SuperNode (accepted by the SuperLink, started again while the SuperLink still refuses a restarted node).

Every process is started in its own session, with Flower's environment, its output appended to its log, and
recorded with what it takes to start it again (:func:`spawn`); `up` and `restart` (:mod:`silofl.server.deploy.local`)
call these functions through this module, which is where a test replaces them.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from silofl.server.deploy.deployment import STATE_DIR, DeployError, Deployment
from silofl.server.deploy.flower_setup import bin_dir, flower_env
from silofl.server.deploy.processes import (
    ProcessInfo,
    alive,
    free_port,
    log_since,
    log_tail,
    port_open,
    proc_stat,
    reap,
)

__all__ = [
    "ACTIVATION_REFUSED",
    "ACTIVATION_RETRY",
    "NODE_STAYS_ONLINE",
    "STARTUP_TIMEOUT",
    "private_dir",
    "respawn",
    "spawn",
    "start_supernode",
    "wait_for_restarted_supernode",
    "wait_for_superlink",
    "wait_for_supernode",
]

#: Seconds a process is given to come up (the SuperLink's APIs open, a SuperNode accepted).
STARTUP_TIMEOUT = 60.0


def spawn(
    name: str, command: list[str], *, cwd: Path, log: Path, port: int = 0, env: dict[str, str] | None = None
) -> ProcessInfo:
    """Start `command` in its own session, in `cwd` with :func:`flower_env` (FLWR_HOME = `cwd`) plus `env`, its
    output appended to `log` after a `$ command` line; everything `restart` needs is in the result."""
    extra = dict(env or {})
    cwd.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        log_start = fh.tell()
        fh.write(f"$ {' '.join(command)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**flower_env(cwd), **extra},
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    stat = proc_stat(proc.pid)
    return ProcessInfo(
        name=name,
        pid=proc.pid,
        start_time=stat[2] if stat else 0,
        log=str(log),
        port=port,
        command=list(command),
        cwd=str(cwd),
        env=extra,
        log_start=log_start,
    )


def _wait_until(check: Callable[[], bool], proc: ProcessInfo, what: str, timeout: float) -> None:
    """Until `check()` holds; DeployError naming `what` and the tail of `proc`'s log if `proc` exits first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive(proc):
            raise DeployError(f"{proc.name} exited while {what}; its log ({proc.log}) ends with:\n{log_tail(proc.log)}")
        time.sleep(0.2)
    raise DeployError(f"{proc.name}: timed out after {timeout:.0f} s {what}; log {proc.log}:\n{log_tail(proc.log)}")


def start_supernode(
    dep: Deployment,
    name: str,
    data: Path,
    *,
    auth_key: Path | None,
    port: int | None = None,
    role: str | None = None,
    runtime: str | None = None,
    state_dir: Path | None = None,
    policy: Path | None = None,
    party_keys: Path | None = None,
) -> ProcessInfo:
    """Start one SuperNode (`silofl silo start`'s command) for `data` against `dep`'s SuperLink; not yet waited for.

    `role` (silo, features, sensitive) defaults to the one the folder's info.json names, as `silofl silo start`'s;
    `runtime` to the deployment's; `state_dir` (the node config's `state-dir`, where the node keeps its privacy
    ledger and journaled answers across restarts) to DIR/state/`name`; `policy` is the node's operator policy
    (`silofl silo start --policy`); `party_keys` a party's key file (`silofl silo start --party-keys`).
    """
    from argparse import Namespace

    from silofl.client.silo_cli import supernode_command

    root = Path(dep.dir)
    port = port or free_port()
    if state_dir is None:
        state_dir = private_dir(Path(dep.state or root / STATE_DIR) / name)
    args = Namespace(
        data=Path(data),
        superlink=dep.fleet_address,
        root_certificates=None if dep.insecure else Path(dep.certs) / "ca.crt",
        auth_key=None if dep.insecure else auth_key,
        insecure=dep.insecure,
        epsilon_budget=None,
        deterministic_noise=False,
        clientapp_port=port,
        role=role,
        runtime=runtime or dep.runtime,
        supernode_executable=str(bin_dir() / "flower-supernode"),
        state_dir=state_dir,
        policy=policy,
        party_keys=party_keys,
    )
    command = supernode_command(args)
    return spawn(name, command, cwd=root / name, log=root / "logs" / f"{name}.log", port=port)


def private_dir(path: Path) -> Path:
    """`path`, created readable by its owner only (a state-dir holds a silo's ledger and answers)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def wait_for_supernode(proc: ProcessInfo, timeout: float = STARTUP_TIMEOUT) -> None:
    """Until the SuperNode has been accepted by the SuperLink (it logs its node id; a restarted one, after its
    start); DeployError if it exits."""
    _wait_until(lambda: "SuperNode ID:" in log_since(proc), proc, "connecting to the SuperLink", timeout)


def _port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def wait_for_superlink(dep: Deployment, link: ProcessInfo, timeout: float) -> None:
    """Until the SuperLink's Fleet and Control APIs accept connections; DeployError if it exits."""
    fleet, control = _port_of(dep.fleet_address), _port_of(dep.control_address)
    _wait_until(lambda: port_open(fleet) and port_open(control), link, "starting its Fleet and Control APIs", timeout)


#: How long Flower 1.39's SuperLink keeps counting a SuperNode that died as online (its last heartbeat plus
#: HEARTBEAT_PATIENCE 2 x HEARTBEAT_DEFAULT_INTERVAL 30 s): until then it refuses to activate the node again.
NODE_STAYS_ONLINE = 60.0
#: What a SuperNode logs (exit code 305) when the SuperLink refuses to activate it, e.g. because it still counts the
#: node's previous process as online.
ACTIVATION_REFUSED = "Failed to activate SuperNode"
#: Pause between two starts of a SuperNode whose activation was refused.
ACTIVATION_RETRY = 5.0


def respawn(proc: ProcessInfo) -> ProcessInfo:
    """`proc` started again: its command, working directory, log and extra environment."""
    return spawn(proc.name, proc.command, cwd=Path(proc.cwd), log=Path(proc.log), port=proc.port, env=proc.env)


def wait_for_restarted_supernode(
    dep: Deployment, proc: ProcessInfo, timeout: float, say: Callable[[str], None]
) -> ProcessInfo:
    """Wait for a restarted SuperNode to be accepted; while the SuperLink still counts its dead predecessor as online
    (up to :data:`NODE_STAYS_ONLINE` s after it died) it refuses the node ("Failed to activate SuperNode"): start it
    again every :data:`ACTIVATION_RETRY` s until it is accepted. The process that was accepted."""
    deadline = time.monotonic() + max(timeout, NODE_STAYS_ONLINE + 15)
    told = False
    while True:
        try:
            wait_for_supernode(proc, timeout)
            return proc
        except DeployError:
            reap([proc.pid])
            if ACTIVATION_REFUSED not in log_since(proc) or time.monotonic() > deadline:
                raise
        if not told:
            say(
                f"{proc.name}: the SuperLink still counts its previous process as online (for up to "
                f"{NODE_STAYS_ONLINE:.0f} s after it died, until its heartbeats run out) and refuses it; starting it "
                f"again every {ACTIVATION_RETRY:.0f} s until it is accepted"
            )
            told = True
        time.sleep(ACTIVATION_RETRY)
        proc = respawn(proc)
        dep.replace(proc)
