"""silofl in docker compose, end to end: images built from a local Debian base, a SuperLink and three silos with TLS
and SuperNode authentication, a 2-round FedAvg run submitted with `flwr run`, its result.json read back; then a
census-style federation of parties (docker-compose.parties.yml: one sensitive party, three feature parties) running
a 2-round SteFFLe, from the same images (built once for the module). First, without Docker, the compose files as
written: the SuperLink's database and every node's state folder are on volumes that survive restarts.

Sets up what it needs and stops what it started: without a running Docker engine it installs `docker.io
docker-compose debootstrap` (apt-get, as root) and starts `dockerd` in the background with its own data root under
$SILOFL_DOCKER_CACHE (default ~/.cache/silofl/docker, kept between runs so the base image is built once), then
stops it by its pid. Under CI (CI=true) a Docker engine that cannot be set up is a failure; elsewhere a skip that
says why. Every wait is bounded. Measured times are printed (`pytest -s`) and kept as test properties.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
DOCKER_DIR = PROJECT / "docker"
COMPOSE_FILE = DOCKER_DIR / "docker-compose.yml"
PARTIES_COMPOSE_FILE = DOCKER_DIR / "docker-compose.parties.yml"
BASE_TAG = "silofl/base:bookworm"
SILOS = 3
ROUNDS = 2
APP_UID = 49999  # the containers' user (`app`, as in Flower's images)
CONNECTION = "silofl-docker"
CACHE = Path(os.environ.get("SILOFL_DOCKER_CACHE", Path.home() / ".cache" / "silofl" / "docker"))


# --- the compose files as written (no Docker) ------------------------------------------------------------------------


def _compose(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def _flag(command: list[str], flag: str) -> str | None:
    """The value of `--flag=value` in a service's command list (the form the compose files use), None if absent."""
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(flag + "=")]
    assert len(values) <= 1, f"{flag} given {len(values)} times in {command}"
    return values[0] if values else None


def _mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of a service's short-syntax volumes (a source may hold `${VAR:-default}`)."""
    found = []
    for entry in service.get("volumes", []):
        if entry.rsplit(":", 1)[1] in ("ro", "rw"):
            source, target, mode = entry.rsplit(":", 2)
        else:
            (source, target), mode = entry.rsplit(":", 1), "rw"
        found.append((source, target, mode))
    return found


@pytest.mark.parametrize(
    ("compose_file", "count"), [(COMPOSE_FILE, SILOS), (PARTIES_COMPOSE_FILE, SILOS + 1)], ids=["silos", "parties"]
)
def test_every_node_keeps_its_state_in_a_volume_of_its_own(compose_file: Path, count: int) -> None:
    """Every silo or party passes `--state-dir` (node config state-dir: its privacy ledger and journaled answers) and
    mounts a named volume there, writable, declared in the file, used by no other service: a restarted container
    continues its runs and never forgets what it spent."""
    doc = _compose(compose_file)
    declared = set(doc.get("volumes") or {})
    nodes = {name: svc for name, svc in doc["services"].items() if name != "superlink"}
    assert len(nodes) == count and all("--data=/data" in svc["command"] for svc in nodes.values())
    owners: dict[str, str] = {}
    for name, service in nodes.items():
        state = _flag(service["command"], "--state-dir")
        assert state, f"{compose_file.name}: {name} has no --state-dir (its ledger would not survive a restart)"
        (mount,) = [m for m in _mounts(service) if m[1] == state] or [None]
        assert mount is not None, f"{compose_file.name}: {name}: nothing is mounted at its --state-dir {state}"
        source, _, mode = mount
        assert source in declared, f"{name}: {source} at {state} is not a named volume of the file"
        assert mode == "rw", f"{name}: its state volume is mounted {mode}"
        assert source not in owners, f"{name} and {owners.get(source)} share the state volume {source}"
        owners[source] = name
        data = [m for m in _mounts(service) if m[1] == "/data"]
        assert len(data) == 1 and data[0][2] == "ro"  # its data read-only, as before


