"""silofl on Flower's deployment runtime, on loopback: a SuperLink and 3 SuperNodes as separate processes with TLS
and SuperNode authentication (`server.deploy.local`), runs submitted with `flwr run . silofl-local`, and the
`silofl silo start` command line (`client.silo_cli`); also a census-style federation of separate parties (three
feature parties and one sensitive party; docs/algorithms/steffle.md) running SteFFLe.

The silos' federation is started once for the module and always torn down. It runs silofl's SuperNode runtime
(`silofl silo start --runtime long-lived`, the default: short polls, one long-lived ClientApp process per SuperNode,
`client.supernode_runtime`), so a round costs a fraction of a second; the tests below also check that this runtime
gives the in-process engine's numbers, survives its ClientApp process being killed, and starts a fresh process for
another app. The parties' federation is started by its one test, before the silos' (so the two never run at once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from silofl.client.silo_cli import SiloStartError, add_silo_parser, node_config_string, supernode_command
from silofl.server.deploy import flower_setup, local, processes
from silofl.server.deploy.certs import make_certs
from silofl.server.deploy.topology import NodeLayout

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 240


def _silo_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="silofl")
    add_silo_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["silo", "start", *argv])


# --- `silofl silo start` (no processes) -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def silo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from silofl.client.data.federate import load_federation
    from silofl.client.data.silo_store import save_silo

    root = tmp_path_factory.mktemp("split with space")
    _, silos = load_federation("synthetic", 2)
    for k, silo in enumerate(silos):
        save_silo(silo, root / f"silo_{k}")
    return root / "silo_0"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    return make_certs(tmp_path_factory.mktemp("keys"), 1)


def test_supernode_command_is_secure_by_default(silo_dir: Path, keys, tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = _silo_args(
        ["--data", str(silo_dir), "--superlink", "link.example:9092", "--root-certificates", str(keys.ca_cert),
         "--auth-key", str(keys.silo_keys[0]), "--epsilon-budget", "0.5", "--deterministic-noise",
         "--clientapp-port", "9200", "--state-dir", str(state)]
    )  # fmt: skip
    command = supernode_command(args)
    assert command[:8] == [
        sys.executable, "-m", "silofl.client.supernode_runtime", "supernode", "--clientapp-process", "long-lived",
        "--superlink", "link.example:9092",
    ]  # fmt: skip
    assert command[command.index("--isolation") + 1] == "process"  # the long-lived ClientApp is its own process
    assert "--insecure" not in command
    assert command[command.index("--root-certificates") + 1] == str(keys.ca_cert.resolve())
    assert command[command.index("--auth-supernode-private-key") + 1] == str(keys.silo_keys[0].resolve())
    assert command[command.index("--port") + 1] == "9200"
    node_config = command[command.index("--node-config") + 1]
    assert node_config == (
        f"data-path='{silo_dir.resolve()}' epsilon-budget=0.5 state-dir='{state.resolve()}' deterministic-noise=true"
    )
    # Flower parses it back to what the ClientApp reads (a path with a space survives).
    from flwr.common.config import parse_config_args

    parsed = parse_config_args([node_config])
    assert parsed == {
        "data-path": str(silo_dir.resolve()),
        "epsilon-budget": 0.5,
        "state-dir": str(state.resolve()),
        "deterministic-noise": True,
    }
    # the other runtimes: the same flower-supernode arguments, run by silofl's runtime or by Flower's command
    per_message = supernode_command(_silo_args([*args_list(args), "--runtime", "per-message"]))
    assert per_message[4:6] == ["--clientapp-process", "per-message"] and "--isolation" in per_message
    stock = supernode_command(_silo_args([*args_list(args), "--runtime", "flower"]))
    assert stock[:3] == ["flower-supernode", "--superlink", "link.example:9092"] and "--isolation" not in stock
    assert stock[1:] == [a for a in command[6:] if a not in ("--isolation", "process")]


def args_list(args: argparse.Namespace) -> list[str]:
    """The `silofl silo start` flags of a parsed namespace (for re-parsing with one more flag)."""
    flags = ["--data", str(args.data), "--superlink", args.superlink, "--clientapp-port", str(args.clientapp_port)]
    flags += ["--root-certificates", str(args.root_certificates), "--auth-key", str(args.auth_key)]
    flags += ["--epsilon-budget", str(args.epsilon_budget)] + (
        ["--deterministic-noise"] if args.deterministic_noise else []
    )
    return flags + (["--state-dir", str(args.state_dir)] if args.state_dir is not None else [])


def test_supernode_command_requires_tls_and_key_unless_insecure(silo_dir: Path, keys) -> None:
    base = ["--data", str(silo_dir), "--superlink", "127.0.0.1:9092"]
    with pytest.raises(SiloStartError, match="--root-certificates is required"):
        supernode_command(_silo_args(base))
    with pytest.raises(SiloStartError, match="--auth-key is required"):
        supernode_command(_silo_args([*base, "--root-certificates", str(keys.ca_cert)]))
    with pytest.raises(SiloStartError, match="no such file"):
        supernode_command(_silo_args([*base, "--root-certificates", str(keys.out / "nope.crt")]))
    with pytest.raises(SiloStartError, match="drop --auth-key or drop --insecure"):
        supernode_command(_silo_args([*base, "--insecure", "--auth-key", str(keys.silo_keys[0])]))
    insecure = supernode_command(_silo_args([*base, "--insecure"]))
    assert "--insecure" in insecure and "--auth-supernode-private-key" not in insecure
    with pytest.raises(SiloStartError, match="HOST:PORT"):
        supernode_command(_silo_args(["--data", str(silo_dir), "--superlink", "127.0.0.1", "--insecure"]))
    with pytest.raises(SiloStartError, match="positive"):
        node_config_string(silo_dir, epsilon_budget=0.0)
    assert "epsilon-budget" not in node_config_string(silo_dir, epsilon_budget=float("inf"))


def test_silo_start_passes_state_dir_and_trusted_server_consent(silo_dir: Path, tmp_path: Path) -> None:
    import tomllib

    base = ["--data", str(silo_dir), "--superlink", "127.0.0.1:9092", "--insecure"]
    plain = supernode_command(_silo_args(base))
    config = plain[plain.index("--node-config") + 1]
    assert "allow-trusted-server" not in config  # (a state-dir without --state-dir is client/silo_cli.py's default)
    command = supernode_command(_silo_args([*base, "--state-dir", str(tmp_path / "state"), "--allow-trusted-server"]))
    # Flower reads key=value pairs whose values are TOML (paths are literal strings and may hold spaces)
    text = command[command.index("--node-config") + 1]
    pairs = {key: tomllib.loads(f"v = {value}")["v"] for key, value in re.findall(r"([\w-]+)=('[^']*'|\S+)", text)}
    assert pairs["state-dir"] == str((tmp_path / "state").resolve())
    assert pairs["allow-trusted-server"] is True
    with pytest.raises(SiloStartError, match="--state-dir"):
        node_config_string(silo_dir, state_dir=tmp_path / "it's")


def test_silo_start_validates_the_data_folder(tmp_path: Path, silo_dir: Path, capsys) -> None:
    args = _silo_args(["--data", str(tmp_path), "--superlink", "127.0.0.1:9092", "--insecure", "--dry-run"])
    assert args.func(args) == 2
    assert "info.json: missing" in capsys.readouterr().err
    args = _silo_args(["--data", str(silo_dir), "--superlink", "127.0.0.1:9092", "--insecure", "--dry-run"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    first = captured.out.split()
    assert first[:4] == [sys.executable, "-m", "silofl.client.supernode_runtime", "supernode"]
    assert first[6:9] == ["--superlink", "127.0.0.1:9092", "--insecure"]
    assert "silo 0 of 2 (synthetic)" in captured.err
    args = _silo_args(["--data", str(silo_dir), "--superlink", "127.0.0.1:9092", "--insecure", "--dry-run",
                       "--runtime", "flower"])  # fmt: skip
    assert args.func(args) == 0
    first = capsys.readouterr().out.split()
    assert Path(first[0]).name == "flower-supernode" and Path(first[0]).is_file()  # this environment's
    assert first[1:4] == ["--superlink", "127.0.0.1:9092", "--insecure"]


# --- `silofl silo start` with a party folder (no processes) -------------------------------------------------------


@pytest.fixture(scope="module")
def party_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`silofl data split synthetic --silos 3 --topology central-sensitive`: features_0..2 and sensitive_0."""
    from silofl.server.deploy.node_folders import write_synthetic_parties

    root = tmp_path_factory.mktemp("parties with space")
    write_synthetic_parties(root, NodeLayout("central-sensitive", 3, 1))
    return root


