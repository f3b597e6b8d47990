"""Bring a deployed federation up on one machine (loopback): a Flower SuperLink and N SuperNodes as processes.

This is the real deployment runtime (gRPC Fleet API, TLS and SuperNode authentication) with every site on
localhost: the documented "bring up / submit / collect / tear down" path, and
what the loopback tests and `benchmarks/deployment.py` run. The SuperNodes are N silos (`silo_k`), or with a
`topology` other than ``silos`` (`server.deploy.topology`) N feature parties (`features_k`) and the topology's
sensitive parties (`sensitive_c`), each started with its role (`silofl silo start` reads it from the party folder).
`runtime` is `silofl silo start --runtime` for every SuperNode (:data:`client.silo_cli.RUNTIMES`: silofl's SuperNode
with one long-lived ClientApp process, the default; the same with a ClientApp process per message; Flower's stock
SuperNode); with one of silofl's, the SuperLink's SuperExec also polls for new ServerApp runs every
:data:`SUPERLINK_SUPEREXEC_POLL` s instead of Flower's 1 s. Layout of DIR:

* `certs/`: from :func:`server.deploy.certs.make_certs` (reused if present, completed with missing nodes' key
  pairs), unless insecure;
* `data/silo_k/` (or `data/features_k/`, `data/sensitive_c/`): the nodes' folders when no split is given (the
  embedded synthetic dataset, as `silofl data split synthetic --silos N [--topology T]` writes it);
* `superlink/`: the SuperLink's FLWR_HOME (it installs each submitted app under `apps/`) and working directory:
  the ServerApp runs there, so a relative run-config `out-dir` lands under `DIR/superlink/`;
* `silo_k/` (`features_k/`, `sensitive_c/`): that SuperNode's FLWR_HOME and working directory;
* `state/`: what must outlive the processes (owner-only): `state/superlink.db`, the SuperLink's database
  (`--database`: registered SuperNode keys, runs, messages), and `state/silo_k/` (`state/features_k/`, ...), each
  node's `state-dir` (node config): its privacy ledger and journaled answers (:mod:`client.privacy_state`), so that a
  node restarted mid-run continues the run, and a run resumed after a SuperLink restart finds every node's ledger;
* `logs/`: one log per process (a restarted process appends to its log); `flwr_home/config.toml`: the
  `silofl-local` connection for `flwr run`;
* `deploy.json`: pids (with their start times, so a recycled pid is never signalled), ports, paths, and each
  process's exact command line and working directory, which :func:`restart` starts again.

A process that died (killed, its machine restarted) comes back with :func:`restart` (`silofl deploy restart --dir
DIR [--node NAME ...]`): the same command, the same state folder or database. SuperNodes that lost a restarted
SuperLink reconnect to it by themselves (Flower retries, at most 20 s apart) since the database kept their
registrations; a run that stopped continues with `resume` (docs/FAULTS.md).

Every process is started in its own session (process group = its pid): `down` signals each group, and any
process that descends from ours (Flower's SuperExec, ServerApp and ClientApp processes), SIGTERM first, SIGKILL
after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from silofl.client.silo_cli import DEFAULT_RUNTIME, RUNTIME_ENV, RUNTIMES
from silofl.server.deploy.topology import NodeLayout, TopologyError, node_layout

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
    "start_supernode",
    "up",
    "write_connection_config",
]

CONNECTION = "silofl-local"
STATE_FILE = "deploy.json"
#: DIR/state: the SuperLink's database and every node's state-dir, kept across restarts and `down`/`up`.
STATE_DIR = "state"
#: The SuperLink's database file in DIR/state (`flower-superlink --database`).
DATABASE_FILE = "superlink.db"
STARTUP_TIMEOUT = 60.0
#: FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the SuperLink (its SuperExec starts each run's ServerApp): a run starts
#: within 0.5 s of `flwr run` instead of 1 s; idle, two local HTTP requests a second (0.1 s would cost ~1% of a core
#: idle, measured with benchmarks/deployment.py's idle CPU).
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPERLINK_SUPEREXEC_POLL = "0.5"


class DeployError(RuntimeError):
    """A deployment step failed; the message names the step and, for a process, the tail of its log."""


@dataclass
class ProcessInfo:
    """One process `up` (or `restart`) started, and what it takes to start it again."""

    name: str
    pid: int
    start_time: int  # /proc/<pid>/stat field 22: tells our process from a later one that reuses the pid
    log: str
    port: int = 0
    #: the exact command line, its working directory (also its FLWR_HOME) and the variables set on top of
    #: :func:`flower_env`: what :func:`restart` runs again (empty in a deploy.json written before restarts existed)
    command: list[str] = field(default_factory=list)
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    #: the size of `log` when this process started (a restarted process appends to the log of its predecessor)
    log_start: int = 0


@dataclass
class Deployment:
    """What `up` started and where; saved as DIR/deploy.json."""

    dir: str
    insecure: bool
    fleet_address: str
    control_address: str
    flwr_home: str
    connection: str = CONNECTION
    certs: str = ""
    data: str = ""
    processes: list[ProcessInfo] = field(default_factory=list)
    topology: str = "silos"
    sensitive_parties: int = 0
    runtime: str = DEFAULT_RUNTIME
    #: the SuperLink's database (`--database`) and the folder of every node's state-dir ("" before they existed)
    database: str = ""
    state: str = ""

    def save(self) -> None:
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path) -> Deployment:
        path = Path(directory) / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise DeployError(
                f"{path}: missing; nothing was started in {directory} (or it was already stopped)"
            ) from None
        except json.JSONDecodeError as exc:
            raise DeployError(f"{path}: corrupt ({exc}); stop the processes by the pids in DIR/logs") from exc
        raw["processes"] = [ProcessInfo(**p) for p in raw.get("processes", [])]
        return cls(**raw)

    def submit_command(self, out_dir: str = "/abs/path/to/out") -> str:
        """The shell command that submits a run of the app in the current directory to this federation (with
        parties, its run config names the algorithm that runs on them and the topology)."""
        return (
            f"FLWR_HOME={self.flwr_home} flwr run . {self.connection} --stream "
            f"--run-config '{self.layout.run_config()} out-dir=\"{out_dir}\"'"
        )

    @property
    def num_silos(self) -> int:
        """The silos, or the feature parties (the run config's `num-silos`)."""
        prefix = "silo_" if self.topology == "silos" else "features_"
        return sum(1 for p in self.processes if p.name.startswith(prefix))

    @property
    def layout(self) -> NodeLayout:
        """The nodes this deployment runs (its topology)."""
        return NodeLayout(self.topology, self.num_silos, self.sensitive_parties)

    def process(self, name: str) -> ProcessInfo:
        """The process called `name` (superlink, silo_0, ...); DeployError naming the deployment's processes."""
        for proc in self.processes:
            if proc.name == name:
                return proc
        known = ", ".join(p.name for p in self.processes) or "none"
        raise DeployError(f"{self.dir} has no process named {name!r}; its processes: {known}")

    def replace(self, proc: ProcessInfo) -> None:
        """Record `proc` in place of the process of the same name (a restart) and save deploy.json."""
        self.processes = [proc if p.name == proc.name else p for p in self.processes]
        self.save()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bin_dir() -> Path:
    """The environment's scripts folder (flower-superlink, flwr, ...): the one this Python runs from."""
    return Path(sys.executable).parent


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for a Flower process: its own FLWR_HOME, this environment's scripts first on PATH, no installs."""
    env = dict(os.environ)
    env.update(RUNTIME_ENV)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = f"{_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    # The ServerApp and ClientApp processes import silofl: make the project importable even if not pip-installed.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a live process from /proc, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def _alive(proc: ProcessInfo) -> bool:
    stat = _proc_stat(proc.pid)
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


def _descendants(roots: Sequence[ProcessInfo]) -> list[int]:
    """Every live process below `roots` in the process tree, counting a SuperExec as the child of its --parent-pid:
    a SuperNode that exits by itself leaves its SuperExec to init until the SuperExec notices. A root that is gone
    adopts only processes started after it (its pid may have been reused since)."""
    table: dict[int, tuple[int, int, int | None]] = {}  # pid -> (ppid, start time, --parent-pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None and stat[0] != "Z":
            table[int(entry.name)] = (stat[1], stat[2], _parent_pid_arg(int(entry.name)))
    dead_roots = {p.pid: p.start_time for p in roots if not _alive(p)}
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
    stack = [p.pid for p in roots if _alive(p)] + orphans
    found += orphans
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.append(child)
                stack.append(child)
    return found


def _log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _spawn(
    name: str, command: list[str], *, cwd: Path, log: Path, port: int = 0, env: dict[str, str] | None = None
) -> ProcessInfo:
    """Start `command` in its own session, in `cwd` with :func:`flower_env` (FLWR_HOME = `cwd`) plus `env`, its
    output appended to `log` after a `$ command` line; everything :func:`restart` needs is in the result."""
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
    stat = _proc_stat(proc.pid)
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


def _log_since(proc: ProcessInfo) -> str:
    """What `proc` wrote to its log (not its predecessors' lines, when it is a restarted process)."""
    try:
        with open(proc.log, "rb") as fh:
            fh.seek(proc.log_start)
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _wait_until(check, proc: ProcessInfo, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not _alive(proc):
            raise DeployError(
                f"{proc.name} exited while {what}; its log ({proc.log}) ends with:\n{_log_tail(proc.log)}"
            )
        time.sleep(0.2)
    raise DeployError(f"{proc.name}: timed out after {timeout:.0f} s {what}; log {proc.log}:\n{_log_tail(proc.log)}")


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def write_connection_config(
    flwr_home: Path,
    address: str,
    *,
    root_certificates: Path | None = None,
    insecure: bool = False,
    name: str = CONNECTION,
) -> Path:
    """Write FLWR_HOME/config.toml with one SuperLink connection `name` (also the default) for `flwr run`."""
    import tomli_w  # ships with flwr (its own config writer)

    if insecure == (root_certificates is not None):
        raise DeployError("a connection is either insecure or has root certificates (the CA), not both or neither")
    connection: dict[str, object] = {"address": address}
    if insecure:
        connection["insecure"] = True
    else:
        connection["root-certificates"] = str(Path(root_certificates).resolve())
    flwr_home = Path(flwr_home)
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: connection}}))
    return path


