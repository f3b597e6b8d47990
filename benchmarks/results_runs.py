"""The run files behind docs/RESULTS.md's sections: what a section read (:class:`RunFiles`: count and time), a run
folder's JSON files, and sentences on a sweep's runs (their state against the sweep file, their grid).

Shared by the section modules `benchmarks/results_*.py`; the run folders themselves are read into records by
`server.plots.runs`.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.results_text import fmt
from silofl.server import plots

#: The repository root (commands in the document name files relative to it).
ROOT = Path(__file__).resolve().parents[1]
#: The environment the document's commands are run with (the data sets outside the repository).
DATA_ENV = "SILOFL_DATA_DIR=../shared/data"
#: The method name of SteFFLe's runs.
STEFFLE = "steffle"


@dataclass
class RunFiles:
    """The runs a section used: their count and the time they took (as recorded in their files)."""

    runs: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cpu_recorded: int = 0

    def add(self, wall: float | None, cpu: float | None) -> None:
        self.runs += 1
        self.wall_seconds += float(wall or 0.0)
        if cpu is not None:
            self.cpu_seconds += float(cpu)
            self.cpu_recorded += 1

    def merge(self, other: RunFiles) -> None:
        self.runs += other.runs
        self.wall_seconds += other.wall_seconds
        self.cpu_seconds += other.cpu_seconds
        self.cpu_recorded += other.cpu_recorded


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def run_times(folder: Path) -> tuple[float | None, float | None]:
    """(wall seconds, CPU seconds) of a run folder: `result.json`'s timing.total_seconds, and the CPU seconds if a
    file records them (`timing.cpu_seconds` in result.json or `cpu_seconds` in the sweep's run.json)."""
    result = read_json(folder / "result.json")
    timing = result.get("timing") or {}
    cpu = timing.get("cpu_seconds")
    if cpu is None:
        cpu = read_json(folder / "run.json").get("cpu_seconds")
    return timing.get("total_seconds"), cpu


def records_files(records: Sequence[plots.RunRecord]) -> RunFiles:
    """The count and time of the runs of `records`."""
    files = RunFiles()
    for record in records:
        files.add(*run_times(record.folder))
    return files


def rel(path: Path, start: Path | None = None) -> str:
    """`path` relative to `start` (the working directory by default), as the document cites it."""
    start = start or Path.cwd()
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def section_runs(folder: Path, sweep_file: Path, metric: str) -> tuple[list[plots.RunRecord], RunFiles, str]:
    """The completed runs of a one-sweep section (those with an error and `metric`), their files, and a sentence on
    their state against the sweep file (how many it has, how many finished)."""
    records, incomplete = plots.load_runs([folder])
    records = [r for r in records if plots._has(r, "error") and plots._has(r, metric)]
    return records, records_files(records), sweep_state_text(folder, sweep_file, len(records), incomplete)


def sweep_state_text(folder: Path, sweep_file: Path, found: int, incomplete: int) -> str:
    """A sentence on a section's runs against its sweep file: how many completed runs were read, how many incomplete
    ones skipped, how many runs the sweep file has and how many of them finished."""
    from silofl.server.sweep import SweepError, load_sweep, run_state

    state = f"{found} completed runs in `{rel(folder)}`" + (f", {incomplete} incomplete skipped" if incomplete else "")
    try:
        expected = load_sweep(sweep_file, out=folder).runs
        done = sum(run_state(run) == "finished" for run in expected)
        state += f"; the sweep file has {len(expected)} runs, {done} finished"
    except (SweepError, OSError, ValueError) as exc:
        state += f"; the sweep file does not load: {exc}"
    return state


def grid_text(records: Sequence[plots.RunRecord]) -> str:
    """Per method (SteFFLe first): its runs, the values of each key it varies, and its seeds."""
    by_method: dict[str, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        by_method[r.method].append(r)
    varied = plots.varied_keys(records)
    parts = []
    for method, runs in sorted(by_method.items(), key=lambda kv: (kv[0] != STEFFLE, kv[0])):
        keys = [k for k in varied[method] if k not in ("seed",)]
        grid = "; ".join(
            f"{k} {{{', '.join(fmt(v) for v in sorted({r.get(k) for r in runs}, key=plots._sort_key))}}}" for k in keys
        )
        seeds = sorted({r.get("seed") for r in runs}, key=plots._sort_key)
        parts.append(f"{method}: {len(runs)} runs ({grid + '; ' if grid else ''}seeds {', '.join(map(str, seeds))})")
    return "; ".join(parts)