def _node_config(stdout: str) -> dict:
    """The --node-config of the command `silofl silo start --dry-run` printed, as Flower parses it."""
    import shlex

    from flwr.common.config import parse_config_args

    command = shlex.split(stdout.strip().splitlines()[-1])
    return parse_config_args([command[command.index("--node-config") + 1]])


def test_silo_start_puts_a_party_folders_role_in_the_node_config(party_root: Path, silo_dir: Path, capsys) -> None:
    """The role comes from the folder (or an agreeing --role) and reaches the ClientApp's `node_role` as written."""
    from flwr.app import Context, RecordDict

    from silofl.client.silo_data import node_role
    from silofl.protocols.messages import DataSpec

    base = ["--superlink", "127.0.0.1:9092", "--insecure", "--dry-run"]
    for folder, role, flags in (
        ("sensitive_0", "sensitive", []),
        ("features_1", "features", ["--role", "features"]),
    ):
        args = _silo_args(["--data", str(party_root / folder), *base, *flags])
        assert args.func(args) == 0
        captured = capsys.readouterr()
        config = _node_config(captured.out)
        config.pop("state-dir", None)  # client/silo_cli.py's default state folder, if it gives one
        assert config == {"data-path": str((party_root / folder).resolve()), "role": role}
        party_id, of = (0, 1) if role == "sensitive" else (1, 3)
        assert f"{'feature' if role == 'features' else role} party {party_id} of {of} (synthetic)" in captured.err
        context = Context(run_id=1, node_id=1, node_config=config, state=RecordDict(), run_config={})
        assert node_role(context, DataSpec(dataset="synthetic", num_silos=3)) == (role, None)
    args = _silo_args(["--data", str(silo_dir), *base])  # a silo's node config is what it was before parties
    assert args.func(args) == 0
    assert "role" not in _node_config(capsys.readouterr().out)
    from silofl.client import silo_cli
    from silofl.client.data import party_store, silo_store
    from silofl.protocols import parties

    assert (silo_cli.ROLE_KEY, silo_cli.ROLES) == (parties.ROLE_KEY, parties.ROLES)  # copied to keep flwr out
    assert (silo_cli.SILO_FORMAT, silo_cli.PARTY_FORMAT) == (silo_store.FORMAT, party_store.FORMAT)


