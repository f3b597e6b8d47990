"""What a local deployment's Flower processes and commands are given: this environment's Flower scripts, a Flower
process's environment (FLWR_HOME, PATH, PYTHONPATH), the `flwr` connection to the SuperLink
(FLWR_HOME/config.toml), and the SuperNodes' keys registered with the SuperLink (`flwr supernode register`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from silofl.client.silo_cli import RUNTIME_ENV
from silofl.server.deploy.deployment import CONNECTION, DeployError

__all__ = ["ALREADY_REGISTERED", "bin_dir", "flower_env", "register_supernodes", "write_connection_config"]


def bin_dir() -> Path:
    """The environment's scripts folder (flower-superlink, flwr, ...): the one this Python runs from."""
    return Path(sys.executable).parent


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for a Flower process: its own FLWR_HOME, this environment's scripts first on PATH, no installs."""
    env = dict(os.environ)
    env.update(RUNTIME_ENV)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = f"{bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    # The ServerApp and ClientApp processes import silofl: make the project importable even if not pip-installed.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


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
        command = [str(bin_dir() / "flwr"), "supernode", "register", str(key), connection, "--format", "json"]
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
