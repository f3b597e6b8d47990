"""Seconds per round in deployment (Flower SuperLink + 3 SuperNodes on loopback, TLS + SuperNode authentication),
silofl next to Flower's floor, and silofl's own per-message overhead in a deployed ClientApp.

    python benchmarks/deployment.py [--rounds 5] [--repeats 5] [--skip-runs]

How it is measured:

1. One federation, `server.deploy.local.up(tmp, 3)` (real processes, TLS, registered OpenSSH ECDSA keys).
2. silofl: `flwr run . silofl-local` with FedAvg (1 local epoch, synthetic data, 1500 records per silo), `--rounds`
   rounds, evaluation only after the last one; seconds per round = median of the ServerApp's own per-round wall
   times (result.json `rounds[*].seconds`) over the rounds without evaluation.
3. Flower's floor: a minimal Flower app written to a temp dir (a ClientApp that returns the model it receives, no
   torch; Flower's FedAvg with `fraction_evaluate=0`), submitted to the same federation; seconds per round = median
   time between two consecutive `aggregate_train` calls in its ServerApp.
4. Per-message overhead: a deployed ClientApp is a fresh process per message (platform.md). In `--repeats` fresh
   `python -c` processes: import `flwr.clientapp` (Flower's share), then `torch` (paid by any PyTorch ClientApp),
   then `client.app` (silofl's imports), load a silo folder, build the model; medians of each step. silofl's own
   overhead = client.app import + load + build; target <= 0.5 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from server.deploy import local  # noqa: E402

FLOOR_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "floorapp"
version = "1.0.0"
dependencies = ["flwr>=1.39,<1.40"]

[tool.flwr.app]
publisher = "bench"

[tool.flwr.app.components]
serverapp = "floorapp:server"
clientapp = "floorapp:client"

[tool.flwr.app.config]
num-rounds = 5
num-silos = 3
out = ""
"""

FLOOR_APP = '''\
"""Flower's floor: FedAvg over ClientApps that return what they receive (no torch, no data)."""
import json
import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)


class TimedFedAvg(FedAvg):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.stamps = []

    def aggregate_train(self, server_round, replies):
        self.stamps.append(time.perf_counter())
        return super().aggregate_train(server_round, replies)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    n = int(context.run_config["num-silos"])
    strategy = TimedFedAvg(fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    t0 = time.perf_counter()
    initial = ArrayRecord([np.zeros(10, dtype=np.float32)])
    strategy.start(grid, initial, num_rounds=int(context.run_config["num-rounds"]))
    with open(str(context.run_config["out"]), "w") as fh:
        json.dump({"start": t0, "stamps": strategy.stamps}, fh)
'''

OVERHEAD_SNIPPET = """\
import time, json, sys
t0 = time.perf_counter()
import flwr.clientapp
t1 = time.perf_counter()
import torch
t2 = time.perf_counter()
import client.app
t3 = time.perf_counter()
from client.data.silo_store import load_silo
silo = load_silo(sys.argv[1])
t4 = time.perf_counter()
from protocols.models import build_model
model = build_model("logreg", silo.info.num_features, silo.info.num_labels, hidden=64)
t5 = time.perf_counter()
print(json.dumps({"flwr": t1 - t0, "torch": t2 - t1, "silofl_import": t3 - t2, "load_silo": t4 - t3,
                  "build_model": t5 - t4}))
"""


def _flwr_run(dep: local.Deployment, app: Path, run_config: str) -> float:
    env = local.flower_env(Path(dep.flwr_home))
    command = [str(local._bin_dir() / "flwr"), "run", ".", dep.connection, "--stream", "--run-config", run_config]
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=app, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"flwr run failed in {app}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def silofl_rounds(dep: local.Deployment, rounds: int, out: Path) -> dict[str, float]:
    wall = _flwr_run(
        dep,
        PROJECT_ROOT,
        f'algorithm="fedavg" epsilon="inf" rounds={rounds} epochs=0 eval-every={rounds + 1} num-silos=3 '
        f'out-dir="{out}"',
    )
    result = json.loads((out / "result.json").read_text())
    train_only = [r["seconds"] for r in result["rounds"] if not r.get("evaluation")]
    return {
        "per_round": statistics.median(train_only),
        "rounds": len(train_only),
        "total": result["timing"]["total_seconds"],
        "wall": wall,
    }


