"""Bring a deployed federation up on one machine (loopback): a Flower SuperLink and N SuperNodes as processes.

This is the real deployment runtime (gRPC Fleet API, TLS and SuperNode authentication) with every site on
localhost: the documented "bring up / submit / collect / tear down" path, and
what the loopback tests and `benchmarks/deployment.py` run. The SuperNodes are N silos (`silo_k`), or with a
`topology` other than ``silos`` (`server.deploy.topology`) N feature parties (`features_k`) and the topology's
sensitive parties (`sensitive_c`), each started with its role (`silofl silo start` reads it from the party folder).
`runtime` is `silofl silo start --runtime` for every SuperNode (:data:`client.silo_cli.RUNTIMES`: silofl's SuperNode
with one long-lived ClientApp process, the default; the same with a ClientApp process per message; Flower's stock
SuperNode); with one of silofl's, the SuperLink's SuperExec also polls for new ServerApp runs every
:data:`SUPERLINK_SUPEREXEC_POLL` s instead of Flower's 1 s. DIR's layout and its record, DIR/deploy.json, are
:mod:`silofl.server.deploy.deployment`'s.

A process that died (killed, its machine restarted) comes back with :func:`restart` (`silofl deploy restart --dir
DIR [--node NAME ...]`): the same command, the same state folder or database. SuperNodes that lost a restarted
SuperLink reconnect to it by themselves (Flower retries, at most 20 s apart) since the database kept their
registrations; a run that stopped continues with `resume` (docs/FAULTS.md).

Every process is started in its own session (process group = its pid): `down` signals each group, and any
process that descends from ours (Flower's SuperExec, ServerApp and ClientApp processes), SIGTERM first, SIGKILL
after a grace period.

Where. This module decides what to start, restart and stop, and in which order; starting one process and waiting
until it is up is :mod:`silofl.server.deploy.launch`'s, the deployment's record :mod:`silofl.server.deploy.deployment`,
its processes as the operating system sees them (alive, descendants, logs, ports, stopping)
:mod:`silofl.server.deploy.processes`, what its Flower processes and commands are given
:mod:`silofl.server.deploy.flower_setup`, and its nodes' data folders :mod:`silofl.server.deploy.node_folders`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from silofl.client.silo_cli import DEFAULT_RUNTIME, RUNTIMES
from silofl.server.deploy import launch
from silofl.server.deploy.deployment import CONNECTION, DATABASE_FILE, STATE_DIR, STATE_FILE, DeployError, Deployment
from silofl.server.deploy.flower_setup import bin_dir, flower_env, register_supernodes, write_connection_config
from silofl.server.deploy.launch import STARTUP_TIMEOUT, start_supernode
from silofl.server.deploy.node_folders import party_folders, silo_folders
from silofl.server.deploy.processes import ProcessInfo, alive, descendants, free_port, reap, stop, stop_with_leftovers
from silofl.server.deploy.topology import TopologyError, node_layout

__all__ = [
    "CONNECTION",
    "DeployError",
    "Deployment",
    "ProcessInfo",
    "down",
    "flower_env",
    "free_port",
    "register_supernodes",
    "restart",
    "running",
    "start_supernode",
    "status",
    "up",
    "write_connection_config",
]


#: FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the SuperLink (its SuperExec starts each run's ServerApp): a run starts
#: within 0.5 s of `flwr run` instead of 1 s; idle, two local HTTP requests a second (0.1 s would cost ~1% of a core
#: idle, measured with benchmarks/deployment.py's idle CPU).
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPERLINK_SUPEREXEC_POLL = "0.5"


def up(
    directory: Path,
    silos: int,
    *,
    data: Path | None = None,
    insecure: bool = False,
    timeout: float = STARTUP_TIMEOUT,
    topology: str = "silos",
    sensitive_parties: int | None = None,
    runtime: str = DEFAULT_RUNTIME,
    database: bool = True,
    policy: Path | None = None,
) -> Deployment:
    """Start a SuperLink (TLS + SuperNode authentication unless `insecure`) and the SuperNodes of `topology` on
    loopback: `silos` silos, or `silos` feature parties and the topology's sensitive parties (`sensitive_parties`
    for topology general), each with its own key pair and its role, each run by `runtime` (`silofl silo start
    --runtime`), each with its state-dir DIR/state/NAME.

    The SuperLink keeps its state in DIR/state/superlink.db (`--database`) unless `database` is False (`silofl
    deploy up --no-database`): then in memory, which makes rounds cheaper (its SQLite state costs CPU on every poll
    of every SuperNode: docs/DEPLOYMENT.md) but forgets the registrations when it restarts (:func:`restart` then
    starts the SuperNodes again too). `policy` (`silofl deploy up --policy FILE`) is every node's operator policy,
    as `silofl silo start --policy` gives it to one node: read and checked before anything starts.

    Returns once every SuperNode has joined. On any failure everything started so far is stopped again.
    """
    from silofl.server.deploy.certs import CertError, CertPaths, ensure_certs, ensure_party_keys

    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise DeployError(f"--silos must be a positive integer, got {silos!r}")
    if runtime not in RUNTIMES:
        raise DeployError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    try:
        layout = node_layout(silos, topology, sensitive_parties)
    except TopologyError as exc:
        raise DeployError(str(exc)) from None
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if (root / STATE_FILE).exists():
        old = Deployment.load(root)
        if any(alive(p) for p in old.processes):
            raise DeployError(f"{root} already runs a federation; `silofl deploy down --dir {root}` first")
    if policy is not None:
        from silofl.protocols.silo_policy import PolicyError, load_policy

        try:
            load_policy(policy)
        except PolicyError as exc:
            raise DeployError(f"--policy: {exc}") from None
        policy = Path(policy).resolve()
    folders = party_folders(data, layout, root) if layout.parties else silo_folders(data, silos, root)

    certs = CertPaths.layout(root / "certs", silos, topology=topology, sensitive_parties=sensitive_parties)
    if not insecure:
        try:
            certs = ensure_certs(certs.out, silos, topology=topology, sensitive_parties=sensitive_parties)
        except CertError as exc:
            raise DeployError(f"certificates: {exc}") from None
    ensure_party_keys(certs)
    fleet_port, control_port = free_port(), free_port()
    state = launch.private_dir(root / STATE_DIR)
    dep = Deployment(
        dir=str(root),
        insecure=insecure,
        fleet_address=f"127.0.0.1:{fleet_port}",
        control_address=f"127.0.0.1:{control_port}",
        flwr_home=str(root / "flwr_home"),
        certs="" if insecure else str(certs.out),
        data=str(folders[0].parent),
        topology=layout.topology,
        sensitive_parties=layout.sensitive,
        runtime=runtime,
        database=str(state / DATABASE_FILE) if database else "",
        state=str(state),
    )
    command = [
        str(bin_dir() / "flower-superlink"),
        "--fleet-api-address", dep.fleet_address,
        "--host", "127.0.0.1",
        "--port", str(control_port),
        *(["--database", dep.database] if dep.database else []),
        "--disable-runtime-dependency-installation",
    ]  # fmt: skip
    if insecure:
        command.append("--insecure")
    else:
        command += [
            "--ssl-ca-certfile", str(certs.ca_cert),
            "--ssl-certfile", str(certs.superlink_cert),
            "--ssl-keyfile", str(certs.superlink_key),
            "--enable-supernode-auth",
        ]  # fmt: skip
    try:
        link_env = {}
        if runtime != "flower" and SUPEREXEC_POLL_ENV not in os.environ:
            link_env[SUPEREXEC_POLL_ENV] = SUPERLINK_SUPEREXEC_POLL
        link = launch.spawn(
            "superlink",
            command,
            cwd=root / "superlink",
            env=link_env,
            log=root / "logs" / "superlink.log",
            port=fleet_port,
        )
        dep.processes.append(link)
        dep.save()
        launch.wait_for_superlink(dep, link, timeout)
        write_connection_config(
            Path(dep.flwr_home),
            dep.control_address,
            root_certificates=None if insecure else certs.ca_cert,
            insecure=insecure,
        )
        if not insecure:
            register_supernodes(certs.silo_public_keys, Path(dep.flwr_home))
        for k, ((name, role, _), folder) in enumerate(zip(layout.nodes, folders, strict=True)):
            key = None if insecure else certs.silo_keys[k]
            party_keys = certs.party_key_file(name)
            dep.processes.append(
                launch.start_supernode(dep, name, folder, auth_key=key, role=role, policy=policy, party_keys=party_keys)
            )
            dep.save()
        for proc in list(dep.processes[1:]):
            # a node of this folder's database killed less than a minute ago (e.g. by `down`'s SIGKILL) still
            # counts as online there: started again until it is accepted, as by `restart`
            launch.wait_for_restarted_supernode(dep, proc, timeout, say=lambda text: None)
    except BaseException:
        down(root)
        raise
    return dep


def restart(
    directory: Path,
    names: Sequence[str] | None = None,
    *,
    timeout: float = STARTUP_TIMEOUT,
    grace: float = 10.0,
    say: Callable[[str], None] = lambda text: None,
) -> list[ProcessInfo]:
    """Start again the processes of the deployment in `directory` that are not running (`names` None), or the ones
    named (stopped first if they run), each with the exact command, working directory and environment it was
    started with: the SuperLink with its database, a SuperNode with its key and its state-dir. The restarted
    processes, once up (the SuperLink's APIs open, each SuperNode accepted by the SuperLink); `say` is told what
    takes time.

    The SuperLink goes first; its database still holds the SuperNodes' registrations (the keys are registered
    again all the same, which changes nothing if they are known: it repairs a deployment whose database was lost).
    SuperNodes that kept running reconnect to it by themselves; a SuperLink without a database (`up(...,
    database=False)`) has forgotten them, so they are started again too. What is left of a dead process (a ServerApp or
    ClientApp process it started) is stopped first. A SuperNode that died is refused by the SuperLink until its
    heartbeats have run out (Flower 1.39: up to 60 s); it is started again until it is accepted. A run that stopped
    is continued with `resume`.
    """
    root = Path(directory).resolve()
    dep = Deployment.load(root)
    for proc in dep.processes:
        reap([proc.pid])  # a process of ours that died is a zombie until collected
    if names:
        targets = [dep.process(name) for name in dict.fromkeys(names)]
    else:
        targets = [p for p in dep.processes if not alive(p)]
    old = [p.name for p in targets if not p.command]
    if old:
        raise DeployError(
            f"{root / STATE_FILE} does not record the command of {', '.join(old)} (written by an older silofl): "
            f"`silofl deploy down --dir {root}` and `silofl deploy up` again"
        )
    if not dep.database and any(p.name == "superlink" for p in targets):
        targets += [p for p in dep.processes if p.name != "superlink" and p not in targets]
    targets.sort(key=lambda p: p.name != "superlink")
    started: list[ProcessInfo] = []
    for proc in targets:
        stop_with_leftovers(proc, grace)
        new = launch.respawn(proc)
        dep.replace(new)
        started.append(new)
        if new.name == "superlink":
            launch.wait_for_superlink(dep, new, timeout)
            if not dep.insecure:
                keys = [Path(dep.certs) / f"{p.name}.pub" for p in dep.processes if p.name != "superlink"]
                register_supernodes([k for k in keys if k.is_file()], Path(dep.flwr_home), dep.connection)
    return [p if p.name == "superlink" else launch.wait_for_restarted_supernode(dep, p, timeout, say) for p in started]


def status(directory: Path) -> list[tuple[ProcessInfo, bool]]:
    """Every process of the deployment in `directory`, and whether it runs."""
    dep = Deployment.load(Path(directory).resolve())
    for proc in dep.processes:
        reap([proc.pid])
    return [(proc, alive(proc)) for proc in dep.processes]


def down(directory: Path, grace: float = 10.0) -> list[int]:
    """Stop what `up` started in `directory` (SuperNodes first, then the SuperLink); the pids that were signalled."""
    root = Path(directory).resolve()
    dep = Deployment.load(root)
    signalled: list[int] = []
    supernodes = [p for p in dep.processes if p.name != "superlink"]
    link = [p for p in dep.processes if p.name == "superlink"]
    for group in (supernodes, link):
        ours = [p.pid for p in group if alive(p)]
        # Flower's own children (SuperExec, ServerApp, ClientApp processes); the SuperLink's SuperExec starts its
        # own session, so a process-group signal would miss it.
        pids = ours + [pid for pid in descendants(group) if pid not in ours]
        stop(pids, grace)
        signalled += pids
    (root / STATE_FILE).rename(root / (STATE_FILE + ".stopped"))
    return signalled


@contextlib.contextmanager
def running(directory: Path, silos: int, **kwargs) -> Iterator[Deployment]:
    """`up` ... `down`, also on error: `with running(tmp, 3) as dep: ...`."""
    dep = up(directory, silos, **kwargs)
    try:
        yield dep
    finally:
        down(directory)