#: What `flwr supernode register` answers (Flower 1.39, code 23) for a key the SuperLink's database already holds.
ALREADY_REGISTERED = "Public key already in use"


def register_supernodes(public_keys: Sequence[Path], flwr_home: Path, connection: str = CONNECTION) -> list[int | None]:
    """Register SuperNode public keys on the SuperLink (`flwr supernode register`); their node ids, in order, None
    for a key the SuperLink already knows (its database kept it: a restarted SuperLink, `up` again after `down`)."""
    env = flower_env(Path(flwr_home))
    node_ids: list[int | None] = []
    for key in public_keys:
        command = [str(_bin_dir() / "flwr"), "supernode", "register", str(key), connection, "--format", "json"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
        start = done.stdout.find("{")
        reply = json.loads(done.stdout[start:]) if start >= 0 else {}
        if done.returncode == 0 and not reply.get("success") and ALREADY_REGISTERED in str(reply.get("error-message")):
            node_ids.append(None)
            continue
        if done.returncode != 0 or not reply.get("success"):
            raise DeployError(
                f"registering {key} failed (exit {done.returncode}): {(done.stdout + done.stderr).strip()[-800:]}"
            )
        node_ids.append(int(reply["node-id"]))
    return node_ids


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
        state_dir = _private_dir(Path(dep.state or root / STATE_DIR) / name)
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
        supernode_executable=str(_bin_dir() / "flower-supernode"),
        state_dir=state_dir,
        policy=policy,
        party_keys=party_keys,
    )
    command = supernode_command(args)
    return _spawn(name, command, cwd=root / name, log=root / "logs" / f"{name}.log", port=port)