def test_silo_start_passes_a_partys_own_key_file_and_refuses_another(
    party_root: Path, silo_dir: Path, tmp_path: Path, capsys
) -> None:
    """`--party-keys` (the sealed record exchange): the party's own file reaches its node config; a file of the other
    role, a broken one or one given to a silo is refused before anything starts, naming the fix."""
    from silofl.server.deploy.certs import make_certs

    certs = make_certs(tmp_path / "certs", 3, hosts=(), topology="central-sensitive")
    base = ["--superlink", "127.0.0.1:9092", "--insecure", "--dry-run"]
    own = certs.party_key_file("sensitive_0")
    args = _silo_args(["--data", str(party_root / "sensitive_0"), *base, "--party-keys", str(own)])
    assert args.func(args) == 0
    assert _node_config(capsys.readouterr().out)["party-keys"] == str(own.resolve())
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for data, keys, says in (
        (
            party_root / "sensitive_0",
            certs.party_key_file("features_0"),
            "is the key file of features-0, but this node",
        ),
        (party_root / "features_0", bad, "'format' must be"),
        (silo_dir, own, "--party-keys is for a feature or sensitive party's node"),
        (party_root / "features_0", tmp_path / "missing.json", "no such file"),
    ):
        args = _silo_args(["--data", str(data), *base, "--party-keys", str(keys)])
        assert args.func(args) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and says in captured.err, captured.err


