"""`silofl deploy`: certificates and a loopback federation of real Flower processes.

    silofl deploy certs --out DIR [--silos N] [--topology T [--sensitive-parties S]] [--hosts NAME,...] [--overwrite]
    silofl deploy up --dir DIR --silos N [--topology T [--sensitive-parties S]] [--data SPLITDIR] [--insecure]
        [--runtime long-lived|per-message|flower] [--no-database]
    silofl deploy status --dir DIR
    silofl deploy restart --dir DIR [--node NAME ...]
    silofl deploy down --dir DIR

`up` keeps what must outlive the processes in DIR/state: the SuperLink's database (`--database
DIR/state/superlink.db`: registered SuperNode keys, runs) and one `state-dir` per SuperNode (DIR/state/silo_k: its
privacy ledger and journaled answers). `status` says which processes run; `restart` starts again the ones that do
not (or the ones named, stopped first), each with its exact command, state folder and database, so that a run
stopped by a killed SuperNode or SuperLink continues with `resume` (docs/FAULTS.md).

`--topology` (silos, the default; divided, central-sensitive, general: `server.deploy.topology`) deploys separate
feature and sensitive parties instead of silos: N = `--silos` feature parties and the topology's sensitive parties
(`--sensitive-parties S` for general), each a SuperNode with its own key pair (`features_k`, `sensitive_c`).

`add_deploy_parser` registers the commands on the `silofl` console script's subparsers; each parsed namespace
carries `func`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_deploy_parser", "certs_command", "down_command", "restart_command", "status_command", "up_command"]


def _hosts(text: str) -> list[str]:
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated host names, got {text!r}")
    return hosts


def certs_command(args: argparse.Namespace) -> int:
    from silofl.server.deploy.certs import CertError, make_certs

    try:
        paths = make_certs(
            args.out,
            args.silos,
            hosts=args.hosts,
            overwrite=args.overwrite,
            topology=args.topology,
            sensitive_parties=args.sensitive_parties,
        )
    except CertError as exc:
        print(f"silofl deploy certs: {exc}", file=sys.stderr)
        return 2
    print(f"CA:        {paths.ca_cert} (key {paths.ca_key}: keep it offline)")
    print(
        f"SuperLink: {paths.superlink_cert}, {paths.superlink_key} (names: localhost, 127.0.0.1, ::1, "
        f"{', '.join(args.hosts)})"
    )
    for name, key, pub in zip(paths.names, paths.silo_keys, paths.silo_public_keys, strict=True):
        who = f"{name.partition('_')[0]}:".ljust(10)  # silo: / features: / sensitive:
        print(f"{who} {key} -> that site only; {pub} -> `flwr supernode register {pub.name} <connection>`")
    print(f"all public keys: {paths.public_keys_csv}")
    for name, file in zip(paths.names, paths.party_keys, strict=False):
        print(f"party key: {file} -> {name} only (`silofl silo start --party-keys {file.name}`; never the server's)")
    return 0


def up_command(args: argparse.Namespace) -> int:
    from silofl.server.deploy.local import DeployError, up

    try:
        dep = up(
            args.dir,
            args.silos,
            data=args.data,
            insecure=args.insecure,
            topology=args.topology,
            sensitive_parties=args.sensitive_parties,
            runtime=args.runtime,
            database=not args.no_database,
            policy=args.policy,
        )
    except DeployError as exc:
        print(f"silofl deploy up: {exc}", file=sys.stderr)
        return 1
    mode = "insecure (no TLS, no authentication)" if dep.insecure else "TLS + SuperNode authentication"
    print(f"SuperLink: Fleet API {dep.fleet_address}, Control API {dep.control_address}; {mode}; runtime {dep.runtime}")
    for proc in dep.processes:
        print(f"  {proc.name:<12} pid {proc.pid:<8} log {proc.log}")
    database = dep.database or "none (--no-database: the SuperLink keeps its state in memory)"
    print(f"state (kept across restarts): database {database}; each node's state-dir {dep.state}/NAME")
    print("submit a run from the project folder:")
    print(f"  {dep.submit_command(str(Path(dep.dir) / 'out'))}")
    if args.policy is not None:
        print(
            f"  under {args.policy} the nodes answer what it allows: with a budget only noised algorithms (add e.g. "
            'algorithm="dp-fedsgd" epsilon=1.0 to --run-config; `silofl silo budget --state-dir '
            f"{dep.state}` shows what they spent)"
        )
    print(f"after a process died: silofl deploy restart --dir {dep.dir}, then resubmit with resume=true")
    print(f"stop: silofl deploy down --dir {dep.dir}")
    return 0


def status_command(args: argparse.Namespace) -> int:
    """Print every process of the deployment and whether it runs; exit 0 if all run, 1 if not (or no deployment)."""
    from silofl.server.deploy.local import DeployError, status

    try:
        processes = status(args.dir)
    except DeployError as exc:
        print(f"silofl deploy status: {exc}", file=sys.stderr)
        return 1
    for proc, alive in processes:
        print(f"  {proc.name:<12} {'running' if alive else 'NOT RUNNING':<12} pid {proc.pid:<8} log {proc.log}")
    dead = [proc.name for proc, alive in processes if not alive]
    if dead:
        print(f"not running: {', '.join(dead)}; start them again with: silofl deploy restart --dir {args.dir}")
        return 1
    return 0


def restart_command(args: argparse.Namespace) -> int:
    """Start again the processes that do not run (or those named by --node), as `up` started them."""
    from silofl.server.deploy.local import DeployError, restart, status

    try:
        restarted = restart(args.dir, args.node, grace=args.grace, say=lambda text: print(text, flush=True))
    except DeployError as exc:
        print(f"silofl deploy restart: {exc}", file=sys.stderr)
        return 1
    if not restarted:
        print(f"every process of {args.dir} is running; name one with --node NAME to restart it anyway")
        return 0
    for proc in restarted:
        print(f"restarted {proc.name:<12} pid {proc.pid:<8} log {proc.log}")
    names = {proc.name for proc in restarted}
    if "superlink" in names and len(names) < len(status(args.dir)):
        print("the SuperNodes that kept running reconnect by themselves within 20 s (their logs say when)")
    print("a run that stopped continues with its run config plus resume=true (the same out-dir)")
    return 0


def down_command(args: argparse.Namespace) -> int:
    from silofl.server.deploy.local import DeployError, down

    try:
        pids = down(args.dir, grace=args.grace)
    except DeployError as exc:
        print(f"silofl deploy down: {exc}", file=sys.stderr)
        return 1
    print(f"stopped {len(pids)} processes: {' '.join(map(str, pids)) or '(none were running)'}")
    return 0


def _add_topology_flags(parser: argparse.ArgumentParser, nodes: str) -> None:
    """`--topology` and `--sensitive-parties`, shared by `deploy certs` and `deploy up` (`nodes`: what is made)."""
    from silofl.server.deploy.topology import TOPOLOGIES

    parser.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default="silos",
        help=f"silos (default): {nodes} for N silos holding both divisions; divided: N feature and N sensitive "
        "parties; central-sensitive: N feature parties and one sensitive party (a census bureau); general: N "
        "feature and S sensitive parties",
    )
    parser.add_argument(
        "--sensitive-parties",
        type=int,
        default=None,
        metavar="S",
        help="sensitive parties of --topology general (the other topologies fix the number)",
    )


def add_deploy_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `deploy certs|up|status|restart|down` on an argparse subparsers object (e.g. the `silofl` command's)."""
    from silofl.client.silo_cli import DEFAULT_RUNTIME, RUNTIMES
    from silofl.server.deploy.certs import DEFAULT_HOSTS

    deploy = subparsers.add_parser("deploy", help="deploy a federation", description="Deploy a federation.")
    sub = deploy.add_subparsers(dest="deploy_command", metavar="COMMAND", required=True)

    certs = sub.add_parser(
        "certs",
        help="a CA, the SuperLink's TLS certificate and one authentication key pair per silo or party",
        description="Write ca.crt/ca.key, superlink.crt/superlink.key (signed by the CA), silo_<k>.key/.pub "
        "(with --topology: features_<k>.key/.pub and sensitive_<c>.key/.pub; OpenSSH ECDSA P-384, the format "
        "Flower 1.39's SuperNode authentication reads) and supernode_public_keys.csv into DIR.",
    )
    certs.add_argument("--out", type=Path, required=True, metavar="DIR")
    certs.add_argument(
        "--silos", type=int, default=3, metavar="N", help="silos, or feature parties with --topology (default 3)"
    )
    _add_topology_flags(certs, "key pairs")
    certs.add_argument(
        "--hosts",
        type=_hosts,
        default=list(DEFAULT_HOSTS),
        metavar="NAME,...",
        help="names the SuperLink is reached at, besides localhost/127.0.0.1/::1 (default: superlink)",
    )
    certs.add_argument("--overwrite", action="store_true", help="replace existing files in DIR")
    certs.set_defaults(func=certs_command)

    up = sub.add_parser(
        "up",
        help="start a SuperLink and N SuperNodes on this machine (loopback)",
        description="Start flower-superlink (TLS + SuperNode authentication unless --insecure) and one "
        "flower-supernode per silo (or per feature and sensitive party, with --topology) as background processes; "
        "pids and logs in DIR; writes the 'silofl-local' connection to DIR/flwr_home/config.toml.",
    )
    up.add_argument("--dir", type=Path, required=True, metavar="DIR")
    up.add_argument("--silos", type=int, required=True, metavar="N", help="silos, or feature parties with --topology")
    _add_topology_flags(up, "SuperNodes")
    up.add_argument(
        "--data",
        type=Path,
        metavar="SPLITDIR",
        help="silo_0 ... silo_<N-1> from `silofl data split` (with --topology: features_0 ... and sensitive_0 ... "
        "from `silofl data split --topology`; default: the embedded synthetic dataset, split into DIR/data)",
    )
    up.add_argument("--insecure", action="store_true", help="no TLS and no authentication")
    up.add_argument(
        "--no-database",
        action="store_true",
        help="keep the SuperLink's state in memory, not in DIR/state/superlink.db: cheaper rounds, but a restarted "
        "SuperLink has forgotten the SuperNodes (`deploy restart` then restarts them too) and the runs",
    )
    up.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="every node's operator policy, as `silofl silo start --policy` (TOML: lifetime-epsilon, lifetime-delta, "
        "max-epsilon-per-job, max-delta, algorithms, allow-trusted-server, evaluation); default: none",
    )
    up.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=DEFAULT_RUNTIME,
        help="the SuperNodes' runtime, as `silofl silo start --runtime`: long-lived (default: short polls, one "
        "long-lived ClientApp process per SuperNode), per-message (short polls, a ClientApp process per message) "
        "or flower (Flower's stock SuperNode)",
    )
    up.set_defaults(func=up_command)

    status = sub.add_parser(
        "status",
        help="which processes of a `deploy up` federation run",
        description="List the processes of DIR and whether each runs; exit 1 if one does not.",
    )
    status.add_argument("--dir", type=Path, required=True, metavar="DIR")
    status.set_defaults(func=status_command)

    restart = sub.add_parser(
        "restart",
        help="start again the processes of DIR that died (or those named)",
        description="Start again, with the exact command `deploy up` used (the SuperLink with its database, each "
        "SuperNode with its key and state-dir), every process of DIR that is not running, or those named with "
        "--node (stopped first if they run); returns once they are up. A run that stopped continues with resume.",
    )
    restart.add_argument("--dir", type=Path, required=True, metavar="DIR")
    restart.add_argument(
        "--node",
        action="append",
        metavar="NAME",
        help="superlink, silo_K, features_K or sensitive_C (repeatable; default: every process that is not running)",
    )
    restart.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL for a running one (default 10)"
    )
    restart.set_defaults(func=restart_command)

    down = sub.add_parser("down", help="stop what `deploy up` started", description="Stop the processes of DIR.")
    down.add_argument("--dir", type=Path, required=True, metavar="DIR")
    down.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")
    down.set_defaults(func=down_command)
