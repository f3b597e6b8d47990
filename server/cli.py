"""`silofl`: the command line.

    silofl run ALGORITHM [--dataset NAME|FILE] [--silos N] ...   run a federated job on one machine
    silofl data split DATASET --silos N --out DIR                 prepare one data folder per silo
    silofl privacy calibrate --epsilon E --delta D ...            noise multiplier for a privacy target
    silofl sweep FILE.toml [--workers 2]                           a grid of runs, resumable (server/sweep.py)
    silofl plot fairness|privacy|mu2|fedsc RUN_DIR...             figures from run folders (server/plots.py)

Every `run` flag is a run-config key (`--batch-size` is `batch-size`), validated by :class:`protocols.config.RunConfig`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path

from protocols.config import ALGORITHMS, SSL_ALGORITHMS, ConfigError, RunConfig
from strategies.base import RoundError


def _add_run_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a federated job on this machine",
        description="Run ALGORITHM over N simulated silos and write DIR/result.json.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("algorithm", choices=ALGORITHMS)
    p.add_argument(
        "--dataset",
        default="synthetic",
        help="adult, credit, parkinsons, synthetic (embedded), mnist, fashion-mnist, digits (embedded), or a "
        ".csv/.parquet file",
    )
    p.add_argument("--data-dir", default="", help="folder with the datasets (default: $SILOFL_DATA_DIR)")
    p.add_argument("--target", default="", help="label column (CSV/Parquet dataset)")
    p.add_argument("--sensitive", default="", help="sensitive column(s), comma-separated (CSV/Parquet dataset)")
    p.add_argument("--features", default="", help="feature columns, comma-separated (default: all others)")
    p.add_argument("--silos", dest="num_silos", type=int, default=3)
    p.add_argument("--partition", default="iid", choices=["iid", "attribute", "classes", "dirichlet"])
    p.add_argument("--heterogeneity", type=float, default=0.0, help="h in [0, 1] for --partition attribute")
    p.add_argument("--classes-per-silo", type=int, default=2)
    p.add_argument("--dirichlet-alpha", type=float, default=0.5)
    p.add_argument(
        "--model",
        default="",
        choices=["logreg", "mlp", "cnn", "resnet20"],
        help="default: logreg; cnn for fedsc/fedavg-sc",
    )
    p.add_argument("--hidden", type=int, default=64, help="hidden units of --model mlp")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--rounds", type=int, default=0, help="communication rounds")
    length.add_argument("--epochs", type=float, default=0.0, help="passes over each silo's data (default 5)")
    p.add_argument("--batch-size", type=int, default=256, help="expected records per silo per step")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--lr-decay", type=float, default=1.0)
    p.add_argument("--lr-decay-epochs", type=float, default=0.0)
    p.add_argument("--local-epochs", type=int, default=1, help="fedavg: local passes per round")
    p.add_argument("--clip", type=float, default=1.0, help="per-sample gradient clip norm C (steffle: C_theta)")
    mu2 = p.add_argument_group("mu2fl (private federated convex optimization, anytime averaging)")
    mu2.add_argument(
        "--trust",
        default="untrusted",
        choices=["untrusted", "trusted"],
        help="noise at the silos (untrusted server) or one draw at the server (trusted)",
    )
    mu2.add_argument("--rho", type=float, default=0.0, help="the paper's rho (instead of --epsilon)")
    mu2.add_argument("--domain-diameter", type=float, default=0.1, help="diameter D of the ball K (radius D/2)")
    fair = p.add_argument_group("steffle (private and fair learning; --silos 1 is DP-FERMI)")
    fair.add_argument(
        "--fairness",
        default="dp",
        choices=["dp", "eo", "eopp"],
        help="demographic parity, equalized odds, equal opportunity",
    )
    fair.add_argument("--lambda", dest="lam", type=float, default=1.0, help="weight of the ERMI fairness term")
    fair.add_argument("--w-radius", type=float, default=2.0, help="radius D of the ball W is projected onto")
    fair.add_argument("--w-lr", type=float, default=0.1, help="ascent step size of W")
    fair.add_argument("--dual-lr", type=float, default=0.01, help="tran: dual ascent step s of the multipliers")
    fair.add_argument(
        "--counts-share", type=float, default=0.1, help="share of each silo's epsilon spent on its group counts"
    )
    ssl = p.add_argument_group("fedsc / fedavg-sc (federated spectral contrastive learning; images)")
    ssl.add_argument("--projection-dim", type=int, default=128, help="dimension H of the representation z")
    ssl.add_argument("--width", type=int, default=1, help="backbone width multiplier (resnet20 x8: 512 features)")
    ssl.add_argument("--momentum", type=float, default=0.9)
    ssl.add_argument("--weight-decay", type=float, default=5e-4)
    ssl.add_argument("--grad-clip", type=float, default=3.0, help="local gradient-norm clip (not a DP clip)")
    ssl.add_argument("--mu", type=float, default=4.0, help="representations clipped to norm sqrt(mu)")
    ssl.add_argument("--views", type=int, default=2, help="augmented views per record in DP-CalR")
    ssl.add_argument(
        "--alpha-start", type=float, default=1.0, help="alpha at the first share (eq. 80: 1; eq. 6: q_j = 1/num-silos)"
    )
    ssl.add_argument("--alpha-end", type=float, default=0.2, help="alpha decays linearly to this (eq. 80)")
    ssl.add_argument("--share-start", type=int, default=1, help="first round of correlation sharing")
    ssl.add_argument("--share-every", type=int, default=1, help="rounds between two shares")
    ssl.add_argument("--participation", type=float, default=1.0, help="fraction of silos per round (all in round 1)")
    ssl.add_argument("--calr-relation", default="replace_one", choices=["replace_one", "add_remove"])
    ssl.add_argument(
        "--calr-sampling-rate",
        type=float,
        default=1.0,
        help="Poisson rate of the records in each DP-CalR share (1: every record, the paper)",
    )
    ssl.add_argument(
        "--local-steps", type=int, default=0, help="minibatch steps per round instead of --local-epochs (0: epochs)"
    )
    ssl.add_argument(
        "--server-optimizer",
        default="avg",
        choices=["avg", "adam"],
        help="avg: mean of the silos' models (FedAvg, the paper); adam: FedAdam on the mean update",
    )
    ssl.add_argument("--server-lr", type=float, default=1e-3, help="learning rate of --server-optimizer adam")
    ssl.add_argument(
        "--eval-data",
        default="central",
        choices=["central", "none"],
        help="linear probe + kNN at the server on the dataset's labelled train/test split (central) or no evaluation",
    )
    ssl.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda", "auto"], help="torch device (auto: cuda if available)"
    )
    ssl.add_argument("--probe-epochs", type=int, default=30, help="linear-probe epochs (Adam 3e-3)")
    ssl.add_argument("--knn-k", type=int, default=200)
    ssl.add_argument("--knn-tau", type=float, default=0.1)
    ssl.add_argument("--max-train-records", type=int, default=0, help="cap on each silo's training records (0: all)")
    p.add_argument("--epsilon", default="inf", help="privacy target per silo (inf: no noise)")
    p.add_argument("--delta", type=float, default=0.0, help="privacy delta (0: 1/n^2)")
    p.add_argument("--accountant", default="best", choices=["rdp", "pld", "best"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0, help="rounds between evaluations (0: ~20 per run)")
    p.add_argument("--round-timeout", type=float, default=600.0)
    p.add_argument("--engine", default="inprocess", choices=["inprocess", "ray"])
    p.add_argument("--out", dest="out_dir", default="", help="output folder (default: runs/<time>-<algorithm>)")
    p.add_argument(
        "--resume",
        dest="resume_dir",
        default="",
        metavar="DIR",
        help="continue the stopped run in DIR from its checkpoint (give the same flags as the run)",
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=run_command)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig for a `silofl run` command line."""
    keys = [name for name in RunConfig.model_fields if name != "algorithm" and hasattr(args, name)]
    values = {name: getattr(args, name) for name in keys}
    if not values.get("model"):
        values["model"] = "cnn" if args.algorithm in SSL_ALGORITHMS else "logreg"
    if not values.get("rounds") and not values.get("epochs"):
        values["epochs"] = 5.0
    if not values.get("out_dir"):
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        values["out_dir"] = str(Path("runs") / f"{stamp}-{args.algorithm}-{Path(str(args.dataset)).stem}")
    return RunConfig.parse({"algorithm": args.algorithm, **values})