@pytest.mark.parametrize(
    ("folder", "role", "holds"),
    [
        ("features_0", "sensitive", "a feature party's data"),
        ("sensitive_0", "features", "a sensitive party's data"),
        ("features_0", "silo", "a feature party's data"),
        (None, "features", "a silo's data"),
    ],
)
def test_silo_start_refuses_a_role_the_folder_disagrees_with(
    party_root: Path, silo_dir: Path, folder: str | None, role: str, holds: str, capsys
) -> None:
    data = silo_dir if folder is None else party_root / folder
    args = _silo_args(["--data", str(data), "--superlink", "127.0.0.1:9092", "--insecure", "--dry-run", "--role", role])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no command printed, nothing started
    assert f"--role {role}, but --data {data.resolve()} holds {holds}" in captured.err
    assert "Drop --role" in captured.err and "point --data at" in captured.err
    with pytest.raises(SiloStartError, match=f"--role {role}, but"):
        supernode_command(args)
    with pytest.raises(SiloStartError, match="choose one of silo, features, sensitive"):
        node_config_string(data, role="census")


def test_deploy_up_checks_the_topology_and_its_data_before_starting_anything(
    tmp_path: Path, party_root: Path, silo_dir: Path
) -> None:
    cases = [
        ({"topology": "general"}, "--topology general needs --sensitive-parties"),
        ({"topology": "divided", "sensitive_parties": 3}, "--sensitive-parties is for --topology general"),
        ({"topology": "ring"}, "--topology 'ring': choose one of"),
        ({"topology": "central-sensitive", "data": silo_dir.parent}, "holds silo folders .* drop --topology"),
        ({"data": party_root}, "it holds party folders .* pass the --topology"),
        ({"topology": "divided", "data": party_root}, "sensitive_0 is sensitive party 0 of 1, but --topology divided"),
        ({"topology": "general", "sensitive_parties": 2, "data": party_root}, "sensitive_0 is sensitive party 0 of 1"),
    ]
    for kwargs, match in cases:
        silos = 2 if kwargs.get("data") == silo_dir.parent else 3
        with pytest.raises(local.DeployError, match=match):
            local.up(tmp_path / "fed", silos, **kwargs)
        assert not (tmp_path / "fed" / local.STATE_FILE).exists()  # nothing was started


def test_submit_command_names_the_topology() -> None:
    def deployment(topology: str, names: list[str], sensitive: int) -> local.Deployment:
        processes = [local.ProcessInfo(name, 1, 1, "log") for name in ["superlink", *names]]
        return local.Deployment("d", False, "f", "c", "h", processes=processes, topology=topology,
                                sensitive_parties=sensitive)  # fmt: skip

    silos = deployment("silos", ["silo_0", "silo_1"], 0)
    assert silos.submit_command("/o") == (
        "FLWR_HOME=h flwr run . silofl-local --stream --run-config 'num-silos=2 out-dir=\"/o\"'"
    )  # as before parties existed
    census = deployment("central-sensitive", ["features_0", "features_1", "features_2", "sensitive_0"], 1)
    assert census.num_silos == 3
    assert '--run-config \'algorithm="steffle" topology="central-sensitive" num-silos=3 out-dir=' in (
        census.submit_command("/o")
    )
    general = deployment("general", ["features_0", "features_1", "sensitive_0", "sensitive_1"], 2)
    assert 'topology="general" sensitive-parties=2 num-silos=2' in general.submit_command()


# --- a census-style federation of parties on loopback ----------------------------------------------------------------


