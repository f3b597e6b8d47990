"""Faults injected into the real deployment (`silofl deploy up`: a SuperLink and SuperNodes as processes on loopback,
gRPC with TLS and SuperNode authentication), and the documented way back: `silofl deploy restart --dir DIR`, then the
run resubmitted with `resume=true`.

`deploy up` gives every SuperNode a state folder of its own (node config `state-dir`: the silo's privacy ledger and
journaled answers, client/privacy_state.py) and the SuperLink a database (`--database`: registered keys, runs), so:

* a SuperNode killed mid-run (SIGKILL of its process group: the SuperNode and its ClientApp process, as when its
  machine goes down) stops the run; restarted, it continues from its state-dir and `resume` finishes the run;
* a SuperLink killed mid-run comes back with its registrations; the SuperNodes that kept running reconnect by
  themselves (and say so in their logs, naming the SuperLink) and `resume` finishes the run;
* a SuperLink that lost its database no longer knows the SuperNodes: they say so in their logs and stop, and
  `deploy restart` registers the keys again and brings them back.

After each fault every silo's ledger file lists rounds 1..T, each charged exactly once. The fast tests at the top
check, without Flower processes, the commands `deploy up` builds (a state-dir per node, the SuperLink's database) and
what `deploy restart` starts again. docs/FAULTS.md and docs/DEPLOYMENT.md describe all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from silofl.client import lifetime_ledger, privacy_state
from silofl.server.deploy import flower_setup, launch, local, processes

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SILOS = 2
ROUNDS = 8
ROUND_TIMEOUT = 20
#: Every node's operator policy (`deploy up --policy`): a lifetime budget, so that each silo keeps a lifetime ledger
#: and answers evaluations noised, charged to it.
POLICY = "lifetime-epsilon = 20.0\nlifetime-delta = 1e-5\n"


# --- without Flower processes -----------------------------------------------------------------------------------------


def _parse_node_config(command: list[str]) -> dict[str, Any]:
    from flwr.common.config import parse_config_args

    return parse_config_args([command[command.index("--node-config") + 1]])


@pytest.mark.parametrize(
    ("topology", "names"),
    [("silos", ["silo_0", "silo_1"]), ("central-sensitive", ["features_0", "features_1", "sensitive_0"])],
)
def test_deploy_up_gives_every_node_a_state_dir_and_the_superlink_a_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topology: str, names: list[str]
) -> None:
    """The commands `up` starts (recorded, not run): `--database DIR/state/superlink.db` for the SuperLink and a
    `state-dir` of its own, DIR/state/NAME (owner-only), in every SuperNode's node config; deploy.json keeps each
    command, working directory and extra environment for `restart`."""
    started: list[local.ProcessInfo] = []

    def spawn(name: str, command: list[str], *, cwd: Path, log: Path, port: int = 0, env=None) -> local.ProcessInfo:
        proc = local.ProcessInfo(name, 0, 0, str(log), port, list(command), str(cwd), dict(env or {}))
        started.append(proc)
        return proc

    monkeypatch.setattr(launch, "spawn", spawn)
    monkeypatch.setattr(launch, "wait_for_superlink", lambda *args: None)
    monkeypatch.setattr(local, "register_supernodes", lambda keys, *args: [None] * len(keys))
    monkeypatch.setattr(launch, "wait_for_supernode", lambda *args: None)
    monkeypatch.delenv(local.SUPEREXEC_POLL_ENV, raising=False)  # `up` sets it for the SuperLink unless it is set
    root = tmp_path / "fed"
    dep = local.up(root, 2, topology=topology)
    state = root.resolve() / "state"
    assert dep.database == str(state / "superlink.db") and dep.state == str(state)
    assert [p.name for p in started] == ["superlink", *names]
    link = started[0].command
    assert link[link.index("--database") + 1] == dep.database
    assert started[0].cwd == str(root.resolve() / "superlink")
    assert started[0].env == {local.SUPEREXEC_POLL_ENV: local.SUPERLINK_SUPEREXEC_POLL}
    folders = set()
    for proc in started[1:]:
        config = _parse_node_config(proc.command)
        assert config["state-dir"] == str(state / proc.name), proc.command
        folder = Path(config["state-dir"])
        assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700  # a silo's ledger: its operator's only
        folders.add(folder)
        assert proc.cwd == str(root.resolve() / proc.name)
    assert len(folders) == len(names)  # one folder per node, never shared
    assert state.stat().st_mode & 0o777 == 0o700
    saved = local.Deployment.load(root)
    assert [(p.name, p.command, p.cwd, p.env) for p in saved.processes] == [
        (p.name, p.command, p.cwd, p.env) for p in started
    ]


def _recorded_spawns(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """`deploy up` with its processes recorded (name, command), not started; the list they are recorded in."""
    started: list[tuple[str, list[str]]] = []

    def spawn(name: str, command: list[str], *, cwd: Path, log: Path, port: int = 0, env=None) -> local.ProcessInfo:
        started.append((name, list(command)))
        return local.ProcessInfo(name, 0, 0, str(log), port, list(command), str(cwd), dict(env or {}))

    monkeypatch.setattr(launch, "spawn", spawn)
    monkeypatch.setattr(launch, "wait_for_superlink", lambda *args: None)
    monkeypatch.setattr(local, "register_supernodes", lambda keys, *args: [None] * len(keys))
    monkeypatch.setattr(launch, "wait_for_supernode", lambda *args: None)
    return started


def test_deploy_up_no_database_keeps_the_superlink_state_in_memory(tmp_path: Path, monkeypatch) -> None:
    """`silofl deploy up --no-database`: no `--database` (the SuperLink's state in memory), the state-dirs still."""
    from silofl.server.cli import main

    started = _recorded_spawns(monkeypatch)
    assert main(["deploy", "up", "--dir", str(tmp_path / "fed"), "--silos", "2", "--no-database"]) == 0
    assert local.Deployment.load(tmp_path / "fed").database == ""
    assert "--database" not in started[0][1]
    assert all("state-dir=" in " ".join(command) for _, command in started[1:])


def test_deploy_up_policy_reaches_every_node_and_a_bad_one_starts_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    """`silofl deploy up --policy FILE`: every SuperNode's node config names the policy file (absolute), as `silofl
    silo start --policy` does for one node; a policy with a bad key stops `up` before any process starts, naming
    the key."""
    from silofl.server.cli import main

    started = _recorded_spawns(monkeypatch)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    assert main(["deploy", "up", "--dir", str(tmp_path / "fed"), "--silos", "2", "--policy", str(policy)]) == 0
    assert 'algorithm="dp-fedsgd" epsilon=1.0' in capsys.readouterr().out  # what a budgeted federation answers
    assert [name for name, _ in started] == ["superlink", "silo_0", "silo_1"]
    for _, command in started[1:]:
        assert _parse_node_config(command)["policy"] == str(policy.resolve())
    started.clear()
    policy.write_text("lifetime-epsilon = 2\n")  # no lifetime-delta
    assert main(["deploy", "up", "--dir", str(tmp_path / "other"), "--silos", "2", "--policy", str(policy)]) == 1
    err = capsys.readouterr().err
    assert "--policy" in err and "lifetime-delta" in err and not started


def _fake_supernode(dep: local.Deployment, name: str, node_id: int) -> local.ProcessInfo:
    """A process that logs like a SuperNode that joined and then idles: what `restart` waits for."""
    command = ["sh", "-c", f"sleep 0.3; printf 'SuperNode %s: {node_id}\\n' ID; exec sleep 120"]  # not on its $ line
    return launch.spawn(name, command, cwd=Path(dep.dir) / name, log=Path(dep.dir) / "logs" / f"{name}.log")


@pytest.fixture
def fake_deployment(tmp_path: Path) -> Iterator[local.Deployment]:
    """deploy.json with two long-running stand-ins for SuperNodes (no SuperLink), stopped at the end."""
    dep = local.Deployment(str(tmp_path), True, "127.0.0.1:1", "127.0.0.1:2", str(tmp_path / "flwr_home"))
    dep.processes = [_fake_supernode(dep, f"silo_{k}", k) for k in range(2)]
    dep.save()
    for proc in dep.processes:
        launch.wait_for_supernode(proc, timeout=30)
    try:
        yield dep
    finally:
        local.down(tmp_path, grace=2)


def test_restart_starts_again_exactly_what_died(fake_deployment: local.Deployment, capsys) -> None:
    """`silofl deploy restart --dir DIR`: only the dead process, with its command, working directory and log (appended,
    and waited for from the restart on); `--node NAME` restarts a running one; unknown names are refused."""
    from silofl.server.cli import main

    root = Path(fake_deployment.dir)
    first, second = fake_deployment.processes
    _kill_group(first)
    assert main(["deploy", "status", "--dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "silo_0       NOT RUNNING" in out and "silo_1       running" in out
    assert f"silofl deploy restart --dir {root}" in out
    assert main(["deploy", "restart", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "restarted silo_0" in out and "silo_1" not in out
    now = local.Deployment.load(root)
    again = now.process("silo_0")
    assert again.pid != first.pid and processes.alive(again)
    assert (again.command, again.cwd, again.log) == (first.command, first.cwd, first.log)
    assert again.log_start > first.log_start  # the restart's lines follow the first process's in the same log
    assert Path(again.log).read_text().count("SuperNode ID: 0") == 2
    assert now.process("silo_1").pid == second.pid  # left alone
    assert main(["deploy", "restart", "--dir", str(root)]) == 0
    assert "every process of" in capsys.readouterr().out
    assert main(["deploy", "restart", "--dir", str(root), "--node", "silo_1"]) == 0
    assert local.Deployment.load(root).process("silo_1").pid != second.pid and not processes.alive(second)
    assert main(["deploy", "restart", "--dir", str(root), "--node", "silo_9"]) == 1
    assert "has no process named 'silo_9'; its processes: silo_0, silo_1" in capsys.readouterr().err
    assert main(["deploy", "status", "--dir", str(root)]) == 0


@pytest.mark.parametrize("database", ["state/superlink.db", ""])
def test_a_restarted_superlink_without_database_restarts_the_supernodes_too(
    fake_deployment: local.Deployment, monkeypatch, database: str
) -> None:
    """A SuperLink with a database still knows the SuperNodes after a restart: they reconnect, only it is started
    again. One without has forgotten them (they would be refused): `restart` starts them again as well."""
    root = Path(fake_deployment.dir)
    link = launch.spawn("superlink", ["sleep", "120"], cwd=root / "superlink", log=root / "logs" / "superlink.log")
    fake_deployment.processes.insert(0, link)
    fake_deployment.database = database
    fake_deployment.save()
    monkeypatch.setattr(launch, "wait_for_superlink", lambda *args: None)  # a stand-in: no ports to wait for
    _kill_group(link)
    restarted = [p.name for p in local.restart(root, grace=2)]
    assert restarted == (["superlink"] if database else ["superlink", "silo_0", "silo_1"])
    assert all(processes.alive(p) for p in local.Deployment.load(root).processes)


def test_restart_refuses_a_deployment_that_did_not_record_its_commands(tmp_path: Path) -> None:
    dep = local.Deployment(
        str(tmp_path), True, "a:1", "a:2", str(tmp_path), processes=[local.ProcessInfo("silo_0", 1, 1, "l")]
    )
    dep.save()
    with pytest.raises(local.DeployError, match=r"does not record the command of silo_0.*deploy down --dir"):
        local.restart(tmp_path)


def test_register_supernodes_accepts_keys_the_database_already_holds(tmp_path: Path, monkeypatch) -> None:
    """`up` again after `down`, or `restart` of the SuperLink: its database still holds the keys (Flower 1.39 answers
    "[code: 23] Public key already in use"); anything else is still an error."""
    replies = iter(
        [
            '{"success": true, "node-id": "7"}',
            '{"success": false, "error-message": "Using SuperLink: x\\n\\n[code: 23] Public key already in use."}',
            '{"success": false, "error-message": "[code: 1] something else"}',
        ]
    )
    monkeypatch.setattr(
        flower_setup.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=next(replies), stderr=""),
    )
    assert local.register_supernodes([tmp_path / "a.pub", tmp_path / "b.pub"], tmp_path) == [7, None]
    with pytest.raises(local.DeployError, match=r"registering .*c\.pub failed.*something else"):
        local.register_supernodes([tmp_path / "c.pub"], tmp_path)


# --- the real deployment ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.Deployment]:
    """`deploy up --policy` with 2 silos (TLS, authentication, silofl's SuperNode runtime, a lifetime budget),
    always torn down."""
    root = tmp_path_factory.mktemp("faults")
    policy = root / "policy.toml"
    policy.write_text(POLICY)
    dep = local.up(root, SILOS, policy=policy)
    try:
        yield dep
    finally:
        current = local.Deployment.load(root)
        local.down(root, grace=5)
        left = [p.name for p in current.processes if processes.alive(p)]
        assert not left, f"still running after down: {left}"
        assert not processes.descendants(current.processes)


def _silofl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The documented command line (`silofl ...`, as `python -m silofl.server.cli`)."""
    done = subprocess.run(
        [sys.executable, "-m", "silofl.server.cli", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"silofl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _run_config(out: Path, seed: int, *, resume: bool = False) -> str:
    config = (
        f'algorithm="dp-fedsgd" epsilon=1.0 rounds={ROUNDS} epochs=0 eval-every={ROUNDS} batch-size=64 seed={seed} '
        f'checkpoint-every=1 round-timeout={ROUND_TIMEOUT} num-silos={SILOS} out-dir="{out}"'
    )
    return config + (" resume=true" if resume else "")


class Submitted:
    """`flwr run . silofl-local --stream --run-config ...` in the background, its output collected."""

    def __init__(self, dep: local.Deployment, run_config: str) -> None:
        flwr = str(flower_setup.bin_dir() / "flwr")
        command = [flwr, "run", ".", dep.connection, "--stream", "--run-config", run_config]
        self.process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=local.flower_env(Path(dep.flwr_home)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int | None:
        """Its exit code, or None if it was still running after `timeout` s (then it is stopped: a `flwr run`
        streaming from a SuperLink that is gone may retry for a long time)."""
        try:
            code: int | None = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            code = None
        self._reader.join(10)
        return code


def _state_dir(dep: local.Deployment, k: int) -> Path:
    return Path(dep.state) / f"silo_{k}"


def _job_file(dep: local.Deployment, k: int, known: set[Path]) -> Path | None:
    """Silo k's job state file of the job under test (the one not in `known`, the files of earlier jobs)."""
    found = [p for p in _state_dir(dep, k).glob(f"silo{k}-job-*.json") if p not in known]
    assert len(found) <= 1, found
    return found[0] if found else None


def _charged_rounds(path: Path) -> list[int]:
    """The rounds the silo's ledger file charges, from the raw JSON (`records` -> `silofl.ledger` ->
    `round_run_start` / `round_run_length`), every repetition kept."""
    document = json.loads(path.read_text())
    ledger = document["records"][privacy_state.LEDGER_KEY]["values"]
    starts, lengths = ledger["round_run_start"], ledger["round_run_length"]
    return [start + i for start, length in zip(starts, lengths, strict=True) for i in range(length)]


def _wait_for_round(out: Path, at: int, run: Submitted, timeout: float = 180) -> None:
    """Until the server's checkpoint in `out` holds round `at` (the run is mid-way)."""
    from silofl.server import checkpoint

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(checkpoint.CheckpointError):
            if checkpoint.load(out).completed >= at:
                return
        assert run.process.poll() is None, f"the run ended before round {at}:\n{run.output[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"round {at} not completed within {timeout} s:\n{run.output[-3000:]}")


def _wait_while_answering(proc: local.ProcessInfo, offset: int, first_round: int, run: Submitted) -> int:
    """Until SuperNode `proc` has received a train message of round `first_round` or later (in its log after
    `offset`) and not yet started sending its reply: its ClientApp is answering (it charges its ledger first). The
    round. A SuperNode killed while it pushes its reply (milliseconds) leaves a half-pushed reply (docs/FAULTS.md):
    this test kills it before, while the outcome does not depend on when the kill lands."""
    for at in range(first_round, ROUNDS):
        marker = f", ROUND {at}]"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log = processes.log_since(proc)[offset:]
            answering = log[log.find(marker) :] if marker in log else ""
            if "Sending: train message" in answering:
                break  # too late for this round: the next one
            if "Received successfully" in answering:
                return at
            assert run.process.poll() is None, f"the run ended:\n{run.output[-3000:]}"
            time.sleep(0.005)
    raise AssertionError(f"{proc.name} was never caught answering a round:\n{processes.log_since(proc)[-3000:]}")


def _known_jobs(dep: local.Deployment) -> set[Path]:
    return {p for k in range(SILOS) for p in _state_dir(dep, k).glob("silo*-job-*.json")}


def _logs(dep: local.Deployment, chars: int = 2000) -> str:
    """The end of every process's log (what a failed check prints: CI keeps nothing else), after every live
    SuperNode and ClientApp worker has printed its threads' stacks there (SIGUSR1: `dump_stacks_on_signal`)."""
    now = local.Deployment.load(Path(dep.dir))
    nodes = [p for p in now.processes if p.name != "superlink"]
    for pid in [p.pid for p in nodes if processes.alive(p)] + processes.descendants(nodes):
        with contextlib.suppress(OSError):  # only silofl's runtime processes handle the signal (others would die)
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"silofl.client.supernode_runtime" in command and b"--single-task" not in command:
                os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    return "".join(
        f"\n--- {p.name} (alive: {processes.alive(p)}):\n{processes.log_since(p)[-chars * 3 :]}" for p in now.processes
    )


def _result(out: Path, output: str, dep: local.Deployment | None = None) -> dict:
    path = out / "result.json"
    if not path.is_file():
        raise AssertionError(
            f"no result.json in {out}; flwr run said:\n{output[-3000:]}" + (_logs(dep) if dep is not None else "")
        )
    return json.loads(path.read_text())


def _resume_and_check(dep: local.Deployment, out: Path, seed: int, known: set[Path]) -> dict:
    """Resubmit the run with resume=true: it completes, and every silo's ledger charges rounds 1..ROUNDS once each,
    with no charge left pending."""
    resumed = Submitted(dep, _run_config(out, seed, resume=True))
    code = resumed.wait(240)
    result = _result(out, resumed.output, dep)
    if code != 0 or not result["status"]["completed"]:
        raise AssertionError(
            f"the resumed run did not complete (exit {code}; result.json: {result['status']['error']}); flwr run "
            f"said:\n{resumed.output[-3000:]}{_logs(dep)}"
        )
    assert result["status"]["resumed_from"] is not None and len(result["rounds"]) == ROUNDS
    for k in range(SILOS):
        path = _job_file(dep, k, known)
        assert path is not None, f"silo {k} kept no state for the job"
        assert _charged_rounds(path) == list(range(1, ROUNDS + 1)), (k, _charged_rounds(path))
        records = json.loads(path.read_text())["records"]
        assert privacy_state.PENDING_KEY not in records, f"silo {k} has a charge pending"
        # the silo's lifetime ledger: this job admitted once (its whole planned run: ROUNDS rounds), beside the jobs
        # of earlier tests; the one evaluation (round ROUNDS, reached only by the resumed run) charged once
        lifetime = lifetime_ledger.load(_state_dir(dep, k))
        new = {key for key in lifetime.jobs if _state_dir(dep, k) / f"{key}.json" not in known}
        assert new == {path.stem}, (k, sorted(lifetime.jobs), path.stem)
        assert sum(steps for _, _, steps in lifetime.jobs[path.stem].events) >= ROUNDS
        evaluated = [run for run in lifetime.evaluation_runs.values() if run["last_round"] == ROUNDS]
        assert len(evaluated) >= 1 and evaluated[-1] == {"count": 1, "first_round": ROUNDS, "last_round": ROUNDS}
    privacy = result["privacy"]
    assert 0 < privacy["epsilon_spent"] <= 1.0
    return result


def _all_running(dep: local.Deployment) -> None:
    """Every process of the federation runs (a test that failed half-way may have left one dead)."""
    local.restart(dep.dir)
    assert all(processes.alive(p) for p in local.Deployment.load(Path(dep.dir)).processes)


def _kill_group(proc: local.ProcessInfo) -> None:
    """SIGKILL the process group `up` started `proc` in (the SuperNode and its ClientApp process: a machine that
    goes down), and collect it."""
    os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes.alive(proc) and time.monotonic() < deadline:
        processes.reap([proc.pid])
        time.sleep(0.05)
    assert not processes.alive(proc)


@pytest.mark.slow
def test_a_supernode_killed_mid_run_is_restarted_and_the_run_resumed(
    federation: local.Deployment, tmp_path: Path
) -> None:
    """(a) SIGKILL silo_1's SuperNode once both silos charged round 3 of a DP-FedSGD run: the run stops (the round
    timeout, or Flower's error for the dead node); `silofl deploy restart --dir DIR` starts it again with the same
    key and state-dir; `resume` finishes the run, and each silo's ledger charges rounds 1..T once."""
    dep, out, seed = federation, tmp_path / "out", 11
    _all_running(dep)
    known = _known_jobs(dep)
    victim = local.Deployment.load(Path(dep.dir)).process("silo_1")
    log_before = len(processes.log_since(victim))
    run = Submitted(dep, _run_config(out, seed))
    _wait_for_round(out, 3, run)
    at = _wait_while_answering(victim, log_before, first_round=4, run=run)
    _kill_group(victim)
    killed_at = time.monotonic()
    code = run.wait(ROUND_TIMEOUT + 120)
    stopped_after = time.monotonic() - killed_at
    result = _result(out, run.output)
    assert code is not None and result["status"]["state"] == "stopped", (result["status"], run.output[-2000:])
    assert "silo 1" in result["status"]["error"], result["status"]["error"]
    assert stopped_after < ROUND_TIMEOUT + 60
    assert result["status"]["rounds_completed"] in (at - 1, at), (at, result["status"])  # at: a reply raced the kill

    status = subprocess.run(
        [sys.executable, "-m", "silofl.server.cli", "deploy", "status", "--dir", dep.dir],
        capture_output=True,
        text=True,
    )
    assert status.returncode == 1 and "silo_1       NOT RUNNING" in status.stdout, status.stdout
    restarted = _silofl("deploy", "restart", "--dir", dep.dir)
    assert "restarted silo_1" in restarted.stdout and "superlink" not in restarted.stdout, restarted.stdout
    again = local.Deployment.load(Path(dep.dir)).process("silo_1")
    assert again.pid != victim.pid and again.command == victim.command  # the same key, node config, state-dir
    _resume_and_check(dep, out, seed, known)


@pytest.mark.slow
def test_a_superlink_killed_mid_run_is_restarted_and_the_run_resumed(
    federation: local.Deployment, tmp_path: Path
) -> None:
    """(b) SIGKILL the SuperLink once both silos charged round 3: the SuperNodes keep running and say in their logs
    that they lost the SuperLink at its address; `silofl deploy restart --dir DIR` starts it again on its database
    (registrations kept; what was left of its ServerApp is stopped), the SuperNodes reconnect by themselves and say
    so; `resume` finishes the run, and each silo's ledger charges rounds 1..T once."""
    dep, out, seed = federation, tmp_path / "out", 12
    _all_running(dep)
    known = _known_jobs(dep)
    run = Submitted(dep, _run_config(out, seed))
    _wait_for_round(out, 3, run)
    link = local.Deployment.load(Path(dep.dir)).process("superlink")
    os.kill(link.pid, signal.SIGKILL)
    run.wait(60)  # its stream is gone; stopped if it keeps retrying
    time.sleep(2)  # the SuperNodes poll at least every 3 s: they notice
    restarted = _silofl("deploy", "restart", "--dir", dep.dir)
    assert "restarted superlink" in restarted.stdout and "silo_" not in restarted.stdout, restarted.stdout
    now = local.Deployment.load(Path(dep.dir))
    assert now.process("superlink").command == link.command
    _resume_and_check(dep, out, seed, known)
    assert "--database" in link.command
    for proc in now.processes[1:]:
        assert processes.alive(proc), f"{proc.name} stopped:\n{processes.log_since(proc)[-3000:]}"
        log = processes.log_since(proc)
        assert f"silofl SuperNode: lost the SuperLink at {dep.fleet_address}" in log, log[-3000:]
        assert f"silofl SuperNode: reconnected to the SuperLink at {dep.fleet_address} after" in log, log[-3000:]
        assert "terminated gracefully" not in log


@pytest.mark.slow
def test_a_superlink_that_lost_its_database_is_repaired_by_restart(
    federation: local.Deployment, tmp_path: Path
) -> None:
    """Its database deleted, a restarted SuperLink no longer knows the SuperNodes' keys: each SuperNode says so in its
    log (naming the SuperLink and `flwr supernode register`) and stops; `silofl deploy restart` (which registered the
    keys again when it restarted the SuperLink) then starts them again, and a run completes."""
    dep = federation
    root = Path(dep.dir)
    _all_running(dep)
    link = local.Deployment.load(root).process("superlink")
    os.kill(link.pid, signal.SIGKILL)
    processes.reap([link.pid])
    for path in Path(dep.state).glob(local.DATABASE_FILE + "*"):  # the database and its -wal / -shm files
        path.unlink()
    _silofl("deploy", "restart", "--dir", dep.dir)
    nodes = local.Deployment.load(root).processes[1:]
    deadline = time.monotonic() + 90
    while any(processes.alive(p) for p in nodes) and time.monotonic() < deadline:
        processes.reap([p.pid for p in nodes])
        time.sleep(0.5)
    for proc in nodes:
        log = processes.log_since(proc)
        assert not processes.alive(proc), f"{proc.name} still runs:\n{log[-2000:]}{_logs(dep)}"
        assert (
            f"silofl SuperNode: the SuperLink at {dep.fleet_address} no longer knows this node's key (Invalid node ID)"
            in log
        ), log[-3000:]
        assert "flwr supernode register NODE.pub CONNECTION" in log and "terminated gracefully" in log
    restarted = _silofl("deploy", "restart", "--dir", dep.dir)
    assert all(f"restarted {p.name}" in restarted.stdout for p in nodes), restarted.stdout
    out = tmp_path / "after"
    run = Submitted(  # under a lifetime budget the silos answer noised algorithms only
        dep, f'algorithm="dp-fedsgd" epsilon=1.0 rounds=2 epochs=0 num-silos={SILOS} out-dir="{out}"'
    )
    assert run.wait(240) == 0, run.output[-3000:]
    assert len(_result(out, run.output)["rounds"]) == 2