def _private_dir(path: Path) -> Path:
    """`path`, created readable by its owner only (a state-dir holds a silo's ledger and answers)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def wait_for_supernode(proc: ProcessInfo, timeout: float = STARTUP_TIMEOUT) -> None:
    """Until the SuperNode has been accepted by the SuperLink (it logs its node id; a restarted one, after its
    start); DeployError if it exits."""
    _wait_until(lambda: "SuperNode ID:" in _log_since(proc), proc, "connecting to the SuperLink", timeout)


def _silo_folders(data: Path | None, silos: int, root: Path) -> list[Path]:
    from silofl.client.data.silo_store import load_silo
    from silofl.client.data.tabular import DataError

    if data is None:
        from silofl.client.data.federate import load_federation
        from silofl.client.data.silo_store import save_silo

        data = root / "data"
        if not all((data / f"silo_{k}" / "info.json").is_file() for k in range(silos)):
            _, parts = load_federation("synthetic", silos)
            for k, silo in enumerate(parts):
                save_silo(silo, data / f"silo_{k}")
    folders = [Path(data).resolve() / f"silo_{k}" for k in range(silos)]
    for folder in folders:
        try:
            silo = load_silo(folder)
        except DataError as exc:
            hint = (
                "; it holds party folders (features_*, sensitive_*): pass the --topology it was split with"
                if (Path(data) / "features_0").is_dir()
                else ""
            )
            raise DeployError(
                f"--data: {exc} (expected silo_0 ... silo_{silos - 1} from `silofl data split`{hint})"
            ) from None
        if silo.num_silos != silos:
            raise DeployError(f"--data: {folder} is one of {silo.num_silos} silos, but --silos is {silos}")
    return folders


def _party_folders(data: Path | None, layout: NodeLayout, root: Path) -> list[Path]:
    """The folders of `layout`'s parties (features_k, sensitive_c): `data`'s, checked, or (`data` None) the embedded
    synthetic dataset split as `silofl data split synthetic --silos N --topology T` does, into DIR/data."""
    from silofl.client.data.party_store import load_party, read_party_info
    from silofl.client.data.tabular import DataError

    def fits(folder: Path, role: str, party_id: int) -> str:
        """What is wrong with `folder` as `role` party `party_id` of `layout` (empty if nothing)."""
        try:
            info = read_party_info(folder)
        except DataError as exc:
            return str(exc)
        count = layout.silos if role == "features" else layout.sensitive
        if info["role"] != role or info["party_id"] != party_id or info["num_parties"] != count:
            kind = {"features": "feature", "sensitive": "sensitive"}
            return (
                f"{folder} is {kind[info['role']]} party {info['party_id']} of {info['num_parties']}, but --topology "
                f"{layout.topology} with --silos {layout.silos} needs {kind[role]} party {party_id} of {count} here"
            )
        return ""

    if data is None:
        data = root / "data"
        if any(fits(data / name, role, k) for name, role, k in layout.nodes):
            _write_synthetic_parties(data, layout)
    data = Path(data).resolve()
    expected = (
        f"expected {', '.join(layout.names)} from `silofl data split DATASET --silos {layout.silos} --topology "
        f"{layout.topology}{f' --sensitive-parties {layout.sensitive}' if layout.topology == 'general' else ''}`"
    )
    if not any((data / name).is_dir() for name in layout.names) and (data / "silo_0").is_dir():
        raise DeployError(
            f"--data {data} holds silo folders (silo_0, ...) but --topology is {layout.topology}: drop --topology to "
            f"deploy silos, or {expected}"
        )
    folders = []
    for name, role, k in layout.nodes:
        folder = data / name
        problem = fits(folder, role, k)
        if not problem:
            try:
                load_party(folder, role=role)  # every file, not just info.json: a bad folder fails here
            except DataError as exc:
                problem = str(exc)
        if problem:
            raise DeployError(f"--data: {problem} ({expected})")
        folders.append(folder)
    return folders


def _write_synthetic_parties(out: Path, layout: NodeLayout) -> None:
    """`silofl data split synthetic --silos N --topology T [--sensitive-parties S] --out OUT`, with its defaults."""
    from silofl.client.data.loaders import load_dataset
    from silofl.client.data.party_store import save_party
    from silofl.client.data.topology import split_parties

    ds = load_dataset("synthetic", seed=0)
    features, sensitive = split_parties(
        ds, layout.topology, feature_parties=layout.silos, sensitive_parties=layout.sensitive, seed=0
    )
    for party in features:
        save_party(party, out / f"features_{party.party_id}", num_parties=len(features))
    for party in sensitive:
        save_party(party, out / f"sensitive_{party.party_id}", num_parties=len(sensitive))


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
        if any(_alive(p) for p in old.processes):
            raise DeployError(f"{root} already runs a federation; `silofl deploy down --dir {root}` first")
    if policy is not None:
        from silofl.protocols.silo_policy import PolicyError, load_policy

        try:
            load_policy(policy)
        except PolicyError as exc:
            raise DeployError(f"--policy: {exc}") from None
        policy = Path(policy).resolve()
    folders = _party_folders(data, layout, root) if layout.parties else _silo_folders(data, silos, root)

    certs = CertPaths.layout(root / "certs", silos, topology=topology, sensitive_parties=sensitive_parties)
    if not insecure:
        try:
            certs = ensure_certs(certs.out, silos, topology=topology, sensitive_parties=sensitive_parties)
        except CertError as exc:
            raise DeployError(f"certificates: {exc}") from None
    ensure_party_keys(certs)
    fleet_port, control_port = free_port(), free_port()
    state = _private_dir(root / STATE_DIR)
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
        str(_bin_dir() / "flower-superlink"),
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
        link = _spawn(
            "superlink",
            command,
            cwd=root / "superlink",
            env=link_env,
            log=root / "logs" / "superlink.log",
            port=fleet_port,
        )
        dep.processes.append(link)
        dep.save()
        _wait_for_superlink(dep, link, timeout)
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
                start_supernode(dep, name, folder, auth_key=key, role=role, policy=policy, party_keys=party_keys)
            )
            dep.save()
        for proc in list(dep.processes[1:]):
            # a node of this folder's database killed less than a minute ago (e.g. by `down`'s SIGKILL) still
            # counts as online there: started again until it is accepted, as by `restart`
            _wait_for_restarted_supernode(dep, proc, timeout, say=lambda text: None)
    except BaseException:
        down(root)
        raise
    return dep


def _port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def _wait_for_superlink(dep: Deployment, link: ProcessInfo, timeout: float) -> None:
    """Until the SuperLink's Fleet and Control APIs accept connections; DeployError if it exits."""
    fleet, control = _port_of(dep.fleet_address), _port_of(dep.control_address)
    _wait_until(lambda: _port_open(fleet) and _port_open(control), link, "starting its Fleet and Control APIs", timeout)


