"""A local deployment's folder DIR and its record, DIR/deploy.json (:class:`Deployment`), which every `silofl
deploy` command reads (`up` writes it, `restart` updates it, `down` renames it). Layout of DIR:

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
  process's exact command line and working directory, which `restart` (:mod:`silofl.server.deploy.local`) starts again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from silofl.client.silo_cli import DEFAULT_RUNTIME
from silofl.server.deploy.processes import ProcessInfo
from silofl.server.deploy.topology import NodeLayout

__all__ = ["CONNECTION", "DATABASE_FILE", "STATE_DIR", "STATE_FILE", "DeployError", "Deployment"]

#: The `flwr` connection of a local deployment (in DIR/flwr_home/config.toml): `flwr run . silofl-local`.
CONNECTION = "silofl-local"
#: The record of what a deployment started, in DIR.
STATE_FILE = "deploy.json"
#: DIR/state: the SuperLink's database and every node's state-dir, kept across restarts and `down`/`up`.
STATE_DIR = "state"
#: The SuperLink's database file in DIR/state (`flower-superlink --database`).
DATABASE_FILE = "superlink.db"


class DeployError(RuntimeError):
    """A deployment step failed; the message names the step and, for a process, the tail of its log."""


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
