"""`silofl silo start`: how one site joins a deployed federation by hand.

    silofl silo start --data DIR --superlink HOST:PORT [--root-certificates CA.crt --auth-key silo_k.key | --insecure]
        [--role silo|features|sensitive] [--epsilon-budget E] [--state-dir DIR] [--allow-trusted-server]
        [--deterministic-noise] [--clientapp-port N] [--runtime long-lived|per-message|flower] [--party-keys FILE]
        [--dry-run]

It loads the data folder (written by `silofl data split`) once, so that a bad folder fails here with the file named
instead of at the first message of a run, prints the exact SuperNode command and replaces itself with it
(`os.execve`): the SuperNode then owns the process id, its signals and its exit code.

`--runtime` chooses the SuperNode (:data:`RUNTIMES`). ``long-lived`` (the default) is Flower's `flower-supernode` run by
:mod:`silofl.client.supernode_runtime` (``python -m silofl.client.supernode_runtime supernode ...``, the same arguments,
in Flower's ``--isolation process`` mode): short, backing-off polls instead of Flower's 3 s and 0.5 s sleeps, and one
long-lived ClientApp process answering every message instead of a fresh process per message. ``per-message`` keeps the
short polls but answers each message in a fresh process, as Flower does. ``flower`` is Flower's stock
`flower-supernode`, untouched (a round then costs seconds; the fallback if the installed Flower is not one
:mod:`client.supernode_runtime` was checked against, which that module refuses naming this option).

The folder is a silo's (`silo_k`: both divisions of its records, role ``silo``) or a party's (`silofl data split
--topology ...` writes `features_k`: record ids, features and labels; `sensitive_c`: record ids and sensitive groups;
SteFFLe Section 4; docs/DEPLOYMENT.md, "Parties"). The node's role is the one the folder's info.json names; `--role`
states it explicitly and must agree with the folder (a bank's node started on the census bureau's data, or the other
way round, is refused here, before the SuperNode exists).

Secure by default: TLS (the federation's CA certificate, `--root-certificates`) and SuperNode authentication (the
site's OpenSSH ECDSA private key, `--auth-key`; its public key must be registered on the SuperLink with
`flwr supernode register silo_k.pub <connection>`). Flower 1.39 derives the public key from the private one and
deprecates `--auth-supernode-public-key`, so only the private key is passed. `--insecure` (plain gRPC, no
authentication) must be asked for explicitly and excludes both.

The node config carries the settings the ClientApp reads: `data-path` and `role` (:mod:`client.silo_data`: `node_role`
reads `role`, default ``silo``, so it is only written for a feature or sensitive party), `epsilon-budget` and
`state-dir` (:mod:`client.privacy_state`: the folder where the silo keeps its ledger and answers across restarts,
docs/FAULTS.md), `allow-trusted-server` (:mod:`client.rounds.mu2fl`), `deterministic-noise` (:mod:`client.randomness`),
and for a feature or sensitive party `party-keys` (its key file from `silofl deploy certs`, `<name>.party.json`: the
sealed record exchange, :mod:`client.party_exchange`; checked here: it must be this role's).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_RUNTIME",
    "ROLES",
    "RUNTIMES",
    "RUNTIME_ENV",
    "SiloStartError",
    "add_silo_parser",
    "choose_role",
    "folder_role",
    "node_config_string",
    "silo_start_command",
    "supernode_command",
]

# The node config key and its values, as `protocols.parties` (ROLE_KEY, ROLES) defines them; not imported from there
# because that module imports flwr, and this command must start without it.
ROLE_KEY = "role"
ROLES: tuple[str, ...] = ("silo", "features", "sensitive")
_HOLDS = {
    "silo": "a silo's data: both divisions of its records",
    "features": "a feature party's data: record ids, features and labels",
    "sensitive": "a sensitive party's data: record ids and sensitive groups",
}
_AS = {"silo": "a silo", "features": "a feature party", "sensitive": "a sensitive party"}
# info.json `format` of a silo folder and of a party folder (client.data.silo_store.FORMAT, party_store.FORMAT;
# copied so that reading a folder's role imports no numpy).
SILO_FORMAT, PARTY_FORMAT = "silofl-silo", "silofl-party"

RUNTIME_ENV: dict[str, str] = {
    # A SuperNode installs nothing unless asked (`--allow-runtime-dependency-installation`); the variable also
    # keeps any SuperExec it starts from `uv sync`-ing the app (torch from the registry: minutes and GBs).
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    # No network calls from a silo's host that the federation does not need.
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
}


#: SuperNode runtimes (`--runtime`): silofl's, with one long-lived ClientApp process or one per message, or Flower's.
RUNTIMES: tuple[str, ...] = ("long-lived", "per-message", "flower")
DEFAULT_RUNTIME = "long-lived"
#: The module that runs the SuperNode for the long-lived and per-message runtimes (not imported here: it needs flwr).
SUPERNODE_RUNTIME_MODULE = "silofl.client.supernode_runtime"


class SiloStartError(ValueError):
    """A `silofl silo start` argument is missing or inconsistent; the message names the flag and the fix."""


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SiloStartError(
            f"--superlink {address!r}: expected HOST:PORT of the SuperLink's Fleet API, e.g. superlink.example.org:9092"
        )
    return address


def _existing_file(path: Path | None, flag: str, what: str) -> Path:
    if path is None:
        raise SiloStartError(f"{flag} is required ({what}); or pass --insecure to join without TLS and authentication")
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise SiloStartError(f"{flag} {path}: no such file ({what})")
    return path


def _literal_path(path: Path, flag: str) -> str:
    """An absolute path as a TOML literal string (single quotes, no escapes)."""
    text = str(Path(path).expanduser().resolve())
    if "'" in text or "\n" in text:
        raise SiloStartError(f"{flag} {text!r}: Flower's --node-config cannot carry a path with a quote or newline")
    return f"'{text}'"


def node_config_string(
    data: Path,
    epsilon_budget: float | None = None,
    deterministic_noise: bool = False,
    *,
    state_dir: Path | None = None,
    allow_trusted_server: bool = False,
    role: str | None = None,
    policy: Path | None = None,
    party_keys: Path | None = None,
) -> str:
    """The `--node-config` value: `data-path='...'` (absolute), `role='features'` or `role='sensitive'` for a party
    (nothing for a silo, the ClientApp's default, so a silo's node config is what it was before parties), and the
    optional privacy settings.

    Flower parses it as space-separated `key=value` pairs whose values are TOML; the path is a TOML literal string
    (single quotes, no escapes), so it may contain spaces but not a single quote.
    """
    parts = [f"data-path={_literal_path(data, '--data')}"]
    if role is not None and role not in ROLES:
        raise SiloStartError(f"--role {role!r}: choose one of {', '.join(ROLES)}")
    if role not in (None, "silo"):
        parts.append(f"{ROLE_KEY}='{role}'")
    if epsilon_budget is not None:
        if not (epsilon_budget > 0) or math.isnan(epsilon_budget):
            raise SiloStartError(f"--epsilon-budget must be a positive number, got {epsilon_budget}")
        if math.isfinite(epsilon_budget):  # inf caps nothing: leave the key out rather than write a non-TOML value
            parts.append(f"epsilon-budget={float(epsilon_budget)!r}")
    if state_dir is not None:
        parts.append(f"state-dir={_literal_path(state_dir, '--state-dir')}")
    if policy is not None:
        parts.append(f"policy={_literal_path(policy, '--policy')}")
    if party_keys is not None:
        parts.append(f"party-keys={_literal_path(party_keys, '--party-keys')}")
    if allow_trusted_server:
        parts.append("allow-trusted-server=true")
    if deterministic_noise:
        parts.append("deterministic-noise=true")
    return " ".join(parts)


def folder_role(data: Path) -> str | None:
    """The role a data folder was written for: ``silo`` (a silo folder), ``features`` or ``sensitive`` (a party
    folder's info.json `role`); None when its info.json is missing or unreadable (loading the folder says why)."""
    import json

    try:
        info = json.loads((Path(data).expanduser() / "info.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(info, dict):
        return None
    if info.get("format") == SILO_FORMAT:
        return "silo"
    if info.get("format") == PARTY_FORMAT and info.get("role") in ROLES:
        return str(info["role"])
    return None


def choose_role(data: Path, requested: str | None) -> str:
    """The node's role: `requested` (`--role`) if given, else the folder's; SiloStartError naming both and the fix
    when they disagree."""
    if requested is not None and requested not in ROLES:
        raise SiloStartError(f"--role {requested!r}: choose one of {', '.join(ROLES)}")
    written = folder_role(data)
    if requested is None:
        return written or "silo"
    if written is not None and written != requested:
        where = Path(data).expanduser().resolve()
        fix = (
            "a silo's folder (`silofl data split ... --out DIR` writes DIR/silo_K)"
            if requested == "silo"
            else f"{_AS[requested]}'s folder (`silofl data split ... --topology ...` writes DIR/{requested}_K)"
        )
        raise SiloStartError(
            f"--role {requested}, but --data {where} holds {_HOLDS[written]} (info.json: role {written!r}). "
            f"Drop --role to start this node as {_AS[written]}, or point --data at {fix}"
        )
    return requested


def supernode_command(args: argparse.Namespace) -> list[str]:
    """The SuperNode command line for a parsed `silofl silo start` (no side effects beyond file checks and creating
    the node's state folder): Flower's
    `flower-supernode` arguments, run by `python -m silofl.client.supernode_runtime supernode --clientapp-process MODE`
    (runtime long-lived or per-message) or by `flower-supernode` itself (runtime flower)."""
    role = choose_role(args.data, getattr(args, "role", None))
    superlink = _check_address(str(args.superlink))
    runtime = getattr(args, "runtime", None) or DEFAULT_RUNTIME
    if runtime not in RUNTIMES:
        raise SiloStartError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if runtime == "flower":
        command = [getattr(args, "supernode_executable", None) or "flower-supernode"]
    else:
        python = getattr(args, "python_executable", None) or sys.executable
        command = [python, "-m", SUPERNODE_RUNTIME_MODULE, "supernode", "--clientapp-process", runtime]
    command += ["--superlink", superlink]
    if args.insecure:
        given = [
            flag
            for flag, value in (("--root-certificates", args.root_certificates), ("--auth-key", args.auth_key))
            if value is not None
        ]
        if given:
            raise SiloStartError(
                f"--insecure joins without TLS and authentication; drop {' and '.join(given)} or drop --insecure"
            )
        command.append("--insecure")
    else:
        ca = _existing_file(args.root_certificates, "--root-certificates", "the federation's CA certificate, ca.crt")
        key = _existing_file(args.auth_key, "--auth-key", "this silo's private key, e.g. silo_0.key")
        command += ["--root-certificates", str(ca), "--auth-supernode-private-key", str(key)]
    if args.clientapp_port is not None:
        if not 0 < int(args.clientapp_port) < 65536:
            raise SiloStartError(f"--clientapp-port must be a TCP port (1-65535), got {args.clientapp_port}")
        command += ["--port", str(int(args.clientapp_port))]
    if runtime != "flower":
        command += [
            "--isolation",
            "process",
        ]  # silofl's ClientApp worker is a process of its own, next to the SuperNode
    policy = getattr(args, "policy", None)
    if policy is not None:
        policy = _checked_policy(policy)
    command += [
        "--node-config",
        node_config_string(
            args.data,
            args.epsilon_budget,
            args.deterministic_noise,
            state_dir=state_folder(args.data, getattr(args, "state_dir", None)),
            allow_trusted_server=getattr(args, "allow_trusted_server", False),
            role=role,
            policy=policy,
            party_keys=_checked_party_keys(getattr(args, "party_keys", None), role),
        ),
    ]
    return command


def _checked_party_keys(path: Path | None, role: str) -> Path | None:
    """`--party-keys`: a party's own key file (`protocols.party_keys`), loaded now so that a wrong file fails here."""
    if path is None:
        return None
    if role not in ("features", "sensitive"):
        raise SiloStartError(
            f"--party-keys is for a feature or sensitive party's node; this node is a {role}: drop --party-keys"
        )
    from silofl.protocols.party_keys import PartyKeyError, PartyKeys

    file = _existing_file(path, "--party-keys", "this party's key file, e.g. features_0.party.json")
    try:
        keys = PartyKeys.load(file)
    except PartyKeyError as exc:
        raise SiloStartError(f"--party-keys: {exc}") from None
    if not keys.name.startswith(f"{role}-"):
        raise SiloStartError(
            f"--party-keys {file} is the key file of {keys.name}, but this node is a {role} party: give it its own "
            f"file ({role}_<k>.party.json from `silofl deploy certs`)"
        )
    return file


def state_folder(data: Path, given: Path | None) -> Path:
    """The node's state folder: `--state-dir`, else ``<data folder>.state`` beside the data folder (a silo keeps
    its job ledgers, its journal and its lifetime ledger there, so that a restarted node continues its runs and
    never spends twice; docs/FAULTS.md). Created now, owner-only: SiloStartError naming the flag if it cannot be."""
    if given is not None:
        folder = Path(given).expanduser().resolve()
    else:
        source = Path(data).expanduser().resolve()
        folder = source.with_name(source.name + ".state")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SiloStartError(
            f"--state-dir {folder}: cannot create the node's state folder ({exc.strerror}); give a writable folder"
        ) from None
    if not os.access(folder, os.W_OK):
        raise SiloStartError(f"--state-dir {folder}: not writable by this user; give a writable folder")
    return folder


def _checked_policy(path: Path) -> Path:
    """The policy file, read and validated now (a bad key stops the node here, naming it)."""
    from silofl.protocols.silo_policy import PolicyError, load_policy

    try:
        load_policy(path)
    except PolicyError as exc:
        raise SiloStartError(f"--policy: {exc}") from None
    return Path(path).expanduser().resolve()


def _validate_data(data: Path, role: str = "silo") -> str:
    """Load the silo or party folder once (as a node of `role` will); a clear SiloStartError naming the file if it
    is not a valid one; a one-line summary naming the role and the silo's or party's id."""
    from silofl.client.data.party_store import load_party, read_party_info
    from silofl.client.data.silo_store import load_silo
    from silofl.client.data.tabular import DataError

    folder = Path(data).expanduser()
    try:
        if role == "silo":
            silo = load_silo(folder)
        else:
            info = read_party_info(folder)
            party = load_party(folder, role=role)
    except DataError as exc:
        raise SiloStartError(f"--data: {exc}") from None
    except OSError as exc:  # e.g. a folder the silo's user may not read (silo files are written owner-only)
        raise SiloStartError(f"--data: cannot read {exc.filename or data}: {exc.strerror}") from None
    if role == "silo":
        return (
            f"silo {silo.silo_id} of {silo.num_silos} ({silo.info.name}): {len(silo.train)} training and "
            f"{len(silo.test)} test records"
        )
    holds = "ids, features and labels" if role == "features" else "ids and sensitive groups"
    return (
        f"{_AS[role].partition(' ')[2]} {party.party_id} of {info['num_parties']} ({party.info.name}): {holds} of "
        f"{len(party.train_ids)} training and {len(party.test_ids)} test records"
    )


def silo_start_command(args: argparse.Namespace) -> int:
    """Validate, print the SuperNode command and exec it (or, with --dry-run, only print it)."""
    try:
        role = choose_role(args.data, args.role)
        summary = _validate_data(args.data, role)
        command = supernode_command(args)
    except SiloStartError as exc:
        print(f"silofl silo start: {exc}", file=sys.stderr)
        return 2
    # The SuperNode of this environment (the same flwr as silofl's), else the first on PATH; the SuperNode starts
    # `flower-superexec` and `flwr-clientapp` by name, so this environment's scripts go first on PATH too. The
    # silofl runtimes run with this Python (command[0] is sys.executable already).
    bin_dir = Path(sys.executable).parent
    if (args.runtime or DEFAULT_RUNTIME) == "flower":
        sibling = bin_dir / command[0]
        found = str(sibling) if sibling.is_file() else shutil.which(command[0])
        if found is None:
            print(
                f"silofl silo start: {command[0]} not found on PATH; install flwr in this environment", file=sys.stderr
            )
            return 2
        command[0] = found
    executable = command[0]
    print(f"silofl: {summary}", file=sys.stderr)
    print(shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    env = {**os.environ, **RUNTIME_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    os.execve(executable, command, env)
    return 0  # pragma: no cover - execve does not return


def add_silo_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `silo start` on the `silofl` command's subparsers (the namespace carries func=silo_start_command)."""
    silo = subparsers.add_parser("silo", help="run this site's silo", description="Run this site's silo.")
    silo_sub = silo.add_subparsers(dest="silo_command", metavar="COMMAND", required=True)
    start = silo_sub.add_parser(
        "start",
        help="join a deployed federation: start a Flower SuperNode for one silo or party folder",
        description="Validate the silo or party folder, print the flower-supernode command and run it: TLS and "
        "SuperNode authentication unless --insecure.",
    )
    start.add_argument(
        "--data",
        type=Path,
        required=True,
        metavar="DIR",
        help="the silo folder, or a feature or sensitive party's folder (silofl data split [--topology ...])",
    )
    start.add_argument(
        "--role",
        choices=ROLES,
        default=None,
        help="this node's role: silo (both divisions), features (ids, features, labels) or sensitive (ids, "
        "sensitive groups); default: the role the folder was written for; refused if it disagrees with the folder",
    )
    start.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's Fleet API address")
    start.add_argument("--root-certificates", type=Path, metavar="FILE", help="the federation's CA certificate")
    start.add_argument(
        "--auth-key", type=Path, metavar="FILE", help="this node's OpenSSH ECDSA private key (e.g. silo_0.key)"
    )
    start.add_argument("--insecure", action="store_true", help="no TLS, no authentication (trusted networks only)")
    start.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="the operator's TOML policy: lifetime-epsilon, lifetime-delta, max-epsilon-per-job, max-delta, "
        "algorithms, allow-trusted-server, evaluation (protocols/silo_policy.py); checked here before the node starts",
    )
    start.add_argument(
        "--epsilon-budget", type=float, metavar="E", help="cap this silo's epsilon per job (max-epsilon-per-job)"
    )
    start.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="keep the node's ledgers (per job and lifetime) and answers here, so a restarted node continues and "
        "never spends twice (default: DATA.state beside the data folder)",
    )
    start.add_argument(
        "--allow-trusted-server",
        action="store_true",
        help="DP-mu2-FL: let a trusted-server run receive this silo's un-noised momentum",
    )
    start.add_argument(
        "--deterministic-noise", action="store_true", help="seed noise from the run seed (reproducible, weaker)"
    )
    start.add_argument(
        "--clientapp-port", type=int, metavar="N", help="local port of the SuperNode's ClientApp API (default 9094)"
    )
    start.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=DEFAULT_RUNTIME,
        help="long-lived (default): Flower's SuperNode with short polls and one long-lived ClientApp process; "
        "per-message: short polls, a fresh ClientApp process per message; flower: Flower's stock SuperNode "
        "(rounds of seconds)",
    )
    start.add_argument(
        "--party-keys",
        type=Path,
        metavar="FILE",
        help="a feature or sensitive party's key file (<name>.party.json from silofl deploy certs --topology ...): "
        "its parties' sealed record exchange; never give it to the server",
    )
    start.add_argument("--dry-run", action="store_true", help="validate and print the command, do not start it")
    start.set_defaults(func=silo_start_command)
    from silofl.client.silo_budget import add_budget_parser  # imports nothing heavy until it runs

    add_budget_parser(silo_sub)