def floor_rounds(dep: local.Deployment, rounds: int, tmp: Path) -> dict[str, float]:
    app = tmp / "floorapp_project"
    app.mkdir()
    (app / "pyproject.toml").write_text(FLOOR_PYPROJECT)
    (app / "floorapp.py").write_text(textwrap.dedent(FLOOR_APP))
    out = tmp / "floor.json"
    wall = _flwr_run(dep, app, f'num-rounds={rounds} num-silos=3 out="{out}"')
    data = json.loads(out.read_text())
    gaps = [b - a for a, b in itertools.pairwise(data["stamps"])]  # from round 2 on: round 1 also waits for nodes
    return {"per_round": statistics.median(gaps), "rounds": len(gaps), "wall": wall}


def per_message_overhead(silo_dir: Path, repeats: int) -> dict[str, float]:
    samples: list[dict[str, float]] = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", OVERHEAD_SNIPPET, str(silo_dir)],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(json.loads(done.stdout))
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    med["silofl_total"] = med["silofl_import"] + med["load_silo"] + med["build_model"]
    return med


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-runs", action="store_true", help="only the per-message overhead")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="silofl-deploy-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.skip_runs:
            from client.data.federate import load_federation
            from client.data.silo_store import save_silo

            _, silos = load_federation("synthetic", 3)
            save_silo(silos[0], tmp / "silo_0")
            overhead = per_message_overhead(tmp / "silo_0", args.repeats)
            silofl = floor = None
        else:
            t0 = time.perf_counter()
            with local.running(tmp / "federation", 3) as dep:
                startup = time.perf_counter() - t0
                print(f"federation up in {startup:.1f} s (SuperLink + 3 SuperNodes, TLS + authentication)", flush=True)
                floor = floor_rounds(dep, args.rounds, tmp)
                print(f"floor done: {floor}", flush=True)
                silofl = silofl_rounds(dep, args.rounds, tmp / "silofl_out")
                print(f"silofl done: {silofl}", flush=True)
                overhead = per_message_overhead(Path(dep.data) / "silo_0", args.repeats)

    print()
    print("Deployment on loopback: flower-superlink + 3 flower-supernode, gRPC with TLS, SuperNode authentication")
    if floor is not None and silofl is not None:
        print(
            f"  Flower floor (empty ClientApp, FedAvg)     {floor['per_round']:6.2f} s/round  (median of "
            f"{floor['rounds']} rounds; `flwr run` wall {floor['wall']:.0f} s)"
        )
        print(
            f"  silofl FedAvg (synthetic, logreg)          {silofl['per_round']:6.2f} s/round  (median of "
            f"{silofl['rounds']} train-only rounds; run {silofl['total']:.0f} s with setup and evaluation)"
        )
        print(f"  difference                                 {silofl['per_round'] - floor['per_round']:+6.2f} s/round")
    print(f"Per-message cost in a fresh process (median of {args.repeats}):")
    print(f"  import flwr.clientapp (Flower)             {overhead['flwr']:6.3f} s")
    print(f"  import torch (any PyTorch ClientApp)       {overhead['torch']:6.3f} s")
    print(f"  import client.app (silofl)                 {overhead['silofl_import']:6.3f} s")
    print(f"  load the silo folder                       {overhead['load_silo']:6.3f} s")
    print(f"  build the model                            {overhead['build_model']:6.3f} s")
    verdict = "meets" if overhead["silofl_total"] <= 0.5 else "MISSES"
    print(
        f"  silofl's own overhead                      {overhead['silofl_total']:6.3f} s  ({verdict} the 0.5 s target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
