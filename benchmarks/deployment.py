"""Seconds per round in deployment (Flower SuperLink + 3 SuperNodes on loopback, TLS + SuperNode authentication):
silofl next to Flower's floor in the same run, and the CPU an idle federation uses.

    python benchmarks/deployment.py [--rounds 5] [--repeats 5] [--idle 30] [--skip-per-message] [--skip-runs]

How it is measured (one federation at a time, each started with `server.deploy.local.up(tmp, 3, runtime=...)`: real
processes, TLS, registered OpenSSH ECDSA keys):

1. Flower's floor: Flower's stock SuperNodes (`--runtime flower`: `flower-supernode` as it comes, a fresh
   `flwr-clientapp` process per message, Flower's 3 s / 1 s polls) and a minimal Flower app written to a temp dir (a
   ClientApp that returns the model it receives, no torch; Flower's FedAvg with `fraction_evaluate=0`); seconds per
   round = median time between two consecutive `aggregate_train` calls in its ServerApp (from round 2 on).
2. silofl: silofl's SuperNodes (`--runtime long-lived`, the default: `client.supernode_runtime`'s short polls and one
   long-lived ClientApp process per SuperNode; the ServerApp's `server.polling`) with FedAvg (1 local epoch,
   synthetic data, 1500 records per silo), `--rounds` rounds, evaluation only after the last one; seconds per round
   = median of the ServerApp's own per-round wall times (result.json `rounds[*].seconds`) from round 2 on (as for
   the floor; round 1 also pays the ClientApp process's one-off imports of the algorithm's modules), without the
   last round (it evaluates too). The floor app is run on this federation too: its ServerApp keeps Flower's 3 s
   pulls of the replies (it is Flower's FedAvg on Flower's Grid), so it shows the SuperNode side alone.
3. Idle CPU: the CPU time (user + system, /proc/<pid>/stat) of every process of the silofl federation (SuperLink,
   its SuperExec, SuperNodes, ClientApp workers) over `--idle` seconds with no run, starting 10 s after the last run
   ended; in % of one core. The same for Flower's stock federation, for reference.
4. Unless `--skip-per-message`: silofl FedAvg on `--runtime per-message` (the short polls, but Flower's fresh
   ClientApp process per message), to show what the long-lived process saves; and the per-message cost of such a
   process, timed in `--repeats` fresh `python -c` processes: import `flwr.clientapp`, then `torch`, then
   `client.app`, load a silo folder, build the model (medians).

The last line is `ratio silofl/floor R`: silofl's seconds per round over Flower's floor's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from silofl.server.deploy import flower_setup, local, processes  # noqa: E402

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
import silofl.client.app
t3 = time.perf_counter()
from silofl.client.data.silo_store import load_silo
silo = load_silo(sys.argv[1])
t4 = time.perf_counter()
from silofl.protocols.models import build_model
model = build_model("logreg", silo.info.num_features, silo.info.num_labels, hidden=64)
t5 = time.perf_counter()
print(json.dumps({"flwr": t1 - t0, "torch": t2 - t1, "silofl_import": t3 - t2, "load_silo": t4 - t3,
                  "build_model": t5 - t4}))
"""


def _flwr_run(dep: local.Deployment, app: Path, run_config: str) -> float:
    env = local.flower_env(Path(dep.flwr_home))
    command = [str(flower_setup.bin_dir() / "flwr"), "run", ".", dep.connection, "--stream", "--run-config", run_config]
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
    # rounds 2.. without evaluation (a round that evaluated carries its metrics, e.g. `accuracy`), as for the floor:
    # round 1 also pays the ClientApp process's one-off imports of the algorithm's modules
    train_only = [r["seconds"] for r in result["rounds"][1:] if "accuracy" not in r]
    return {
        "per_round": statistics.median(train_only),
        "seconds": [round(x, 3) for x in train_only],
        "rounds": len(train_only),
        "total": result["timing"]["total_seconds"],
        "wall": wall,
    }


