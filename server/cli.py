"""`silofl`: the command line.

    silofl run ALGORITHM [--dataset NAME|FILE] [--silos N] ...   run a federated job on one machine
    silofl data split DATASET --silos N --out DIR                 prepare one data folder per silo
    silofl privacy calibrate --epsilon E --delta D ...            noise multiplier for a privacy target
    silofl sweep FILE.toml [--workers 2]                           a grid of runs, resumable (server/sweep/)
    silofl plot fairness|privacy|mu2|fedsc|run RUN_DIR...         figures from run folders (server/plots/)

`silofl run ALG` has one sub-command per registered algorithm (:mod:`protocols.algorithms`); its flags are the
algorithm's run-config keys (`--batch-size` is `batch-size`), generated from its option model, so `silofl run ALG
--help` lists the common options and that algorithm's own with its defaults, nothing else.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from silofl.protocols.config import ConfigError, RunConfig
from silofl.strategies.federation import RoundError

#: Flags whose name is not the run-config key (the key is accepted as a flag too).
_FLAG_NAMES = {"num_silos": "--silos", "out_dir": "--out"}
#: Fields that are not flags of `silofl run` (`--resume DIR` names the run folder instead).
_NOT_FLAGS = frozenset({"algorithm", "resume"})


def _add_run_parser(subparsers: argparse._SubParsersAction) -> None:
    """`silofl run ALGORITHM [options]`: one sub-command per registered algorithm, with that algorithm's options."""
    from silofl.protocols import algorithms

    run = subparsers.add_parser(
        "run",
        help="run a federated job on this machine",
        description="Run ALGORITHM over N simulated silos and write DIR/result.json. `silofl run ALGORITHM --help` "
        "lists that algorithm's options with its defaults.",
    )
    choices = run.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    for spec in algorithms.specs():
        p = choices.add_parser(
            spec.name,
            aliases=list(spec.aliases),
            help=spec.summary,
            description=f"{spec.name}: {spec.summary}.",
            argument_default=argparse.SUPPRESS,  # only what the user gives; the algorithm's model has the defaults
        )
        _add_option_flags(p, spec)
        engine = p.add_argument_group("engine and output")
        engine.add_argument("--engine", default="inprocess", choices=["inprocess", "ray"], help="(default: inprocess)")
        engine.add_argument(
            "--ray-address",
            default="",
            metavar="ADDRESS",
            help="with --engine ray: join this running Ray cluster (e.g. ray://head:10001 or head:6379; default: the "
            "environment's RAY_ADDRESS, else a local Ray on this machine). Every Ray node needs silofl installed, at "
            "this version, and the data at the same path (README, Engines)",
        )
        engine.add_argument(
            "--resume",
            dest="resume_dir",
            default="",
            metavar="DIR",
            help="continue the stopped run in DIR from its checkpoint (give the same flags as the run)",
        )
        engine.add_argument("--no-progress", action="store_true", default=False, help="no live progress bar")
        silos = p.add_argument_group("the simulated silos' operators")
        silos.add_argument(
            "--silo-policy",
            default="",
            metavar="FILE",
            help="every simulated silo answers under this TOML policy (lifetime and per-job budgets, algorithms, "
            "evaluation; see `silofl silo start --policy`); needs --silo-state",
        )
        silos.add_argument(
            "--silo-state",
            default="",
            metavar="DIR",
            help="keep each simulated silo's state (its lifetime ledger, its jobs) in its own folder under DIR "
            "(DIR/silo0, ...): a later run on the same DIR meets the same ledgers",
        )
        p.set_defaults(func=run_command, algorithm=spec.name)


