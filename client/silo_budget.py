"""`silofl silo budget --state-dir DIR`: what a silo has spent over its lifetime, read from its state folder.

    silofl silo budget --state-dir DIR [--delta D]

DIR is one node's state folder (it holds ``lifetime-ledger.json``: `client.lifetime_ledger`) or a folder of them
(`silofl run ... --silo-state DIR` keeps ``DIR/silo0``, ``DIR/silo1``, ...). For each node it prints every job it
admitted (its key, algorithm, the first and last round it charged, the epsilon its own ledger charged and the epsilon
it reserved), its noised evaluations, and the lifetime figures: the composition of every job's planned run and of the
evaluations, each by PLD under replacing one record, and what is left of `lifetime-epsilon`. It reads files only, so
it works on a stopped silo (and on a running one: the files are replaced atomically).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

#: The delta of the lifetime figures of a node that has no lifetime budget (no `lifetime-delta` to use).
DEFAULT_REPORT_DELTA = 1e-6


def node_folders(directory: Path) -> list[Path]:
    """The state folders under `directory`: itself if it holds a lifetime ledger, else its subfolders that do."""
    from silofl.client import lifetime_ledger

    if lifetime_ledger.path_of(directory).is_file():
        return [directory]
    return sorted(p for p in directory.iterdir() if p.is_dir() and lifetime_ledger.path_of(p).is_file())


def job_charges(directory: Path, key: str) -> dict[str, object]:
    """From a job's own file: the first and last round it charged and the epsilon its ledger reports."""
    from silofl.client.privacy_state import LEDGER_KEY
    from silofl.protocols.privacy.ledger import PrivacyLedger
    from silofl.protocols.record_codec import decode_record

    path = directory / f"{key}.json"
    if not path.is_file():
        return {"first": None, "last": None, "charged": 0.0, "note": "no job file (nothing charged yet)"}
    records = json.loads(path.read_text())["records"]
    if LEDGER_KEY not in records:
        return {"first": None, "last": None, "charged": 0.0, "note": "nothing charged"}
    ledger = PrivacyLedger.from_dict(dict(decode_record(records[LEDGER_KEY])))
    rounds = ledger.rounds()
    return {"first": rounds[0], "last": rounds[-1], "charged": ledger.spent(), "note": ""}


def node_report(directory: Path, delta: float | None = None) -> dict[str, object]:
    """Everything `silofl silo budget` prints for one node's state folder, as data (tests read it)."""
    from silofl.client import lifetime_ledger

    ledger = lifetime_ledger.load(directory)
    budget = ledger.budget
    lifetime_eps = float(budget["lifetime-epsilon"]) if budget else math.inf
    at = float(budget["lifetime-delta"]) if budget else (delta if delta is not None else DEFAULT_REPORT_DELTA)
    jobs = []
    for key, job in ledger.jobs.items():
        jobs.append(
            {
                "job": key,
                "algorithm": job.algorithm,
                "reserved": job.epsilon,
                "delta": job.delta,
                "covers_all_data": job.covers_all_data,
                **job_charges(directory, key),
            }
        )
    training = lifetime_ledger.epsilon_of(ledger.training_state(), at)
    evaluation = ledger.evaluation_epsilon(at)
    spent = max(training, evaluation)
    return {
        "folder": str(directory),
        "jobs": jobs,
        "evaluations": sum(ledger.evaluations.values()),
        "randomized_responses": len(ledger.randomized_responses),
        "evaluation_runs": ledger.evaluation_runs,
        "delta": at,
        "training_epsilon": training,
        "evaluation_epsilon": evaluation,
        "lifetime_epsilon": spent,
        "budget": lifetime_eps,
        "left": max(lifetime_eps - spent, 0.0) if math.isfinite(lifetime_eps) else math.inf,
    }


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def print_report(report: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lifetime ledger of {report['folder']}")
    for column in ("job", "algorithm", "rounds", "epsilon charged", "epsilon reserved", "covers"):
        table.add_column(column)
    for job in report["jobs"]:  # type: ignore[union-attr]
        rounds = "-" if job["first"] is None else f"{job['first']}..{job['last']}"
        covers = "all its data" if job["covers_all_data"] else "part (some releases in the clear)"
        table.add_row(
            job["job"], job["algorithm"], rounds, _fmt(job["charged"]), _fmt(job["reserved"]), covers + job["note"]
        )
    console = Console()
    console.print(table)
    responses = report.get("randomized_responses", 0)
    older = f", randomized responses of the test groups (earlier versions): {responses}" if responses else ""
    console.print(
        f"evaluations answered noised: {report['evaluations']}{older} (epsilon {_fmt(report['evaluation_epsilon'])}); "
        f"jobs: epsilon {_fmt(report['training_epsilon'])}; lifetime epsilon {_fmt(report['lifetime_epsilon'])} "
        f"at delta {report['delta']:g} (PLD, replace one record; jobs and evaluations of disjoint records compose in "
        f"parallel); budget {_fmt(report['budget'])}, left {_fmt(report['left'])}"
    )


def budget_command(args: argparse.Namespace) -> int:
    from silofl.client.lifetime_ledger import FILE_NAME
    from silofl.protocols.messages import MessageError

    directory = Path(args.state_dir).expanduser()
    if not directory.is_dir():
        print(f"silofl silo budget: --state-dir {directory}: no such folder", file=sys.stderr)
        return 2
    folders = node_folders(directory)
    if not folders:
        print(
            f"silofl silo budget: {directory} holds no lifetime ledger ({FILE_NAME}), nor do its "
            "subfolders: give a node's state folder (silofl silo start --state-dir) or a --silo-state folder",
            file=sys.stderr,
        )
        return 2
    try:
        for folder in folders:
            print_report(node_report(folder, args.delta))
    except MessageError as exc:
        print(f"silofl silo budget: {exc}", file=sys.stderr)
        return 2
    return 0


def add_budget_parser(silo_sub: argparse._SubParsersAction) -> None:
    budget = silo_sub.add_parser(
        "budget",
        help="what a silo has spent over its lifetime (its state folder), and what is left",
        description="Print each job a silo admitted, its noised evaluations and its lifetime epsilon, from its state "
        "folder (or from every silo's folder under a --silo-state folder). Reads files only.",
    )
    budget.add_argument("--state-dir", required=True, metavar="DIR", help="a node's state folder, or a folder of them")
    budget.add_argument(
        "--delta",
        type=float,
        default=None,
        metavar="D",
        help=f"the delta of the figures when the node has no lifetime-delta (default {DEFAULT_REPORT_DELTA:g})",
    )
    budget.set_defaults(func=budget_command)