def run_command(args: argparse.Namespace) -> int:
    from server.engines import run_job

    config = config_from_args(args)
    if getattr(args, "resume_dir", ""):
        from server.checkpoint import resume_config

        config = resume_config(config, args.resume_dir, out_given=bool(args.out_dir))
    result = run_job(config, engine=args.engine, progress=not args.no_progress)
    final = result["final"]
    if config.algorithm in SSL_ALGORITHMS:  # representation learning: the linear probe and the kNN monitor
        metrics = {"linear probe acc.": final.get("accuracy"), "kNN acc.": final.get("knn_accuracy")}
    else:
        keys = {"accuracy": "accuracy", "loss": "loss", "DP viol.": "dp_violation", "EO viol.": "eo_violation"}
        if result["federation"].get("num_groups", 2) < 2:  # one group (e.g. MNIST): no fairness to measure
            keys = {"accuracy": "accuracy", "loss": "loss"}
        metrics = {label: final.get(key) for label, key in keys.items()}
    _print_summary(config, result, args.engine, metrics)
    return 0


def _print_summary(config: RunConfig, result: dict, engine: str, metrics: dict[str, float | None]) -> None:
    """One-row table: the run's final metrics, epsilon spent, delta, seconds per round; then where result.json is."""
    from rich.console import Console
    from rich.table import Table

    privacy, timing = result["privacy"], result["timing"]
    table = Table(
        title=f"{config.algorithm} on {config.dataset}: {config.num_silos} silos, "
        f"{result['federation']['rounds']} rounds, {engine} engine"
    )
    for col in (*metrics, "eps spent", "delta", "s/round"):
        table.add_column(col, justify="right")
    eps = privacy["epsilon_spent"]
    table.add_row(
        *("-" if value is None else f"{value:.4f}" for value in metrics.values()),
        eps if isinstance(eps, str) else f"{eps:.4f}",
        f"{privacy['delta']:.1e}",
        f"{timing['seconds_per_round']:.4f}",
    )
    console = Console()
    console.print(table)
    console.print(f"result: {Path(config.out_dir) / 'result.json'}")


def build_parser() -> argparse.ArgumentParser:
    from client.data.split_cli import add_data_parser
    from client.silo_cli import add_silo_parser
    from protocols.privacy.calibrate_cli import add_privacy_parser
    from server.deploy.cli import add_deploy_parser
    from server.plots import add_plot_parser
    from server.sweep import add_sweep_parser

    parser = argparse.ArgumentParser(
        prog="silofl", description="Cross-silo federated learning with differential privacy and fairness, on Flower."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(subparsers)
    add_data_parser(subparsers)
    add_privacy_parser(subparsers)
    add_deploy_parser(subparsers)
    add_silo_parser(subparsers)
    add_sweep_parser(subparsers)
    add_plot_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"silofl: {exc}", file=sys.stderr)
        return 2
    except RoundError as exc:
        print(f"silofl: the run stopped: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"silofl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