def _stop_with_leftovers(proc: ProcessInfo, grace: float) -> list[int]:
    """Stop `proc` if it runs, and whatever of it is left (SuperExec, ServerApp, ClientApp processes: a killed
    SuperLink's ServerApp may still be writing the run's out-dir, which a resumed run writes too); the pids."""
    ours = [proc.pid] if _alive(proc) else []
    pids = ours + [pid for pid in _descendants([proc]) if pid not in ours]
    _stop(pids, grace)
    return pids


#: How long Flower 1.39's SuperLink keeps counting a SuperNode that died as online (its last heartbeat plus
#: HEARTBEAT_PATIENCE 2 x HEARTBEAT_DEFAULT_INTERVAL 30 s): until then it refuses to activate the node again.
NODE_STAYS_ONLINE = 60.0
#: What a SuperNode logs (exit code 305) when the SuperLink refuses to activate it, e.g. because it still counts the
#: node's previous process as online.
ACTIVATION_REFUSED = "Failed to activate SuperNode"
#: Pause between two starts of a SuperNode whose activation was refused.
ACTIVATION_RETRY = 5.0


def _respawn(proc: ProcessInfo) -> ProcessInfo:
    return _spawn(proc.name, proc.command, cwd=Path(proc.cwd), log=Path(proc.log), port=proc.port, env=proc.env)


