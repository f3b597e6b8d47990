"""Seconds per round: the in-process engine against Ray simulation on the same run, and their ratio.

    python benchmarks/engines.py [--dataset adult] [--silos 3] [--rounds 30] [--algorithm dp-fedsgd]
        [--topology silos|divided|central-sensitive] (a topology: SteFFLe with separate parties, eps 1, lambda 1)

Both engines run the same ServerApp, strategy and ClientApp; the figure is the round loop's wall time divided by the
number of rounds (`timing.seconds_per_round` of result.json: setup, Ray start-up and data loading excluded).
Evaluation runs only after the last round, as in a long run where it is a small share of the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--silos", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--algorithm", default="dp-fedsgd", choices=["dp-fedsgd", "fedavg", "steffle"])
    parser.add_argument("--topology", default="silos", choices=["silos", "divided", "central-sensitive"])
    parser.add_argument("--repeats", type=int, default=3, help="in-process repeats (the best is kept)")
    args = parser.parse_args()
    values = {
        "algorithm": args.algorithm,
        "dataset": args.dataset,
        "num-silos": args.silos,
        "rounds": args.rounds,
        "eval-every": args.rounds,
        "data-dir": os.environ.get("SILOFL_DATA_DIR", ""),
    }
    if args.algorithm != "fedavg":
        values["epsilon"] = 1.0
    if args.topology != "silos":
        values.update({"algorithm": "steffle", "topology": args.topology})
    if values["algorithm"] == "steffle":
        values["lambda"] = 1.0
    config = RunConfig.parse(values)
    inproc = min((_inprocess(config) for _ in range(args.repeats)), key=lambda t: t[0])
    ray = _per_round(run_job(config, engine="ray", progress=False))
    print(
        f"run: {values['algorithm']} on {args.dataset}, {args.silos} silos, topology {args.topology}, "
        f"{args.rounds} rounds, batch 256"
    )
    print(f"{'engine':<16}{'median ms/round':>18}{'mean ms/round':>16}")
    for name, (median, mean) in (("in-process", inproc), ("Ray simulation", ray)):
        print(f"{name:<16}{median * 1000:>18.2f}{mean * 1000:>16.2f}")
    print(f"ratio Ray / in-process: median {ray[0] / inproc[0]:.1f}x, mean {ray[1] / inproc[1]:.1f}x")
    print(
        "(median: a typical round; mean includes round 1, where each silo calibrates its noise once, and the "
        "final evaluation)"
    )


def _inprocess(config: RunConfig) -> tuple[float, float]:
    """(median, mean) seconds per round of one in-process run, its noise calibration and privacy accounting paid as
    in a fresh process (the caches outlive a run: a repeat would find its calibration and PLD figures computed)."""
    from silofl.client.privacy_state import clear_caches

    clear_caches()
    return _per_round(run_job(config, engine="inprocess", progress=False))


def _per_round(result: dict) -> tuple[float, float]:
    seconds = [r["seconds"] for r in result["rounds"]]
    return statistics.median(seconds), result["timing"]["seconds_per_round"]


if __name__ == "__main__":
    main()