def _add_option_flags(parser: argparse.ArgumentParser, spec) -> None:
    """One flag per option of the algorithm, grouped as the option groups are, with the algorithm's defaults."""
    from typing import Literal, get_args, get_origin

    from silofl.protocols.options import DataOptions, RunControlOptions, RunLengthOptions

    model = spec.config_model
    done: set[str] = set()
    for group in (DataOptions, RunLengthOptions, *spec.options, RunControlOptions):
        names = [n for n in group.model_fields if n in model.model_fields and n not in done and n not in _NOT_FLAGS]
        if not names:
            continue
        section = parser.add_argument_group(getattr(group, "heading", group.__name__))
        exclusive = section.add_mutually_exclusive_group() if {"rounds", "epochs"} <= set(names) else None
        for name in names:
            done.add(name)
            info = model.model_fields[name]
            key = info.alias or name.replace("_", "-")
            flags = [_FLAG_NAMES.get(name, f"--{key}")]
            if flags[0] != f"--{key}":
                flags.append(f"--{key}")
            kwargs: dict = {"dest": name}
            annotation = info.annotation
            if get_origin(annotation) is Literal:
                kwargs["choices"] = list(get_args(annotation))
            elif annotation in (int, float):
                kwargs["type"] = annotation
            default = info.default
            shown = "inf" if isinstance(default, float) and math.isinf(default) else repr(default)
            text = (info.description or "").replace("%", "%%")
            if name == "out_dir":
                text, shown = "the run's folder (result.json, checkpoint)", "runs/<time>-<algorithm>-<dataset>"
            kwargs["help"] = f"{text} (default: {shown})" if text else f"(default: {shown})"
            target = exclusive if exclusive is not None and name in ("rounds", "epochs") else section
            target.add_argument(*flags, **kwargs)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig for a `silofl run` command line: the flags given, the algorithm's defaults for the rest."""
    from silofl.protocols import algorithms

    model = algorithms.get(args.algorithm).config_model
    values = {name: getattr(args, name) for name in model.model_fields if hasattr(args, name) and name != "algorithm"}
    if not values.get("out_dir"):
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        dataset = values.get("dataset") or model.model_fields["dataset"].default
        values["out_dir"] = str(Path("runs") / f"{stamp}-{args.algorithm}-{Path(str(dataset)).stem}")
    return RunConfig.parse({"algorithm": args.algorithm, **values})


def run_command(args: argparse.Namespace) -> int:
    from silofl.server.engines import run_job

    config = config_from_args(args)
    _check_device(config, args)  # before anything runs: a run for a GPU on a machine without one
    _user_model_path(config)
    if getattr(args, "resume_dir", ""):
        from silofl.server.checkpoint import resume_config

        config = resume_config(config, args.resume_dir, out_given=bool(getattr(args, "out_dir", "")))
    node_configs = _silo_node_configs(config, args)
    from silofl.client.data.preflight import preflight

    # the data checked before anything starts: refusals raise ConfigError (exit 2), warnings one line each
    for warning in preflight(config, share_with_silos=args.engine == "inprocess"):
        print(f"silofl: warning: {warning}", file=sys.stderr)
    result = run_job(
        config,
        engine=args.engine,
        progress=not args.no_progress,
        node_configs=node_configs,
        ray_address=getattr(args, "ray_address", ""),
    )
    final = result["final"]
    spec = config.spec
    keys = dict(spec.summary_metrics)
    if spec.fairness_metrics and result["federation"].get("num_groups", 2) >= 2:  # one group (MNIST): no fairness
        keys.update({"DP viol.": "dp_violation", "EO viol.": "eo_violation"})
    metrics = {label: final.get(key) for label, key in keys.items()}
    _print_summary(config, result, args.engine, metrics)
    return 0


def _check_device(config: RunConfig, args: argparse.Namespace) -> None:
    """Refuse `--device cuda` when the silos would run on this machine (the in-process engine, or a local Ray) and
    torch sees no GPU here: ConfigError (exit 2) before the data is loaded. On a Ray cluster (`--ray-address` or
    RAY_ADDRESS) the GPUs are the cluster's: a node without one refuses the run's first message instead."""
    import os

    from silofl.protocols.devices import device_problem, visible_gpus

    device = str(getattr(config, "device", "cpu"))
    on_cluster = args.engine == "ray" and bool(getattr(args, "ray_address", "") or os.environ.get("RAY_ADDRESS"))
    if device != "cuda" or on_cluster:
        return
    problem = device_problem(device, visible_gpus())
    if problem:
        raise ConfigError(problem)


def _user_model_path(config: RunConfig) -> None:
    """Let `--model module:factory` name a module in the current folder, as `python -m` would: the folder is added
    at the END of the import path (an installed package of the same name wins), for the in-process silos and, through
    Flower's PYTHONPATH, a local Ray's workers. A deployed silo imports it from its own installation instead."""
    from silofl.protocols.model_names import is_custom_model
    from silofl.server.model_artifact import user_code_importable

    if is_custom_model(str(getattr(config, "model", ""))):
        user_code_importable()