def _wait_for_restarted_supernode(
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
            _reap([proc.pid])
            if ACTIVATION_REFUSED not in _log_since(proc) or time.monotonic() > deadline:
                raise
        if not told:
            say(
                f"{proc.name}: the SuperLink still counts its previous process as online (for up to "
                f"{NODE_STAYS_ONLINE:.0f} s after it died, until its heartbeats run out) and refuses it; starting it "
                f"again every {ACTIVATION_RETRY:.0f} s until it is accepted"
            )
            told = True
        time.sleep(ACTIVATION_RETRY)
        proc = _respawn(proc)
        dep.replace(proc)


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
        _reap([proc.pid])  # a process of ours that died is a zombie until collected
    if names:
        targets = [dep.process(name) for name in dict.fromkeys(names)]
    else:
        targets = [p for p in dep.processes if not _alive(p)]
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
        _stop_with_leftovers(proc, grace)
        new = _respawn(proc)
        dep.replace(new)
        started.append(new)
        if new.name == "superlink":
            _wait_for_superlink(dep, new, timeout)
            if not dep.insecure:
                keys = [Path(dep.certs) / f"{p.name}.pub" for p in dep.processes if p.name != "superlink"]
                register_supernodes([k for k in keys if k.is_file()], Path(dep.flwr_home), dep.connection)
    return [p if p.name == "superlink" else _wait_for_restarted_supernode(dep, p, timeout, say) for p in started]


def status(directory: Path) -> list[tuple[ProcessInfo, bool]]:
    """Every process of the deployment in `directory`, and whether it runs."""
    dep = Deployment.load(Path(directory).resolve())
    for proc in dep.processes:
        _reap([proc.pid])
    return [(proc, _alive(proc)) for proc in dep.processes]


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(pids: Sequence[int]) -> None:
    """Collect the exit status of our own children (a zombie would look alive to `kill -0`)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _live(pids: Sequence[int]) -> list[int]:
    return [pid for pid in pids if (stat := _proc_stat(pid)) is not None and stat[0] != "Z"]


def _stop(pids: list[int], grace: float) -> list[int]:
    """SIGTERM `pids`, wait up to `grace` seconds, SIGKILL the rest; the pids that needed SIGKILL."""
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pids)
        if not _live(pids):
            return []
        time.sleep(0.1)
    killed = _live(pids)
    _signal(killed, signal.SIGKILL)
    for _ in range(50):
        _reap(killed)
        if not _live(killed):
            break
        time.sleep(0.1)
    return killed


def down(directory: Path, grace: float = 10.0) -> list[int]:
    """Stop what `up` started in `directory` (SuperNodes first, then the SuperLink); the pids that were signalled."""
    root = Path(directory).resolve()
    dep = Deployment.load(root)
    signalled: list[int] = []
    supernodes = [p for p in dep.processes if p.name != "superlink"]
    link = [p for p in dep.processes if p.name == "superlink"]
    for group in (supernodes, link):
        ours = [p.pid for p in group if _alive(p)]
        # Flower's own children (SuperExec, ServerApp, ClientApp processes); the SuperLink's SuperExec starts its
        # own session, so a process-group signal would miss it.
        pids = ours + [pid for pid in _descendants(group) if pid not in ours]
        _stop(pids, grace)
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
