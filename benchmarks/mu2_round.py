"""Milliseconds per DP-mu2-FL round on the in-process engine, against the same iteration as plain numpy.

    SILOFL_DATA_DIR=../shared/data python benchmarks/mu2_round.py [--rounds 3000] [--silos 1] [--trust untrusted]

The paper's M = 1 runs are 60,000 rounds, one record each: a round must stay in the low milliseconds. This measures,
on the same MNIST data, seed and rho:

* silofl: `silofl run mu2fl` through the real ServerApp, strategy and ClientApp on the in-process engine (the round
  loop's wall time divided by the rounds, `timing.seconds_per_round` of result.json; data loading, setup and the
  final evaluation excluded);
* reference: `protocols.mu2fl.run_mu2_reference`, the same iteration in a numpy loop with no messages, checks,
  ledger or Flower (the floor of the arithmetic itself).

The ratio is the cost of running DP-mu2-FL as a federated system (messages, checks, serialisation, ledger) per round.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from silofl.client.data.loaders import load_dataset
from silofl.protocols import mu2fl
from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--silos", type=int, default=1)
    parser.add_argument("--rho", type=float, default=4.0)
    parser.add_argument("--trust", default="untrusted", choices=["untrusted", "trusted"])
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each (the best is kept)")
    args = parser.parse_args()
    data_dir = os.environ.get("SILOFL_DATA_DIR", "")
    values = {
        "algorithm": "mu2fl",
        "dataset": "mnist",
        "data-dir": data_dir,
        "num-silos": args.silos,
        "rounds": args.rounds,
        "batch-size": 1,
        "rho": args.rho,
        "trust": args.trust,
        "delta": 1e-5,
        "eval-every": 10**7,
    }
    silofl_ms = []
    for _ in range(args.repeats):
        result = run_job(RunConfig.parse(values), progress=False)
        silofl_ms.append(1000 * result["timing"]["seconds_per_round"])

    data = load_dataset("mnist", data_dir=data_dir or None)
    order = np.random.default_rng(0).permutation(len(data.train))
    features = data.train.nonsensitive.features[order].astype(np.float64)
    labels = data.train.nonsensitive.labels[order]
    reference_ms = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        mu2fl.run_mu2_reference(
            features, labels, args.silos, args.rounds, args.rho, args.trust == "trusted", 0, num_classes=10
        )
        reference_ms.append(1000 * (time.perf_counter() - t0) / args.rounds)

    best, ref = min(silofl_ms), min(reference_ms)
    print(f"DP-mu2-FL, MNIST, M = {args.silos}, b = 1, {args.trust}, rho = {args.rho:g}, {args.rounds} rounds")
    print(f"  silofl in-process   {best:7.3f} ms/round   (repeats: {', '.join(f'{v:.3f}' for v in silofl_ms)})")
    print(f"  numpy reference     {ref:7.3f} ms/round   (repeats: {', '.join(f'{v:.3f}' for v in reference_ms)})")
    print(f"  ratio               {best / ref:7.1f}x")
    print(f"  a 60,000-round run: ~{best * 60000 / args.silos / 1000:.0f} s of rounds")


if __name__ == "__main__":
    main()