def _silo_node_configs(config: RunConfig, args: argparse.Namespace) -> list[dict] | None:
    """The simulated silos' node configs for `--silo-policy` / `--silo-state` (None: neither given); the policy file
    is read and checked here, before anything runs."""
    policy, state = getattr(args, "silo_policy", ""), getattr(args, "silo_state", "")
    if not policy and not state:
        return None
    if policy and not state:
        raise ConfigError(
            "--silo-policy needs --silo-state DIR: a silo under a policy keeps its lifetime ledger (and charges its "
            "noised evaluations) in a state folder"
        )
    from silofl.server.engines import simulated_node_configs

    return simulated_node_configs(config, policy=policy or None, state_dir=state)


def _print_summary(config: RunConfig, result: dict, engine: str, metrics: dict[str, float | None]) -> None:
    """One-row table: the run's final metrics, epsilon spent, delta, seconds per round; then where result.json is."""
    from rich.console import Console
    from rich.table import Table

    privacy, timing = result["privacy"], result["timing"]
    nodes = f"{config.num_silos} silos"
    if config.sensitive_nodes:
        nodes = f"{config.num_silos} feature and {config.sensitive_nodes} sensitive parties ({config.topology_name})"
    table = Table(
        title=f"{config.algorithm} on {config.dataset}: {nodes}, "
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
    from silofl.server.privacy_statement import privacy_lines

    for line in privacy_lines(config.spec, config, privacy):
        console.print(line, markup=False, highlight=False)


def build_parser() -> argparse.ArgumentParser:
    from silofl.client.data.split_cli import add_data_parser
    from silofl.client.silo_cli import add_silo_parser
    from silofl.protocols.privacy.calibrate_cli import add_privacy_parser
    from silofl.server.deploy.cli import add_deploy_parser
    from silofl.server.model_cli import add_model_parsers
    from silofl.server.plots.cli import add_plot_parser
    from silofl.server.sweep import add_sweep_parser

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
    add_model_parsers(subparsers)
    return parser


def _check_extra_flags(args: argparse.Namespace, extras: list[str]) -> None:
    """Flags `silofl run ALG` does not have, explained as a run config would be: another algorithm's option names
    the algorithms that have it (`--epsilon` for fedavg), a typo gets the closest key. Raises :class:`ConfigError`
    unless every extra flag asks, with a value, for what the algorithm does anyway (`--epsilon inf` for fedavg); a
    flag without a value (`--dry-run`, `--verbose`, `--epsilonn`) is always an error, never ignored."""
    values: dict[str, str] = {}
    tokens = list(extras)
    hint = f"`silofl run {args.algorithm} --help` lists the options"
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}; {hint}")
        key, has_value, value = token[2:].partition("=")
        if not has_value:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following is None or (following.startswith("--") and len(following) > 2):
                raise ConfigError(f"unknown flag '--{key}' (without a value); {hint}")
            value, i = following, i + 1
        if not value:
            raise ConfigError(f"unknown flag '--{key}' with an empty value; {hint}")
        values[key] = value
        i += 1
    RunConfig.parse({"algorithm": args.algorithm, "rounds": 1, **values})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras and getattr(args, "command", "") != "run":
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        if extras:
            _check_extra_flags(args, extras)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        print(_interrupted(exc, args, argv if argv is not None else sys.argv[1:]), file=sys.stderr)
        return 130
    except ConfigError as exc:
        print(f"silofl: {exc}", file=sys.stderr)
        return 2
    except RoundError as exc:
        print(f"silofl: the run stopped: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"silofl: error: {exc}", file=sys.stderr)
        return 2


def _interrupted(exc: KeyboardInterrupt, args: argparse.Namespace, argv: Sequence[str]) -> str:
    """What Ctrl-C leaves: where the state after the last completed round is, and the command that continues it."""
    import shlex

    from silofl.server.orchestrator import RunInterrupted

    if not isinstance(exc, RunInterrupted):
        return "silofl: interrupted (Ctrl-C) before the rounds started or on an engine that keeps no state here"
    text = f"silofl: {exc}"
    if exc.path is not None:
        text += f"; the state after round {exc.completed} is in {exc.path}"
    if exc.resumable and exc.path is not None:
        kept, skip = [], False
        for token in argv:  # the same command, its --out / --resume replaced by --resume on this run's folder
            if skip:
                skip = False
            elif token in ("--out", "--out-dir", "--resume"):
                skip = True
            elif not token.startswith(("--out=", "--out-dir=", "--resume=")):
                kept.append(token)
        text += f"\ncontinue it with: silofl {shlex.join([*kept, '--resume', str(exc.path.parent)])}"
    elif exc.path is not None:
        text += f" ({args.algorithm} runs cannot be resumed: run it again to finish)"
    return text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