def floor_rounds(dep: local.Deployment, rounds: int, tmp: Path) -> dict[str, float]:
    app = tmp / "floorapp_project"
    if not app.is_dir():
        app.mkdir()
        (app / "pyproject.toml").write_text(FLOOR_PYPROJECT)
        (app / "floorapp.py").write_text(textwrap.dedent(FLOOR_APP))
    out = tmp / f"floor-{dep.runtime}.json"
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


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of `pid` in clock ticks, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def idle_cpu(dep: local.Deployment, seconds: float, settle: float = 10.0) -> dict[str, float]:
    """% of one core that every process of `dep` (the ones `up` started and all below them) uses over `seconds`
    with no run, after `settle` seconds; also the share of the busiest process."""
    time.sleep(settle)
    roots = local.Deployment.load(Path(dep.dir)).processes
    pids = [p.pid for p in roots] + processes.descendants(roots)
    before = {pid: _cpu_ticks(pid) for pid in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    used = {
        pid: after - before[pid] for pid in pids if before[pid] is not None and (after := _cpu_ticks(pid)) is not None
    }
    tick = os.sysconf("SC_CLK_TCK")
    return {
        "percent": 100.0 * sum(used.values()) / tick / elapsed,
        "busiest": 100.0 * max(used.values(), default=0) / tick / elapsed,
        "processes": len(used),
        "seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle federation to measure (default 30)")
    parser.add_argument("--skip-per-message", action="store_true", help="no per-message runtime, no overhead timing")
    parser.add_argument("--skip-runs", action="store_true", help="only the per-message overhead")
    args = parser.parse_args(argv)

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="silofl-deploy-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.skip_runs:
            from silofl.client.data.federate import load_federation
            from silofl.client.data.silo_store import save_silo

            _, silos = load_federation("synthetic", 3)
            save_silo(silos[0], tmp / "silo_0")
            overhead = per_message_overhead(tmp / "silo_0", args.repeats)
            _print_overhead(overhead, args.repeats)
            return 0
        plan = [("flower", ("floor",)), ("long-lived", ("silofl", "floor"))]
        if not args.skip_per_message:
            plan.append(("per-message", ("silofl",)))
        for runtime, runs in plan:
            t0 = time.perf_counter()
            with local.running(tmp / f"federation-{runtime}", 3, runtime=runtime) as dep:
                print(f"[{runtime}] federation up in {time.perf_counter() - t0:.1f} s", flush=True)
                for what in runs:
                    key = f"{what}/{runtime}"
                    if what == "floor":
                        results[key] = floor_rounds(dep, args.rounds, tmp)
                    else:
                        results[key] = silofl_rounds(dep, args.rounds, tmp / f"silofl-{runtime}")
                    print(f"[{runtime}] {what}: {results[key]}", flush=True)
                if runtime in ("flower", "long-lived") and args.idle > 0:
                    results[f"idle/{runtime}"] = idle_cpu(dep, args.idle)
                    print(f"[{runtime}] idle: {results[f'idle/{runtime}']}", flush=True)
                if runtime == "per-message":
                    results["overhead"] = per_message_overhead(Path(dep.data) / "silo_0", args.repeats)

    floor, silofl = results["floor/flower"], results["silofl/long-lived"]
    ratio = silofl["per_round"] / floor["per_round"]
    print()
    print("Deployment on loopback: flower-superlink + 3 SuperNodes, gRPC with TLS, SuperNode authentication")
    print(
        f"  Flower's floor: empty ClientApp, FedAvg, stock SuperNodes        {floor['per_round']:7.3f} s/round  "
        f"(median of {floor['rounds']} rounds)"
    )
    print(
        f"  silofl FedAvg, silofl's runtime (long-lived ClientApp)          {silofl['per_round']:7.3f} s/round  "
        f"(median of {silofl['rounds']} train-only rounds; run {silofl['total']:.1f} s with setup and evaluation)"
    )
    on_ours = results["floor/long-lived"]
    print(f"  Flower's floor app on silofl's SuperNodes (its 3 s reply pulls)   {on_ours['per_round']:7.3f} s/round")
    if "silofl/per-message" in results:
        per_message = results["silofl/per-message"]
        print(
            f"  silofl FedAvg, short polls, a ClientApp process per message     {per_message['per_round']:7.3f} s/round"
        )
    for runtime, label in (("long-lived", "silofl's"), ("flower", "Flower's stock")):
        if f"idle/{runtime}" in results:
            idle = results[f"idle/{runtime}"]
            print(
                f"  idle CPU, {label} federation ({idle['processes']} processes, {idle['seconds']:.0f} s)".ljust(68)
                + f"{idle['percent']:6.2f} % of a core  (busiest process {idle['busiest']:.2f} %)"
            )
    if "overhead" in results:
        _print_overhead(results["overhead"], args.repeats)
    print()
    print(f"silofl s/round {silofl['per_round']:.3f}")
    print(f"Flower floor s/round {floor['per_round']:.3f}")
    if "idle/long-lived" in results:
        print(f"idle CPU of the federation {results['idle/long-lived']['percent']:.2f} % of a core")
    print(f"ratio silofl/floor {ratio:.3f}")
    return 0


def _print_overhead(overhead: dict[str, float], repeats: int) -> None:
    print(f"Per-message cost of a fresh ClientApp process (per-message runtime; median of {repeats}):")
    print(f"  import flwr.clientapp (Flower)             {overhead['flwr']:6.3f} s")
    print(f"  import torch (any PyTorch ClientApp)       {overhead['torch']:6.3f} s")
    print(f"  import client.app (silofl)                 {overhead['silofl_import']:6.3f} s")
    print(f"  load the silo folder                       {overhead['load_silo']:6.3f} s")
    print(f"  build the model                            {overhead['build_model']:6.3f} s")
    print(f"  silofl's own overhead                      {overhead['silofl_total']:6.3f} s")


if __name__ == "__main__":
    sys.exit(main())