@pytest.mark.slow
def test_census_and_three_feature_parties_run_steffle(tmp_path: Path) -> None:
    """One sensitive party (a census bureau holding every record's group) and three feature parties (banks), each
    a SuperNode with its own registered key and party key file, TLS; a 3-round SteFFLe run (sealed records, the
    default) submitted with the run config `deploy up` prints; result.json names the four parties, and the census
    party spent at most its epsilon."""
    root, out = tmp_path / "census", tmp_path / "out"
    with local.running(root, 3, topology="central-sensitive") as dep:
        assert [p.name for p in dep.processes] == ["superlink", "features_0", "features_1", "features_2", "sensitive_0"]
        assert not dep.insecure and (Path(dep.certs) / "sensitive_0.key").is_file()
        first_lines = {p.name: Path(p.log).read_text().splitlines()[0] for p in dep.processes[1:]}
        for name, line in first_lines.items():  # the command `silofl silo start` built for each node
            assert f"--auth-supernode-private-key {Path(dep.certs) / name}.key" in line
            assert f"role='{name.partition('_')[0]}'" in line
            assert f"party-keys='{Path(dep.certs) / name}.party.json'" in line  # its own key file (sealed records)
        run_config = (
            f"{dep.layout.run_config()} rounds=3 epochs=0 epsilon=1.0 lambda=1.0 eval-every=3 "
            f'round-timeout=300 out-dir="{out}"'
        )
        assert 'topology="central-sensitive"' in run_config
        done = _flwr_run(dep, run_config, timeout=900)
        result = _result(done, out)
    federation = result["federation"]
    assert federation["topology"] == "central-sensitive"
    assert len(federation["silos"]) == 3 and [s["silo_id"] for s in federation["silos"]] == [0, 1, 2]
    assert len(federation["sensitive_parties"]) == 1
    census = federation["sensitive_parties"][0]
    assert census["n_train"] == sum(s["n_train"] for s in federation["silos"])  # it holds every record's group
    assert len({s["node_id"] for s in federation["silos"]} | {census["node_id"]}) == 4
    assert federation["rounds"] == 3 and len(result["rounds"]) == 3
    privacy = result["privacy"]
    assert privacy["epsilon_target"] == 1.0 and 0 < privacy["epsilon_spent"] <= 1.0
    assert list(privacy["per_silo"]) == ["0"]  # the census party's ledger; the banks add no noise
    assert "sealed" in privacy["parties"]  # the default: records sealed at setup, only noised sums through the server
    assert 0 < privacy["per_silo"]["0"]["epsilon_spent"] <= 1.0
    assert privacy["per_silo"]["0"]["rounds_answered"] == 3
    # 3 noisy steps at epsilon 1 from a zero model: 0.51 - 0.77 over 22 seeds on the in-process engine
    assert 0.4 < result["final"]["accuracy"] <= 1.0
    assert result["final"]["dp_violation"] is not None


# --- a deployed federation on loopback ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.Deployment]:
    root = tmp_path_factory.mktemp("federation")
    dep = local.up(root, 3)
    try:
        yield dep
    finally:
        current = local.Deployment.load(root)  # tests may have added processes
        local.down(root, grace=5)
        left = [p.name for p in current.processes if processes.alive(p)]
        assert not left, f"still running after down: {left}"
        assert not processes.descendants(current.processes)


