"""The engines that run a job: the in-process Grid (tests, sweeps) and Flower's Ray simulation.

Both run the same ServerApp (:func:`server.app.make_server_app`) and the same ClientApp (`silofl.client.app:app`); a
deployment runs them too, through `flwr run .` (see README). Same seed, same result on every engine: silos draw from
(seed, silo, round) and the server sums replies in silo-id order.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flwr.app import Context, RecordDict

from silofl.protocols.config import RunConfig

ENGINES = ("inprocess", "ray")


def simulated_node_configs(config: RunConfig, *, policy: str | None, state_dir: str) -> list[dict[str, str]]:
    """Each simulated node's operator settings: the policy file (read and checked now: `PolicyError` naming the key)
    and its own state folder under `state_dir`, named by its role and id (``silo0``, ``features1``,
    ``sensitive0``), so that a later run on the same `state_dir` meets the same lifetime ledgers."""
    from pathlib import Path

    from silofl.protocols.parties import simulated_role
    from silofl.protocols.silo_policy import load_policy

    extra: dict[str, str] = {}
    if policy:
        load_policy(policy)
        extra["policy"] = str(Path(policy).expanduser().resolve())
    root = Path(state_dir).expanduser().resolve()
    configs = []
    for partition in range(config.num_nodes):
        role, party = simulated_role(partition, config.num_silos, config.sensitive_nodes)
        configs.append({**extra, "state-dir": str(root / f"{role}{party}")})
    return configs


def run_job(
    config: RunConfig,
    *,
    engine: str = "inprocess",
    progress: bool = True,
    node_configs: Sequence[Mapping[str, str | int | float | bool]] | None = None,
    ray_address: str = "",
) -> dict[str, Any]:
    """Run `config` on `engine` and return its result (also written to `config.out_dir` when set).

    `node_configs` gives each node (by partition id) node config entries, e.g. `data-path` for silos that hold
    their own data folder as in a deployment, or a silo's `policy` and `state-dir` (:func:`simulated_node_configs`).
    `ray_address` (or the environment's RAY_ADDRESS): the Ray engine joins that running cluster instead of starting
    a local one (:func:`ray_init_args`).
    """
    from silofl.client.app import app as client_app
    from silofl.server.app import make_server_app

    if ray_address and engine != "ray":
        raise ValueError(f"--ray-address {ray_address} is for the Ray engine: add --engine ray")
    results: list[dict[str, Any]] = []
    server_app = make_server_app(config, sink=results.append, engine=engine, progress=progress)
    if engine == "inprocess":
        from silofl.server.inprocess_grid import InProcessGrid

        grid = InProcessGrid(client_app, config.num_nodes, node_configs=node_configs)
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config.to_run_config())
        server_app(grid, context)
    elif engine == "ray":
        from flwr.simulation import run_simulation

        node_configs = with_party_secret(config, node_configs)  # the in-process grid makes its own
        if node_configs is not None:
            if len(node_configs) != config.num_nodes:
                raise ValueError(f"{len(node_configs)} node configs for {config.num_nodes} nodes")
            client_app = _with_node_configs(client_app, node_configs)
        with _environment_kept():  # Flower's Ray backend sets PYTHONPATH in this process's environment
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=config.num_nodes,
                backend_config={
                    "client_resources": client_resources(config, ray_address),
                    "init_args": ray_init_args(ray_address),
                },
            )
    else:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not results:
        raise RuntimeError(f"the {engine} engine finished without a result; see the log above for the ServerApp error")
    if config.out_dir:  # a tabular model's artifact beside result.json (server/model_artifact.py); else nothing
        from silofl.server.model_artifact import write_run_artifact

        write_run_artifact(config, results[0], node_configs)
    return results[0]


def client_resources(config: RunConfig, address: str = "") -> dict[str, float]:
    """Each simulated node's Ray resources for the run: one CPU, and a GPU share from the run's `device`
    (`protocols.devices.ray_client_resources`: cpu -> none; cuda, or auto on a machine with GPUs -> a share such that
    every node fits on this machine's GPUs at once). On a Ray cluster (`address`, or the environment's RAY_ADDRESS)
    this machine cannot count the cluster's GPUs before it joins: cuda then takes one GPU per node."""
    from silofl.protocols.devices import ray_client_resources, visible_gpus

    device = str(getattr(config, "device", "cpu"))
    on_cluster = bool(address or os.environ.get("RAY_ADDRESS", ""))
    gpus = None if on_cluster else (visible_gpus() if device != "cpu" else 0)
    return ray_client_resources(device, config.num_nodes, gpus)


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Restore PYTHONPATH after a Ray simulation. Flower's Ray backend writes the driver's whole `sys.path` into
    `os.environ["PYTHONPATH"]` (for its workers) and leaves it there: every later subprocess of this process then
    imported this environment's packages first (a system `docker-compose` crashed on the virtual environment's
    urllib3 after a Ray run in the same test session)."""
    before = os.environ.get("PYTHONPATH")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def ray_init_args(address: str = "") -> dict[str, Any]:
    """`ray.init`'s arguments for the Ray engine: join the cluster at `address` (or at the environment's RAY_ADDRESS,
    which `ray.init` reads itself), whose resources are the cluster's own; else start a local Ray on this machine's
    cores. Ray refuses `num_cpus` when it joins a cluster, and starts no dashboard for it."""
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        return {"address": address}
    return {"num_cpus": os.cpu_count() or 1, "include_dashboard": False}


def with_party_secret(
    config: RunConfig, node_configs: Sequence[Mapping[str, str | int | float | bool]] | None
) -> Sequence[Mapping[str, str | int | float | bool]] | None:
    """`node_configs` with the run's party secret added to every node's (a fresh random one per run), when the run
    has separate parties (they exchange sealed records): each simulated party derives its keys from it
    (`protocols.party_keys` `simulated_keys`). It goes to the ClientApps' node configs only, never to the ServerApp.
    For Ray simulation: the in-process engine's grid puts its own secret in its nodes' configs
    (`server.inprocess_grid`)."""
    if not config.sensitive_nodes:
        return node_configs
    import secrets

    from silofl.protocols.party_keys import PARTY_SECRET_KEY

    secret = secrets.token_bytes(32).hex()
    base = node_configs if node_configs is not None else [{} for _ in range(config.num_nodes)]
    return [{**dict(c), PARTY_SECRET_KEY: secret} for c in base]


def _with_node_configs(client_app: Any, node_configs: Sequence[Mapping[str, Any]]) -> Any:
    """`client_app` with each simulated node's own entries added to its node config, picked by the partition id
    that Flower's Ray simulation gives a node (its only node config besides num-partitions)."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp
    from flwr.common.constant import PARTITION_ID_KEY

    configs = [dict(c) for c in node_configs]

    class NodeConfigured(ClientApp):
        def __call__(self, message: Message, context: Context) -> Message:
            context.node_config.update(configs[int(context.node_config[PARTITION_ID_KEY])])
            return client_app(message, context)

    return NodeConfigured()
