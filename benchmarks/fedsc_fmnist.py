"""FedSC against FedAvg+SC under label skew, on a CPU: Fashion-MNIST, 10 silos with one class each.

    SILOFL_DATA_DIR=../shared/data python benchmarks/fedsc_fmnist.py [--out docs/results/fedsc_fmnist.md] [--seeds 0]
        [--rounds 20] [--records 500] [--workers 3]

Three runs with the same seed, data, model and number of rounds (`silofl run` through the real ServerApp and
ClientApp, in-process engine): FedAvg+SC (alpha = 1, nothing shared), FedSC without noise, and FedSC with DP-CalR at
epsilon = 6, delta = 1e-2 (the paper's DP setting). The headline number is the linear-probe test accuracy on the
frozen backbone (`final.accuracy`: logistic regression on the features of all 60,000 training images, tested on the
10,000 test images), with the kNN accuracy next to it; also the probe accuracy of the untrained (initial) backbone,
which says how much of the accuracy the federated training added.

The paper's scale (CIFAR-10, ResNet-20 x8, 200 rounds, batch 512) is GPU work; this is the reduced configuration the
spec asks for (a small CNN, `--records` training images per silo, `--rounds` rounds of `--local-epochs` local
epochs), sized to finish in well under 30 minutes on 2 cores. The runs go to runs/fedsc_fmnist/ (a rerun reuses
finished runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHODS = {
    "fedavg-sc": ("fedavg-sc", {}),
    "fedsc": ("fedsc", {}),
    "fedsc-dp": ("fedsc", {"epsilon": 6.0, "delta": 1e-2}),
}


def base_values(args: argparse.Namespace, seed: int) -> dict:
    return {
        "dataset": "fashion-mnist",
        "data-dir": os.environ.get("SILOFL_DATA_DIR", ""),
        "model": "cnn",
        "num-silos": 10,
        "partition": "classes",
        "classes-per-silo": 1,
        "max-train-records": args.records,
        "rounds": args.rounds,
        "local-epochs": args.local_epochs,
        "local-steps": args.local_steps,
        "batch-size": args.batch_size,
        "lr": args.lr,
        "projection-dim": args.projection_dim,
        "alpha-start": args.alpha_start,
        "alpha-end": args.alpha_end,
        "server-optimizer": args.server_optimizer,
        "server-lr": args.server_lr,
        "calr-sampling-rate": args.calr_sampling_rate,
        "eval-every": args.eval_every,
        "probe-epochs": args.probe_epochs,
        "seed": seed,
    }


def run_one(method: str, values: dict, out: str) -> dict:
    """One run, cached as its result.json."""
    path = Path(out) / "result.json"
    if not path.exists():
        from silofl.protocols.config import RunConfig
        from silofl.server.engines import run_job

        algorithm, extra = METHODS[method]
        # the shared values serve both algorithms: FedAvg+SC ignores FedSC's sharing keys (alpha, DP-CalR)
        config = RunConfig.parse({"algorithm": algorithm, **values, **extra, "out-dir": out}, other_algorithms="ignore")
        run_job(config, progress=False)
    return json.loads(path.read_text())


def initial_probe(values: dict) -> float:
    """Linear-probe accuracy of the untrained backbone (the seed's initialisation), same evaluation."""
    from silofl.protocols.config import RunConfig
    from silofl.protocols.models import get_parameters
    from silofl.protocols.ssl_models import build_ssl_model
    from silofl.server.ssl_evaluation import CentralEvaluator

    config = RunConfig.parse({"algorithm": "fedavg-sc", **values}, other_algorithms="ignore")
    evaluator = CentralEvaluator(config)
    model = build_ssl_model(
        config.model, evaluator.shape, projection_dim=config.projection_dim, width=config.width, seed=config.seed
    )
    return evaluator.final(get_parameters(model))["accuracy"]


#: RunConfig key -> this script's flag, for the flags that shape a run (benchmarks/results.py rebuilds the command).
RUN_FLAGS = {
    "rounds": "--rounds",
    "max-train-records": "--records",
    "local-epochs": "--local-epochs",
    "local-steps": "--local-steps",
    "batch-size": "--batch-size",
    "lr": "--lr",
    "projection-dim": "--projection-dim",
    "alpha-start": "--alpha-start",
    "alpha-end": "--alpha-end",
    "server-optimizer": "--server-optimizer",
    "server-lr": "--server-lr",
    "calr-sampling-rate": "--calr-sampling-rate",
    "eval-every": "--eval-every",
    "probe-epochs": "--probe-epochs",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/fedsc_fmnist.md")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--records", type=int, default=500, help="training images per silo")
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=0, help="steps per round instead of epochs (0: epochs)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--projection-dim", type=int, default=128)
    parser.add_argument("--alpha-start", type=float, default=1.0, help="alpha at the first share (eq. 6: 0.1)")
    parser.add_argument("--alpha-end", type=float, default=0.2)
    parser.add_argument("--server-optimizer", default="avg", choices=["avg", "adam"])
    parser.add_argument("--server-lr", type=float, default=1e-3)
    parser.add_argument("--calr-sampling-rate", type=float, default=1.0, help="Poisson rate of DP-CalR's records")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--probe-epochs", type=int, default=30)
    parser.add_argument("--workers", type=int, default=3)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    tag = (
        f"r{args.rounds}-e{args.local_epochs}-n{args.records}-b{args.batch_size}-lr{args.lr:g}"
        f"-h{args.projection_dim}-a{args.alpha_end:g}"
        + ("" if args.alpha_start == 1.0 else f"-as{args.alpha_start:g}")
        + ("" if not args.local_steps else f"-k{args.local_steps}")
        + ("" if args.server_optimizer == "avg" else f"-{args.server_optimizer}{args.server_lr:g}")
        + ("" if args.calr_sampling_rate == 1.0 else f"-q{args.calr_sampling_rate:g}")
    )
    t0 = time.perf_counter()
    jobs = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for seed in seeds:
            values = base_values(args, seed)
            for method in METHODS:
                out = str(Path("runs") / "fedsc_fmnist" / f"{method}-{tag}-s{seed}")
                jobs[(method, seed)] = pool.submit(run_one, method, values, out)
            jobs[("initial", seed)] = pool.submit(initial_probe, values)
        results = {key: future.result() for key, future in jobs.items()}
    minutes = (time.perf_counter() - t0) / 60

    def acc(method: str, seed: int, key: str = "accuracy") -> float:
        return 100 * results[(method, seed)]["final"][key]

    lines = [
        "# FedSC vs FedAvg+SC on Fashion-MNIST, 10 silos with one class each (CPU scale)",
        "",
        "Command: `SILOFL_DATA_DIR=../shared/data python "
        + " ".join(["benchmarks/fedsc_fmnist.py", *sys.argv[1:]])
        + f"` ({minutes:.0f} minutes on this machine, 2 cores, the runs in parallel; cached runs count 0).",
        "",
        f"Configuration: small CNN (GroupNorm, 128 features) + projector to H = {args.projection_dim}; "
        f"{args.records} training images per silo (10 silos, one class each); {args.rounds} rounds, all silos, "
        + (f"{args.local_steps} local steps" if args.local_steps else f"{args.local_epochs} local epochs")
        + f" of batch {args.batch_size}, "
        + (
            f"SGD lr {args.lr} (cosine)"
            if args.server_optimizer == "avg"
            else f"SGD lr {args.lr} at the silos, Adam lr {args.server_lr:g} (cosine) at the server (FedAdam)"
        )
        + ", momentum 0.9, weight decay 5e-4, gradient clip 3, mu = 4; FedSC shares every round, alpha from "
        f"{args.alpha_start:g} to {args.alpha_end:g} (eq. 80), DP-CalR with 2 views"
        + (
            f" of a Poisson sample of the records (rate {args.calr_sampling_rate:g}). "
            if args.calr_sampling_rate < 1
            else " of every record. "
        )
        + "Evaluation: linear probe (Adam 3e-3, "
        f"{args.probe_epochs} epochs) on the frozen backbone's features of all 60,000 training images, accuracy on "
        "the 10,000 test images; kNN (k = 200, tau = 0.1) on the same features.",
        "",
        "| seed | untrained backbone | FedAvg+SC | FedSC | FedSC, DP (eps 6, delta 1e-2) | gain | DP gain / gain |",
        "|---|---|---|---|---|---|---|",
    ]
    gains, dp_gains = [], []
    for seed in seeds:
        base, fedsc, dp = acc("fedavg-sc", seed), acc("fedsc", seed), acc("fedsc-dp", seed)
        gains.append(fedsc - base)
        dp_gains.append(dp - base)
        ratio = f"{(dp - base) / (fedsc - base):.2f}" if fedsc > base else "n/a (no gain)"
        knn = " / ".join(f"{acc(m, seed, 'knn_accuracy'):.1f}" for m in ("fedavg-sc", "fedsc", "fedsc-dp"))
        eps = results[("fedsc-dp", seed)]["privacy"]["epsilon_spent"]
        lines.append(
            f"| {seed} | {100 * results[('initial', seed)]:.1f}% | {base:.1f}% | {fedsc:.1f}% | {dp:.1f}% "
            f"(eps spent {eps:.2f}) | {fedsc - base:+.1f} | {ratio} |"
        )
        lines.append(f"| {seed}, kNN | | {knn} (FedAvg+SC / FedSC / DP) | | | | |")
    mean_gain = sum(gains) / len(gains)
    mean_dp = sum(dp_gains) / len(dp_gains)
    methods = ("fedavg-sc", "fedsc", "fedsc-dp")
    seconds = {m: results[(m, seeds[0])]["timing"]["seconds_per_round"] for m in methods}
    run_minutes = {m: max(results[(m, s)]["timing"]["total_seconds"] for s in seeds) / 60 for m in methods}
    lines += [
        "",
        f"Mean gain of FedSC over FedAvg+SC: {mean_gain:+.1f} points (target >= 2): "
        f"**{'met' if mean_gain >= 2 else 'not met'}**. With DP: {mean_dp:+.1f} points, "
        + (f"{mean_dp / mean_gain:.0%} of the gain" if mean_gain > 0 else "no gain to keep")
        + " (target >= 50%): "
        f"**{'met' if mean_gain > 0 and mean_dp >= mean_gain / 2 else 'not met'}**.",
        "",
        "Seconds per round (seed "
        + str(seeds[0])
        + ", in-process, evaluation included): "
        + ", ".join(f"{m} {s:.1f}" for m, s in seconds.items())
        + ". Longest single run (minutes, its whole time in its worker, evaluations included): "
        + ", ".join(f"{m} {t:.1f}" for m, t in run_minutes.items())
        + ".",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