def _flwr_run(dep: local.Deployment, run_config: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = local.flower_env(Path(dep.flwr_home))
    command = [str(flower_setup.bin_dir() / "flwr"), "run", ".", dep.connection, "--stream", "--run-config", run_config]
    return subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _result(done: subprocess.CompletedProcess[str], out: Path) -> dict:
    path = out / "result.json"
    assert path.is_file(), f"no result.json; flwr run said:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(path.read_text())


@pytest.mark.slow
def test_federation_is_up_with_tls_and_authentication(federation: local.Deployment) -> None:
    assert not federation.insecure
    assert [p.name for p in federation.processes] == ["superlink", "silo_0", "silo_1", "silo_2"]
    config = (Path(federation.flwr_home) / "config.toml").read_text()
    assert "[superlink.silofl-local]" in config and "root-certificates" in config and "insecure" not in config
    link_log = Path(federation.processes[0].log).read_text()
    assert "--enable-supernode-auth" in link_log and "SuperNode authentication is disabled" not in link_log
    # state by default: the SuperLink's database and each silo's own state-dir, under the deployment's folder
    assert f"--database {Path(federation.dir) / 'state' / 'superlink.db'}" in link_log.splitlines()[0]
    for proc in federation.processes[1:]:
        first_line = Path(proc.log).read_text().splitlines()[0]
        assert f"state-dir='{Path(federation.dir) / 'state' / proc.name}'" in first_line
    done = subprocess.run(
        [str(flower_setup.bin_dir() / "flwr"), "supernode", "ls", federation.connection, "--format", "json"],
        env=local.flower_env(Path(federation.flwr_home)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    listing = json.loads(done.stdout[done.stdout.index("{") :])
    assert sorted(n["status"] for n in listing["nodes"]) == ["online"] * 3


@pytest.mark.slow
def test_fedavg_run(federation: local.Deployment, tmp_path: Path) -> None:
    out = tmp_path / "fedavg"
    done = _flwr_run(
        federation,
        f'algorithm="fedavg" epsilon="inf" rounds=2 epochs=0 eval-every=2 num-silos=3 out-dir="{out}"',
    )
    result = _result(done, out)
    assert len(result["federation"]["silos"]) == 3
    assert len({s["node_id"] for s in result["federation"]["silos"]}) == 3
    assert result["federation"]["rounds"] == 2 and len(result["rounds"]) == 2
    assert 0.5 < result["final"]["accuracy"] <= 1.0


@pytest.mark.slow
def test_private_run(federation: local.Deployment, tmp_path: Path) -> None:
    out = tmp_path / "dp"
    done = _flwr_run(
        federation,
        f'algorithm="dp-fedsgd" epsilon=1.0 rounds=2 epochs=0 eval-every=2 num-silos=3 out-dir="{out}"',
    )
    result = _result(done, out)
    privacy = result["privacy"]
    assert privacy["epsilon_target"] == 1.0
    assert 0 < privacy["epsilon_spent"] <= 1.0
    assert len(result["federation"]["silos"]) == 3
    assert 0.0 <= result["final"]["accuracy"] <= 1.0


@pytest.mark.slow
def test_unregistered_supernode_is_refused(federation: local.Deployment, tmp_path: Path) -> None:
    rogue = make_certs(tmp_path / "rogue", 1)  # signed by nobody the SuperLink knows; key never registered
    proc = local.start_supernode(federation, "rogue", Path(federation.data) / "silo_0", auth_key=rogue.silo_keys[0])
    current = local.Deployment.load(Path(federation.dir))
    current.processes.append(proc)  # so that teardown stops it whatever happens
    current.save()
    deadline = time.monotonic() + 60
    while processes.alive(proc) and time.monotonic() < deadline:
        processes.reap([proc.pid])
        time.sleep(0.2)
    log = Path(proc.log).read_text()
    assert not processes.alive(proc), f"the unregistered SuperNode is still running:\n{log[-2000:]}"
    assert "SuperNode ID:" not in log
    assert "Failed to activate SuperNode" in log
    link_log = Path(federation.processes[0].log).read_text()
    assert "No SuperNode found with the given public key" in link_log
    assert os.path.exists(federation.certs)


# --- silofl's SuperNode runtime: one long-lived ClientApp process per SuperNode ------------------------------------


def _workers(dep: local.Deployment) -> dict[str, list[int]]:
    """The long-lived ClientApp worker pids below each SuperNode (`python -m silofl.client.supernode_runtime
    clientapp`)."""
    found: dict[str, list[int]] = {}
    for proc in local.Deployment.load(Path(dep.dir)).processes[1:]:
        for pid in processes.descendants([proc]):
            with contextlib.suppress(OSError):
                if b"clientapp" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    found.setdefault(proc.name, []).append(pid)
    return found


@pytest.mark.slow
def test_each_supernode_runs_one_long_lived_clientapp(federation: local.Deployment, tmp_path: Path) -> None:
    """One worker per SuperNode, the same process before and after a run (no process per message), and the
    SuperNodes started in Flower's process isolation mode."""
    assert federation.runtime == "long-lived"
    before = _workers(federation)
    assert sorted(before) == ["silo_0", "silo_1", "silo_2"] and all(len(p) == 1 for p in before.values())
    out = tmp_path / "fedavg"
    done = _flwr_run(federation, f'algorithm="fedavg" epsilon="inf" rounds=3 epochs=0 num-silos=3 out-dir="{out}"')
    result = _result(done, out)
    assert len(result["rounds"]) == 3
    assert _workers(federation) == before
    for proc in federation.processes[1:]:
        first_line = Path(proc.log).read_text().splitlines()[0]
        assert "-m silofl.client.supernode_runtime supernode --clientapp-process long-lived" in first_line
        assert "--isolation process" in first_line


@pytest.mark.slow
def test_a_killed_clientapp_process_is_started_again(federation: local.Deployment, tmp_path: Path) -> None:
    """The SuperNode restarts its ClientApp worker (SIGKILL: as an out-of-memory kill would), and the next run
    completes."""
    import signal

    victim = _workers(federation)["silo_1"][0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _workers(federation).get("silo_1", [victim]) == [victim]:
        time.sleep(0.2)
    assert _workers(federation).get("silo_1") not in (None, [victim]), "the ClientApp worker was not restarted"
    assert "the ClientApp worker exited (code -9); starting it again" in Path(federation.processes[2].log).read_text()
    out = tmp_path / "after"
    done = _flwr_run(federation, f'algorithm="fedavg" epsilon="inf" rounds=2 epochs=0 num-silos=3 out-dir="{out}"')
    assert len(_result(done, out)["rounds"]) == 2


OTHER_APP = '''\
"""Another Flower app (another FAB): its ClientApp echoes the model."""
import json

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
import numpy as np

client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=3, min_available_nodes=3)
    result = strategy.start(grid, ArrayRecord([np.ones(4, dtype=np.float32)]), num_rounds=2)
    with open(str(context.run_config["out"]), "w") as fh:
        json.dump(result.arrays.to_numpy_ndarrays()[0].tolist(), fh)
'''


@pytest.mark.slow
def test_another_app_runs_in_a_fresh_clientapp_process(federation: local.Deployment, tmp_path: Path) -> None:
    """A run of another app (another FAB) makes each worker replace itself with a fresh interpreter (same pid)
    before it touches that app's task, so two apps' code never share a process; silofl runs again afterwards."""
    app = tmp_path / "otherapp"
    app.mkdir()
    (app / "otherapp.py").write_text(OTHER_APP)
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "otherapp"\nversion = "1.0.0"\ndependencies = ["flwr>=1.39,<1.40"]\n\n'
        '[tool.flwr.app]\npublisher = "test"\n\n'
        '[tool.flwr.app.components]\nserverapp = "otherapp:server"\nclientapp = "otherapp:client"\n\n'
        '[tool.flwr.app.config]\nout = ""\n'
    )
    before = _workers(federation)
    env = local.flower_env(Path(federation.flwr_home))
    out = tmp_path / "other.json"
    command = [str(flower_setup.bin_dir() / "flwr"), "run", ".", federation.connection, "--stream", "--run-config"]
    done = subprocess.run(
        [*command, f'out="{out}"'], cwd=app, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert out.is_file(), f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert json.loads(out.read_text()) == [1.0] * 4
    for proc in federation.processes[1:]:
        assert "continuing in a fresh ClientApp process" in Path(proc.log).read_text()
    assert _workers(federation) == before  # exec: the same processes, fresh interpreters
    back = tmp_path / "silofl-again"
    done = _flwr_run(federation, f'algorithm="fedavg" epsilon="inf" rounds=2 epochs=0 num-silos=3 out-dir="{back}"')
    assert len(_result(done, back)["rounds"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["long-lived", "per-message"])
def test_deployed_runtimes_give_the_inprocess_numbers(tmp_path: Path, monkeypatch, runtime: str) -> None:
    """Same seed, same numbers: silos with deterministic noise (node config `deterministic-noise`) on silofl's
    runtimes give, for DP-FedSGD and SteFFLe, the result of the in-process engine over the same silo folders."""
    import numpy as np

    import silofl.client.silo_cli as silo_cli
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    plain = silo_cli.node_config_string

    def seeded(data, epsilon_budget=None, deterministic_noise=False, **options):
        return plain(data, epsilon_budget, True, **options)

    monkeypatch.setattr(silo_cli, "node_config_string", seeded)
    configs = {
        "dp-fedsgd": {"algorithm": "dp-fedsgd", "epsilon": 1.0},
        "steffle": {"algorithm": "steffle", "epsilon": 1.0, "lambda": 1.0},
    }
    common = {"rounds": 3, "epochs": 0, "eval-every": 3, "num-silos": 3, "seed": 5}
    with local.running(tmp_path / "fed", 3, runtime=runtime) as dep:
        folders = sorted(Path(dep.data).glob("silo_*"))
        for name, values in configs.items():
            out = tmp_path / f"deployed-{name}"
            text = " ".join(f"{k}={json.dumps(v)}" for k, v in {**values, **common}.items())
            deployed = _result(_flwr_run(dep, f'{text} out-dir="{out}"'), out)
            config = RunConfig.parse({**values, **common, "out-dir": str(tmp_path / f"local-{name}")})
            local_result = run_job(
                config,
                progress=False,
                node_configs=[{"data-path": str(f), "deterministic-noise": True} for f in folders],
            )
            assert deployed["final"] == local_result["final"], name
            assert deployed["privacy"]["epsilon_spent"] == local_result["privacy"]["epsilon_spent"], name
            for key, value in local_result["model"].items():
                np.testing.assert_array_equal(np.asarray(deployed["model"][key]), np.asarray(value), err_msg=name)