def test_the_superlink_keeps_its_database_on_a_volume() -> None:
    """`--database` under a named volume (registered keys, runs survive a restart); the parties' file uses the same
    SuperLink (`extends`) and declares that volume too; the images create /app/state for user app, so a fresh named
    volume mounted there is writable by the containers' uid."""
    doc = _compose(COMPOSE_FILE)
    link = doc["services"]["superlink"]
    database = _flag(link["command"], "--database")
    assert database == "/app/state/superlink.db"
    (mount,) = [m for m in _mounts(link) if m[1] == str(Path(database).parent)]
    assert mount[0] in set(doc["volumes"]) and mount[2] == "rw"
    parties = _compose(PARTIES_COMPOSE_FILE)
    assert parties["services"]["superlink"]["extends"] == {"file": "docker-compose.yml", "service": "superlink"}
    assert mount[0] in set(parties["volumes"])
    dockerfile = (DOCKER_DIR / "Dockerfile").read_text()
    assert "mkdir -p /app/runs /app/state" in dockerfile and "chown app:app /app/runs /app/state" in dockerfile


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"docker compose test cannot run under CI: {reason}")
    pytest.skip(reason)


def _run(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` with a time limit; on failure, an error that shows the command and the end of its output."""
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n{(exc.stdout or '')[-2000:]}") from exc
    if check and done.returncode != 0:
        raise AssertionError(
            f"exit {done.returncode}: {' '.join(cmd)}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
    return done


def _engine_answers(env: dict[str, str]) -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    with contextlib.suppress(subprocess.TimeoutExpired):
        return subprocess.run([docker, "version"], env=env, capture_output=True, timeout=20).returncode == 0
    return False


def _prune_dangling_images(env: dict[str, str]) -> None:
    """`docker image prune -f`: delete untagged images (earlier builds of the silofl images), keep tagged ones."""
    _run([shutil.which("docker") or "docker", "image", "prune", "-f"], timeout=1200, env=env, check=False)


def _install_packages() -> None:
    """apt-get install the engine, compose 1.29 and debootstrap (Debian's packages)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _unavailable(
            "no Docker engine, and installing one needs root and apt-get (docker.io docker-compose debootstrap)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update"], timeout=300, env=env)
    _run(
        ["apt-get", "install", "-y", "--no-install-recommends", "docker.io", "docker-compose", "debootstrap"],
        timeout=600,
        env=env,
    )


def _start_dockerd(env: dict[str, str]) -> int:
    """Start dockerd in the background on its own socket and data root; its pid once the engine answers."""
    if os.geteuid() != 0:
        _unavailable("dockerd is not running and starting it needs root")
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    CACHE.mkdir(parents=True, exist_ok=True)
    log = (CACHE / "dockerd.log").open("ab")
    proc = subprocess.Popen(
        [
            dockerd,
            "--data-root",
            str(CACHE / "data-root"),
            "--exec-root",
            str(CACHE / "exec-root"),
            "--pidfile",
            str(CACHE / "dockerd.pid"),
            "--host",
            env["DOCKER_HOST"],
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (CACHE / "dockerd.log").read_text(errors="replace")[-2000:]
            _unavailable(f"dockerd exited with {proc.returncode}; {CACHE / 'dockerd.log'} ends with:\n{tail}")
        if _engine_answers(env):
            return proc.pid
        time.sleep(1)
    proc.kill()
    _unavailable("dockerd did not answer within 90 s")
    raise AssertionError("unreachable")


def _stop_dockerd(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    """An environment whose `docker` and `docker-compose` reach a working engine (started here if need be)."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0", "COMPOSE_DOCKER_CLI_BUILD": "0"}
    started: int | None = None
    if not _engine_answers(env):
        if (
            shutil.which("dockerd") is None
            or shutil.which("docker-compose") is None
            or shutil.which("debootstrap") is None
        ):
            _install_packages()
        env["DOCKER_HOST"] = f"unix://{CACHE / 'docker.sock'}"
        if not _engine_answers(env):  # a dockerd of an earlier run may still hold our socket
            started = _start_dockerd(env)
    if shutil.which("docker-compose") is None or shutil.which("debootstrap") is None:
        _install_packages()
    try:
        yield env
    finally:
        if started is not None:
            _stop_dockerd(started)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _silofl(*args: str, timeout: float = 120) -> None:
    _run([sys.executable, "-m", "silofl.server.cli", *args], timeout=timeout, cwd=PROJECT)


def _flwr(
    args: list[str], env: dict[str, str], timeout: float = 60, check: bool = True
) -> subprocess.CompletedProcess[str]:
    flwr = Path(sys.executable).with_name("flwr")
    return _run([str(flwr) if flwr.exists() else "flwr", *args], timeout=timeout, env=env, cwd=PROJECT, check=check)


def _json_reply(done: subprocess.CompletedProcess[str]) -> dict:
    start = done.stdout.find("{")
    return json.loads(done.stdout[start:]) if start >= 0 else {}


def _wait(what: str, timeout: float, check, on_timeout=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{on_timeout()}")


@pytest.fixture(scope="module")
def images(docker_env: dict[str, str]) -> Iterator[dict[str, float]]:
    """The silofl images, built once for the module: a Debian base (built once, then cached in the engine), the
    wheelhouse, then superlink and silo (tag `test`; both compose files use these two). Yields the build timings."""
    timings: dict[str, float] = {}
    env = {**docker_env, **_image_settings()}
    # Every build re-tags the silofl images, leaving the previous ones dangling in the engine's cache: remove them
    # first (the tagged base image stays), or the cache grows by a few GB per run until the disk is full (measured:
    # 47 GB after a few dozen CI runs, then "no space left on device" while building).
    _prune_dangling_images(env)
    t0 = time.monotonic()
    _run([str(DOCKER_DIR / "build_base.sh"), "--tag", BASE_TAG], timeout=900, env=env)
    timings["base_build_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    _run([str(DOCKER_DIR / "wheels.sh"), "--python", sys.executable], timeout=900, env=env)
    timings["wheels_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    _run(["docker-compose", "-f", str(COMPOSE_FILE), "-p", f"silofltest{os.getpid()}", "build"], timeout=900, env=env)
    timings["image_build_s"] = time.monotonic() - t0
    try:
        yield timings
    finally:
        _prune_dangling_images(env)


def _image_settings() -> dict[str, str]:
    return {"SILOFL_SUPERLINK_BASE": BASE_TAG, "SILOFL_SILO_BASE": BASE_TAG, "SILOFL_TAG": "test"}


def _compose_run(
    docker_env: dict[str, str],
    tmp_path: Path,
    *,
    compose_file: Path,
    project: str,
    nodes: list[str],
    split: list[str],
    run_config: str,
    out: str,
) -> tuple[dict, dict[str, float]]:
    """Keys and data for `nodes` (`silofl deploy certs` / `silofl data split` with the `split` flags), the compose
    federation of `compose_file` up (SuperLink, keys registered, every node online), one run submitted with
    `flwr run` from the host, its result.json read back, and everything taken down again. (result, timings)."""
    timings: dict[str, float] = {}
    env = dict(docker_env)
    control_port, fleet_port = _free_port(), _free_port()
    certs, data, results, flwr_home = (tmp_path / d for d in ("certs", "data", "results", "flwr_home"))
    env.update(
        _image_settings(),
        SILOFL_CERTS=str(certs),
        SILOFL_SILOS=str(data),
        SILOFL_PARTIES=str(data),
        SILOFL_RESULTS=str(results),
        SILOFL_CONTROL_PORT=str(control_port),
        SILOFL_FLEET_PORT=str(fleet_port),
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
    )
    compose = ["docker-compose", "-f", str(compose_file), "-p", project]

    # 1. Data, keys, results folder, the `flwr` connection.
    _silofl("data", "split", "synthetic", *split, "--out", str(data))
    _silofl("deploy", "certs", "--out", str(certs), *split, "--hosts", "superlink")
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == sorted(nodes)
    # The containers run as uid 49999: they must read the private keys and the data folders, which are written
    # readable by their owner only.
    private = [certs / "superlink.key", *(certs / f"{name}.key" for name in nodes), *data.rglob("*")]
    private += list(certs.glob("*.party.json"))  # the parties' key files (sealed record exchange)
    for path in private:
        if os.geteuid() == 0:
            os.chown(path, APP_UID, -1)
        elif path.is_file():
            path.chmod(0o644)  # inside this test's private tmp folder
    results.mkdir()
    results.chmod(0o777)
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{control_port}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n'
    )

    def logs() -> str:
        return _run([*compose, "logs", "--no-color", "--tail", "25"], timeout=60, env=env, check=False).stdout

    try:
        # 2. SuperLink up, the nodes' keys registered through its Control API, the nodes up and connected.
        t0 = time.monotonic()
        _run([*compose, "up", "-d", "superlink"], timeout=300, env=env)
        for name in nodes:
            key = certs / f"{name}.pub"
            _wait(
                f"the Control API to register {key.name}",
                90,
                lambda key=key: _json_reply(
                    _flwr(["supernode", "register", str(key), CONNECTION, "--format", "json"], env, check=False)
                ).get("success", False),
                logs,
            )
        _run([*compose, "up", "-d"], timeout=300, env=env)

        def online() -> int:
            listing = _json_reply(_flwr(["supernode", "list", CONNECTION, "--format", "json"], env, check=False))
            return sum(1 for n in listing.get("nodes", []) if str(n.get("status", "")).lower() == "online")

        _wait(f"{len(nodes)} nodes online", 180, lambda: online() == len(nodes), logs)
        timings["compose_up_s"] = time.monotonic() - t0

        # 3. One run, submitted from the host; result.json appears in the mounted results folder.
        t0 = time.monotonic()
        run_config += f' out-dir="runs/{out}"'
        submitted = _flwr(["run", ".", CONNECTION, "--run-config", run_config, "--format", "json"], env, timeout=180)
        reply = _json_reply(submitted)
        assert reply.get("success"), submitted.stdout + submitted.stderr
        run_id = str(reply["run-id"])
        result_path = results / out / "result.json"

        def finished() -> bool:
            if result_path.exists():
                return True
            runs = _json_reply(_flwr(["ls", CONNECTION, "--format", "json"], env, check=False)).get("runs", [])
            status = next((r for r in runs if str(r.get("run-id")) == run_id), {})
            if str(status.get("status", "")).startswith("finished:") and status["status"] != "finished:completed":
                raise AssertionError(f"run {run_id} {status['status']}: {status.get('status-details')}\n{logs()}")
            return False

        _wait("result.json", 900, finished, logs)
        time.sleep(0.5)  # written in one go, but give the writer a moment
        result = json.loads(result_path.read_text())
        timings["run_wall_s"] = time.monotonic() - t0
    finally:
        _run([*compose, "down", "-v", "--remove-orphans"], timeout=300, env=env, check=False)
    seconds_per_round = float(result["timing"]["seconds_per_round"])
    assert seconds_per_round > 0
    timings["seconds_per_round"] = seconds_per_round
    return result, timings


def _report(timings: dict[str, float], record_property, what: str) -> None:
    for name, value in timings.items():
        record_property(name, round(value, 2))
    print(f"docker compose timings ({what}): " + ", ".join(f"{k}={v:.2f}" for k, v in timings.items()))


@pytest.mark.slow  # several minutes: in the default selection (CI), not in `-m "not slow"`
def test_compose_federation_runs_fedavg(docker_env, images, tmp_path, record_property):
    result, timings = _compose_run(
        docker_env,
        tmp_path,
        compose_file=COMPOSE_FILE,
        project=f"silofltest{os.getpid()}",
        nodes=[f"silo_{k}" for k in range(SILOS)],
        split=["--silos", str(SILOS)],
        run_config=f'algorithm="fedavg" epsilon="inf" rounds={ROUNDS} epochs=0 num-silos={SILOS}',
        out="compose-test",
    )
    assert result["config"]["algorithm"] == "fedavg"
    assert len(result["federation"]["silos"]) == SILOS
    assert len(result["rounds"]) == ROUNDS
    assert 0.5 < result["final"]["accuracy"] <= 1.0
    _report({**images, **timings}, record_property, "silos, fedavg")


@pytest.mark.slow
def test_compose_census_federation_runs_steffle(docker_env, images, tmp_path, record_property):
    """docker-compose.parties.yml: a census bureau (sensitive-0) and three banks (features-0..2), each a container
    with its own key; a 2-round SteFFLe with topology central-sensitive, from the images the module built."""
    nodes = [f"features_{k}" for k in range(SILOS)] + ["sensitive_0"]
    result, timings = _compose_run(
        docker_env,
        tmp_path,
        compose_file=PARTIES_COMPOSE_FILE,
        project=f"silofltest{os.getpid()}parties",
        nodes=nodes,
        split=["--silos", str(SILOS), "--topology", "central-sensitive"],
        run_config=(
            f'algorithm="steffle" topology="central-sensitive" epsilon=1.0 lambda=1.0 rounds={ROUNDS} epochs=0 '
            f"eval-every={ROUNDS} num-silos={SILOS}"
        ),
        out="compose-parties",
    )
    federation = result["federation"]
    assert result["config"]["algorithm"] == "steffle" and federation["topology"] == "central-sensitive"
    assert len(federation["silos"]) == SILOS and len(federation["sensitive_parties"]) == 1
    assert federation["sensitive_parties"][0]["n_train"] == sum(s["n_train"] for s in federation["silos"])
    assert len(result["rounds"]) == ROUNDS
    privacy = result["privacy"]
    assert list(privacy["per_silo"]) == ["0"] and 0 < privacy["per_silo"]["0"]["epsilon_spent"] <= 1.0
    assert 0.4 < result["final"]["accuracy"] <= 1.0  # 2 noisy steps at epsilon 1: a check of sanity, not of skill
    _report(timings, record_property, "census + 3 banks, steffle")
