"""Seconds per round of SteFFLe in deployment (Flower SuperLink + SuperNodes on loopback, TLS + SuperNode
authentication, silofl's SuperNode runtime): separate parties with sealed records against silos, same run otherwise.

    python benchmarks/deployment_parties.py [--dataset adult] [--rounds 12] [--repeats 2]

Each federation is started with `server.deploy.local.up` on folders `silofl data split DATASET --silos 3
[--topology central-sensitive]` wrote (real processes: 3 silos, or 3 banks and a census); the same SteFFLe run (eps 1,
lambda 1, batch 256, logistic regression, evaluation after the last round only) is submitted with `flwr run`.
Seconds per round: the median of the ServerApp's per-round wall times (result.json `rounds[*].seconds`) from round 2
on, without the last round (it evaluates); setup: result.json's seconds before round 1 (for the parties, the sealed
record exchange: a census receives every record's features). The federations alternate, `--repeats` times; the
figure kept is each one's lowest median. The last line is `ratio parties/silos R`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from silofl.server.deploy import flower_setup, local  # noqa: E402


def _split(dataset: str, topology: str, out: Path) -> Path:
    command = [str(flower_setup.bin_dir() / "silofl"), "data", "split", dataset, "--silos", "3", "--out", str(out)]
    if topology != "silos":
        command += ["--topology", topology]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    return out


def _run(dep: local.Deployment, run_config: str) -> dict:
    env = local.flower_env(Path(dep.flwr_home))
    command = [str(flower_setup.bin_dir() / "flwr"), "run", ".", dep.connection, "--stream", "--run-config", run_config]
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"flwr run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def measure(data: Path, topology: str, rounds: int, tmp: Path, tag: str) -> dict[str, float]:
    """One federation up, one run, down: its median seconds per training round and its setup seconds."""
    out = tmp / f"out-{tag}"
    with local.running(tmp / f"fed-{tag}", 3, data=data, topology=topology) as dep:
        federation = dep.layout.run_config()  # names steffle for parties only
        if "algorithm=" not in federation:
            federation = f'algorithm="steffle" {federation}'
        config = (
            f"{federation} epsilon=1.0 lambda=1.0 batch-size=256 rounds={rounds} epochs=0 "
            f'eval-every={rounds} round-timeout=600 out-dir="{out}"'
        )
        _run(dep, config)
    result = json.loads((out / "result.json").read_text())
    seconds = [r["seconds"] for r in result["rounds"][1:-1]]
    rounds_total = sum(r["seconds"] for r in result["rounds"])
    return {
        "per_round": statistics.median(seconds),
        "setup": result["timing"]["total_seconds"] - rounds_total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("SILOFL_DATA_DIR", str(PROJECT_ROOT.parent / "shared" / "data"))
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="silofl-parties-") as name:
        tmp = Path(name)
        folders = {
            "silos": _split(args.dataset, "silos", tmp / "silos-data"),
            "central-sensitive": _split(args.dataset, "central-sensitive", tmp / "parties-data"),
        }
        for repeat in range(args.repeats):
            for topology, data in folders.items():
                got = measure(data, topology, args.rounds, tmp, f"{topology}-{repeat}")
                if topology not in best or got["per_round"] < best[topology]["per_round"]:
                    best[topology] = got
    print(
        f"SteFFLe on {args.dataset} in deployment (loopback, TLS, silofl runtime): 3 silos or 3 banks + a census, "
        f"eps 1, lambda 1, batch 256, {args.rounds} rounds, best median of {args.repeats}"
    )
    print(f"{'federation':<20}{'s/round':>10}{'setup s':>10}")
    for topology, got in best.items():
        print(f"{topology:<20}{got['per_round']:>10.3f}{got['setup']:>10.1f}")
    print(f"ratio parties/silos {best['central-sensitive']['per_round'] / best['silos']['per_round']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
