"""The run files behind docs/RESULTS.md's sections: what a section read (:class:`RunFiles`: count and time), a run
folder's JSON files, and sentences on a sweep's runs (their state against the sweep file, their grid).

Shared by the section modules `benchmarks/results_*.py`; the run folders themselves are read into records by
`server.plots.runs` (each record holds its result.json as a typed `RunResult`, :func:`result_of`).
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
from silofl.server.run_result import SUMMARY_SKIP, RunResult, RunResultError

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
    """The JSON object in `path` (a sweep's run.json, a cached cell); {} when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def result_of(record: plots.RunRecord) -> RunResult:
    """The typed result.json of a record, without its per-round entries and model arrays: the one `plots.load_runs`
    read, else its folder's (a RunResultError naming the file and the field when that is not a silofl result)."""
    return record.result if record.result is not None else RunResult.load(record.folder, skip=SUMMARY_SKIP)


def run_times(record: plots.RunRecord) -> tuple[float | None, float | None]:
    """(wall seconds, CPU seconds) of a run: `result.json`'s timing.total_seconds, and the CPU seconds if a file
    records them (`timing.cpu_seconds` in result.json or `cpu_seconds` in the sweep's run.json); None where the run
    folder does not say."""
    try:
        timing = result_of(record).timing
    except RunResultError:
        timing = None
    cpu = timing.get("cpu_seconds") if timing is not None else None
    if cpu is None:
        cpu = read_json(record.folder / "run.json").get("cpu_seconds")
    return (timing.total_seconds if timing is not None else None), cpu


def seconds_per_round(records: Sequence[plots.RunRecord]) -> list[float]:
    """Each run's `timing.seconds_per_round` (the runs whose result records it)."""
    timings = [result_of(r).timing for r in records]
    return [float(t.seconds_per_round) for t in timings if t is not None and t.seconds_per_round is not None]


def sigma_text(record: plots.RunRecord) -> str:
    """`sigma (q)` of a run's first silo in `privacy.per_silo` (its noise multiplier and sampling rate; the silos of
    one run hold about n/N records each); "-" for a run that records none."""
    privacy = result_of(record).privacy
    per = list((privacy.per_silo or {}).values()) if privacy is not None else []
    return f"{per[0].noise_multiplier:.3g} ({per[0].sampling_rate:.3g})" if per else "-"


def records_files(records: Sequence[plots.RunRecord]) -> RunFiles:
    """The count and time of the runs of `records`."""
    files = RunFiles()
    for record in records:
        files.add(*run_times(record))
    return files


def runs_by(
    records: Sequence[plots.RunRecord], keys: Sequence[str]
) -> dict[tuple[float, ...], dict[int, plots.RunRecord]]:
    """The runs per cell of the config `keys` (their values as floats: "inf" is math.inf), by seed."""
    cells: dict[tuple[float, ...], dict[int, plots.RunRecord]] = defaultdict(dict)
    for r in records:
        cells[tuple(plots.as_float(r.get(key)) for key in keys)][int(r.get("seed") or 0)] = r
    return dict(cells)


def rel(path: Path, start: Path | None = None) -> str:
    """`path` relative to `start` (the working directory by default), as the document cites it."""
    start = start or Path.cwd()
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def section_runs(
    folder: Path, sweep_file: Path, metric: str, *, with_rounds: bool = False
) -> tuple[list[plots.RunRecord], RunFiles, str]:
    """The completed runs of a one-sweep section (those with an error and `metric`; `with_rounds`: with their
    per-round entries), their files, and a sentence on their state against the sweep file (how many it has, how many
    finished)."""
    records, incomplete = plots.load_runs([folder], with_rounds=with_rounds)
    records = [r for r in records if plots.has(r, "error") and plots.has(r, metric)]
    return records, records_files(records), sweep_state_text(folder, sweep_file, len(records), incomplete)


def sweep_opening(
    folder: Path, sweep_file: Path, only: str, metric: str, *, with_rounds: bool = False
) -> tuple[list[str], list[plots.RunRecord], RunFiles]:
    """What a one-sweep section says before its results, and its runs (:func:`section_runs`): without the sweep's
    folder, "Not generated yet" and the command that makes it (no runs); else the commands (the sweep, then
    `python benchmarks/results.py --only only`), the runs' state against the sweep file and their grid."""
    command = f"{DATA_ENV} silofl sweep {rel(sweep_file, ROOT)}"
    if not folder.is_dir():
        return [f"Not generated yet: run `{command}`, then `python benchmarks/results.py`.", ""], [], RunFiles()
    records, files, state = section_runs(folder, sweep_file, metric, with_rounds=with_rounds)
    lines = ["Commands:", "", "```bash", command, f"python benchmarks/results.py --only {only}", "```", ""]
    return [*lines, f"Runs: {state}. Grid: {grid_text(records)}.", ""], records, files


def figure_lines(drawn: Sequence[tuple[str, Any]], figures: Path, alt: str, doc_dir: Path) -> list[str]:
    """Save the figures `drawn` ((file stem, matplotlib figure)) as PNG in `figures` and free them; the markdown
    lines that show them (`alt` text, paths relative to the document's folder `doc_dir`)."""
    lines = []
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![{alt}]({rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    return lines


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
            f"{k} {{{', '.join(fmt(v) for v in sorted({r.get(k) for r in runs}, key=plots.sort_key))}}}" for k in keys
        )
        seeds = sorted({r.get("seed") for r in runs}, key=plots.sort_key)
        parts.append(f"{method}: {len(runs)} runs ({grid + '; ' if grid else ''}seeds {', '.join(map(str, seeds))})")
    return "; ".join(parts)
