"""`silofl sweep FILE.toml`: the command's flags, the `--where KEY=VALUE` slices, and stopping cleanly on Ctrl-C or
`kill`.

The exit code is 0 when every chosen run finished, 1 when a run failed (the others still ran), 2 for a sweep that
cannot run (bad file, bad flag, stale run folders, a run that fails `silofl run`'s data checks) and 130 when
interrupted.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from silofl.server.sweep.checks import check_runs
from silofl.server.sweep.grid import load_sweep, select
from silofl.server.sweep.runner import run_state, run_sweep
from silofl.server.sweep.spec import SweepError


def add_sweep_parser(subparsers: Any) -> None:
    """`silofl sweep FILE.toml [--workers N] [--out DIR] [--methods A,B] [--where KEY=VALUE] [--dry-run]`."""
    import argparse

    p = subparsers.add_parser(
        "sweep",
        help="run a grid of jobs from a TOML file (resumable, parallel)",
        description="Run every configuration of a sweep file, one folder per run; finished runs are skipped.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("file", help="sweep file (TOML: [base], [grid], [[methods]]; see benchmarks/sweeps/)")
    p.add_argument("--workers", type=int, default=2, help="runs in parallel (processes, one torch thread each)")
    p.add_argument(
        "--out", default="", help="folder of the run folders (default: the file's 'out', else runs/sweeps/<stem>)"
    )
    p.add_argument("--methods", default="", help="comma-separated method names: run only these")
    p.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE", help="run only runs with this config value"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the runs (the data of those to do checked as silofl run checks it), list them with their "
        "state; run nothing",
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (one line per run still)")
    p.set_defaults(func=sweep_command)


def parse_where(items: Sequence[str], flag: str = "--where") -> dict[str, str]:
    """`["lambda=1", "seed=0"]` -> {"lambda": "1", "seed": "0"}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} lambda=1")
        out[key.strip()] = value.strip()
    return out


@contextlib.contextmanager
def _termination_as_interrupt() -> Iterator[None]:
    """`kill PID` (SIGTERM) stops a sweep as Ctrl-C does: the interrupt path terminates the worker processes. With
    Python's default SIGTERM the parent dies at once and its pool's workers outlive it, finishing their runs into
    folders that the next sweep of the same file also writes."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sweep_command(args: Any) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    try:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] or None
        sweep = load_sweep(args.file, out=args.out or None, methods=methods)
        chosen = select(sweep.runs, parse_where(args.where)) if args.where else sweep.runs
        if not chosen:
            raise SweepError(f"{args.file}: no run matches --where {' '.join(args.where)}")
        if args.dry_run:
            states = {run.name: run_state(run) for run in chosen}
            check_runs([run for run in chosen if states[run.name] == "todo"], where=args.file, console=console)
            for run in chosen:
                print(f"{states[run.name]:8s} {run.folder}")
            print(f"{len(chosen)} runs, all valid; out dir {sweep.out}")
            return 0
        if args.workers < 1:
            raise SweepError(f"--workers {args.workers}: give at least 1")
        with _termination_as_interrupt():
            report = run_sweep(sweep, workers=args.workers, runs=chosen, progress=not args.no_progress, console=console)
    except SweepError as exc:
        print(f"silofl sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"silofl sweep: interrupted; finished runs are kept, run the same command again to resume ({args.file})",
            file=sys.stderr,
        )
        return 130
    return 0 if report.ok else 1
