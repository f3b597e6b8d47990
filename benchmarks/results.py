"""Generate docs/RESULTS.md and its figures from the run files: SteFFLe's sweeps, the DP-mu2-FL tables, FedSC.

    SILOFL_DATA_DIR=../shared/data silofl sweep benchmarks/sweeps/steffle_adult_dp.toml   # ... each sweep file
    python benchmarks/results.py [--sweeps runs/sweeps] [--sweep-files benchmarks/sweeps] [--out docs/RESULTS.md]
        [--figures docs/figures] [--mu2-cells runs/mu2_tables] [--fedsc-runs runs/fedsc_fmnist]

Every number of the document is read by this script from a run file: a run folder's `result.json` (and the sweep's
`run.json` for the method name), or a cell cached by benchmarks/mu2_tables.py (`runs/mu2_tables/*.json`). The only
constants are the papers' own numbers, quoted as such. A section whose runs are missing says "not generated yet" and
names the command that makes them. The figures are drawn by `server/plots/` (the functions behind `silofl plot`)
and written as PNG next to the document (`--figures`), linked relatively.

SteFFLe's figures and tables come from the four sweeps `steffle_{adult,credit}_{dp,eo}` (run folders under
`--sweeps/<name>/`, the sweep files under `--sweep-files/<name>.toml`): for each (dataset, fairness notion) the
fairness-violation-vs-test-error figure (panels by heterogeneity h and epsilon) and the reduction in fairness
violation at matched test error against each baseline (:func:`matched_error_reduction`), next to the paper's claims.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server import plots  # noqa: E402  (after the path insert: the script runs from anywhere)

# -- the paper's claims (SteFFLe paper, Section 5 "Average results" and the introduction) -----------------------------

#: The SteFFLe paper's words on how its headline numbers were computed (Section 5, "Average results"; introduction).
PAPER_METHOD_QUOTE = (
    "To evaluate the overall performance of our algorithm and the existing baselines, we calculated the performance "
    "gain with respect to fairness violation (for fixed accuracy level) that our model yields *over all the "
    "datasets*. We obtained reductions in demographic parity violations of around 75.47% and 52.93% compared with "
    "Tran et al. [2021] and Ling et al. [2024]. [...] We also obtained an average reduction in equalized odds "
    "violation of 95.42% compared to Ling et al. [2024]."
)
PAPER_INTRO_QUOTE = (
    "the equalized odds fairness violation of our algorithm was 95% lower than the previous state-of-the-art "
    "[Ling et al., 2024] for the same fixed accuracy level."
)


@dataclass(frozen=True)
class PaperClaim:
    fairness: str  # "dp" or "eo"
    baseline: str  # a method name of the sweeps, or "fedfdp" (implemented, not in the sweeps yet)
    reduction: float | None  # fraction; None when the paper gives no number
    text: str


PAPER_CLAIMS = (
    PaperClaim("dp", "tran", 0.7547, "75.47% lower demographic parity violation than Tran et al. 2021"),
    PaperClaim("dp", "fedfdp", 0.5293, "52.93% lower demographic parity violation than FedFDP (Ling et al. 2024)"),
    PaperClaim("eo", "fedfdp", 0.9542, "95.42% lower equalized odds violation than FedFDP (Ling et al. 2024)"),
    PaperClaim(
        "eo",
        "tran",
        None,
        "no number; Appendix E.3.3: SteFFLe 'surpasses the performance of Tran et al. [2021] by an exceptional "
        "margin, exceeding their results by over 150%' (Tran et al. left out of the equalized odds plots)",
    ),
)

#: SteFFLe's sweeps: (name = sweep file stem = run folder, dataset, fairness notion).
STEFFLE_SWEEPS = (
    ("steffle_adult_dp", "adult", "dp"),
    ("steffle_credit_dp", "credit", "dp"),
    ("steffle_adult_eo", "adult", "eo"),
    ("steffle_credit_eo", "credit", "eo"),
    ("steffle_parkinsons_dp", "parkinsons", "dp"),
    ("steffle_parkinsons_eo", "parkinsons", "eo"),
)
#: The sweeps `--only parkinsons` regenerates (their sections alone; the summary needs every sweep's runs).
PARKINSONS_SWEEPS = tuple(s for s in STEFFLE_SWEEPS if s[1] == "parkinsons")
STEFFLE = "steffle"
#: The baselines of the reduction tables, in column order, with what each one is.
BASELINES = {
    "tran": "Tran et al. 2021 (Lagrangian dual, noise in each silo; points traced by the dual step)",
    "dp-fedsgd": "DP-FedSGD (record-level DP at the same epsilon, no fairness term)",
    "fedavg": "FedAvg (non-private, no fairness term)",
    "dp-fermi": "DP-FERMI (SteFFLe with one silo holding every record, same epsilon)",
    "fermi": "FERMI (one silo, non-private)",
    "fedfdp": "FedFDP (Ling et al. 2024: equal loss across silos, record-level DP of the whole record at the same "
    "epsilon, its adaptive loss bound as the spec writes it; points traced by lambda)",
}
#: Config keys of SteFFLe's runs worth stating under each figure (when all the sweep's SteFFLe runs share them).
SHOWN_KEYS = (
    "num-silos",
    "partition",
    "model",
    "epochs",
    "rounds",
    "batch-size",
    "lr",
    "lr-decay",
    "lr-decay-epochs",
    "clip",
    "w-radius",
    "w-lr",
    "counts-share",
    "accountant",
)
DATA_ENV = "SILOFL_DATA_DIR=../shared/data"


# -- the reduction in fairness violation at matched test error (pure) -------------------------------------------------

Point = tuple[float, float]  # (test error, fairness violation), each the mean over seeds


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The points no other point beats in both test error and violation, sorted by error (violations decreasing).

    A point is kept iff its violation is strictly below that of every point with a smaller (or equal) error; among
    points with the same error only the lowest violation can be kept.
    """
    front: list[Point] = []
    for error, violation in sorted(points):  # by error, then violation: the first of equal errors is the lowest
        if not front or violation < front[-1][1]:
            front.append((error, violation))
    return front


def lower_envelope(points: Sequence[Point], error: float) -> float | None:
    """SteFFLe's violation at test error `error`: its Pareto front, linearly interpolated between front points and
    flat after the last one (the lowest violation reached at an error <= `error`); None outside the error range of
    `points` (below the smallest error or above the largest: no extrapolation)."""
    if not points:
        return None
    lo, hi = min(e for e, _ in points), max(e for e, _ in points)
    if not lo <= error <= hi:
        return None
    front = pareto_front(points)
    if error >= front[-1][0]:
        return front[-1][1]
    for (e0, v0), (e1, v1) in itertools.pairwise(front):
        if e0 <= error <= e1:
            return v0 if e1 == e0 else v0 + (v1 - v0) * (error - e0) / (e1 - e0)
    raise AssertionError("unreachable: error lies in [front[0], front[-1]]")  # pragma: no cover


@dataclass(frozen=True)
class MatchedPoint:
    """One baseline point matched to SteFFLe's curve at the same test error."""

    error: float
    baseline_violation: float
    steffle_violation: float

    @property
    def reduction(self) -> float:
        return 1.0 - self.steffle_violation / self.baseline_violation


@dataclass(frozen=True)
class Reduction:
    """The reduction in fairness violation at matched test error of SteFFLe against one baseline (one panel)."""

    matched: tuple[MatchedPoint, ...]
    total: int  # baseline points
    below: int  # baseline points with a test error below SteFFLe's smallest: not matched
    above: int  # baseline points with a test error above SteFFLe's largest: not matched
    zero: int  # matched in error but with zero violation: no relative reduction defined

    @property
    def mean(self) -> float | None:
        """Mean of 1 - v_SteFFLe(e) / v_baseline over the matched points; None when none matched."""
        if not self.matched:
            return None
        return sum(p.reduction for p in self.matched) / len(self.matched)

    def text(self, reference: str = "SteFFLe") -> str:
        """`48.2% (2/3)`: the mean reduction and matched / baseline points; `n/a (0/1: ...)` when none matched
        (`reference`: whose curve the points were matched to)."""
        count = f"{len(self.matched)}/{self.total}"
        if self.total == 0:
            return "no runs"
        if self.mean is not None:
            return f"{100 * self.mean:.1f}% ({count})"
        reasons = [
            f"{n} {what}"
            for n, what in (
                (
                    self.below,
                    f"below {reference}' error range"
                    if reference.endswith("s")
                    else f"below {reference}'s error range",
                ),
                (
                    self.above,
                    f"above {reference}' error range"
                    if reference.endswith("s")
                    else f"above {reference}'s error range",
                ),
                (self.zero, "with zero violation"),
            )
            if n
        ]
        return f"n/a ({count}: {', '.join(reasons) or f'no {reference} point'})"


def matched_error_reduction(steffle: Sequence[Point], baseline: Sequence[Point]) -> Reduction:
    """Reduction in fairness violation of SteFFLe against a baseline at matched test error.

    The SteFFLe paper (Section 5, "Average results") says only this about how its numbers were computed:

        "we calculated the performance gain with respect to fairness violation (for fixed accuracy level) that our
        model yields over all the datasets. We obtained reductions in demographic parity violations of around
        75.47% and 52.93% compared with Tran et al. [2021] and Ling et al. [2024]. [...] We also obtained an
        average reduction in equalized odds violation of 95.42% compared to Ling et al. [2024]."

    and in the introduction: "the equalized odds fairness violation of our algorithm was 95% lower than the
    previous state-of-the-art [Ling et al., 2024] for the same fixed accuracy level". So: a relative reduction of
    the violation, at a fixed accuracy (equivalently test error), averaged. It does not say how the accuracy levels
    are matched; this function uses the standard choice:

    - `steffle` and `baseline` are points (test error, violation), each the mean over seeds of one configuration
      (one lambda for SteFFLe, one dual step for Tran et al., the single point of FedAvg, ...);
    - SteFFLe's trade-off curve is its lower envelope (:func:`lower_envelope`): the Pareto front of its points,
      linearly interpolated between front points and flat after the last one;
    - every baseline point whose test error e lies inside SteFFLe's error range [min, max] is matched: its
      reduction is 1 - v_SteFFLe(e) / v_baseline (negative when SteFFLe's violation is higher); points outside the
      range are not matched (no extrapolation) and are counted in `below` / `above`; a point with zero violation
      has no relative reduction and is counted in `zero`;
    - the result is the mean over the matched points (:attr:`Reduction.mean`), with the number of matched points.
    """
    matched, below, above, zero = [], 0, 0, 0
    lo = min((e for e, _ in steffle), default=math.inf)
    hi = max((e for e, _ in steffle), default=-math.inf)
    for error, violation in baseline:
        if error < lo:
            below += 1
            continue
        if error > hi:
            above += 1
            continue
        if violation <= 0.0:
            zero += 1
            continue
        value = lower_envelope(steffle, error)
        assert value is not None  # inside the range
        matched.append(MatchedPoint(error, violation, value))
    return Reduction(tuple(matched), len(baseline), below, above, zero)


def mean_or_none(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


# -- run files --------------------------------------------------------------------------------------------------------


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def run_times(folder: Path) -> tuple[float | None, float | None]:
    """(wall seconds, CPU seconds) of a run folder: `result.json`'s timing.total_seconds, and the CPU seconds if a
    file records them (`timing.cpu_seconds` in result.json or `cpu_seconds` in the sweep's run.json)."""
    result = _read_json(folder / "result.json")
    timing = result.get("timing") or {}
    cpu = timing.get("cpu_seconds")
    if cpu is None:
        cpu = _read_json(folder / "run.json").get("cpu_seconds")
    return timing.get("total_seconds"), cpu


def _records_files(records: Sequence[plots.RunRecord]) -> RunFiles:
    files = RunFiles()
    for record in records:
        files.add(*run_times(record.folder))
    return files


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _fmt(value: Any) -> str:
    return plots._fmt(value)


def _mean_sd_text(values: Sequence[float]) -> str:
    """`79.1%` for one value, `79.1% ± 0.4` (sample sd) for several."""
    mean, sd = plots.mean_sd(values)
    return f"{mean:.1f}%" + (f" ± {sd:.1f}" if len(values) > 1 else "")


# -- SteFFLe ----------------------------------------------------------------------------------------------------------


@dataclass
class MeanPoint:
    """One configuration (all config keys but the seed): its label and the mean ± sd over seeds."""

    method: str
    label: str
    seeds: int
    error: tuple[float, float]
    violation: tuple[float, float]

    @property
    def xy(self) -> Point:
        return (self.error[0], self.violation[0])


@dataclass
class Panel:
    h: float
    epsilon: float
    points: dict[str, list[MeanPoint]]  # method -> points
    reductions: dict[str, Reduction]  # baseline -> reduction

    def steffle_points(self) -> list[Point]:
        return [p.xy for p in self.points.get(STEFFLE, [])]


@dataclass
class SweepResult:
    """What one SteFFLe sweep produced: its panels, figures and the state of its run folders."""

    name: str
    dataset: str
    fairness: str
    folder: Path
    sweep_file: Path
    records: list[plots.RunRecord] = field(default_factory=list)
    incomplete: int = 0
    expected: int | None = None
    finished: int = 0
    failed: int = 0
    stale: int = 0
    panels: list[Panel] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    files: RunFiles = field(default_factory=RunFiles)
    problem: str = ""


_SEED_FREE = frozenset({"seed", "out-dir", "data-dir", "round-timeout"})


def mean_points(records: Sequence[plots.RunRecord], metric: str) -> dict[str, list[MeanPoint]]:
    """Per method, one point per configuration (the runs that differ only in the seed): mean ± sd of the test error
    and of `metric` over the seeds; labelled by the keys the method varies apart from the panel keys (lambda, ...)."""
    varied = plots.varied_keys(records)
    groups: dict[tuple[str, str], list[plots.RunRecord]] = defaultdict(list)
    for record in records:
        key = json.dumps({k: v for k, v in record.config.items() if k not in _SEED_FREE}, sort_keys=True)
        groups[(record.method, key)].append(record)
    out: dict[str, list[MeanPoint]] = defaultdict(list)
    for (method, _), runs in groups.items():
        keys = [k for k in varied[method] if k not in plots._PANEL_KEYS]
        label = ", ".join(f"{k} {_fmt(runs[0].get(k))}" for k in keys) or "-"
        out[method].append(
            MeanPoint(
                method,
                label,
                len(runs),
                plots.mean_sd([r.final["error"] for r in runs]),
                plots.mean_sd([r.final[metric] for r in runs]),
            )
        )
    for points in out.values():
        points.sort(key=lambda p: (p.label, p.error[0]))
    return dict(out)


def panels_of(records: Sequence[plots.RunRecord], fairness: str) -> list[Panel]:
    """One panel per (h, epsilon) of the multi-silo private runs, as in `silofl plot fairness` (a one-silo run belongs
    to every h, a non-private run to every epsilon), with SteFFLe's reduction against each baseline."""
    metric = plots.FAIRNESS_METRIC[fairness]
    records = [r for r in records if plots._has(r, "error") and plots._has(r, metric)]
    multi = [r for r in records if int(r.get("num-silos") or 1) > 1]
    hs = sorted({plots._float(r.get("heterogeneity")) for r in multi}) or sorted(
        {plots._float(r.get("heterogeneity")) for r in records}
    )
    eps = sorted({r.epsilon for r in records if math.isfinite(r.epsilon)}) or [math.inf]
    panels = []
    for h in hs:
        for e in eps:
            members = [r for r in records if plots._in_panel(r, h, e)]
            points = mean_points(members, metric)
            steffle = [p.xy for p in points.get(STEFFLE, [])]
            reductions = {
                name: matched_error_reduction(steffle, [p.xy for p in points[name]])
                for name in BASELINES
                if name in points and steffle
            }
            panels.append(Panel(h, e, points, reductions))
    return panels


def load_steffle_sweep(
    name: str, dataset: str, fairness: str, sweeps: Path, sweep_files: Path, figures: Path
) -> SweepResult:
    """Read one SteFFLe sweep's run folders, compare them with its sweep file, draw its figure, compute its panels."""
    from server.sweep import SweepError, load_sweep, run_state

    result = SweepResult(name, dataset, fairness, sweeps / name, sweep_files / f"{name}.toml")
    if result.sweep_file.is_file():
        try:
            sweep = load_sweep(result.sweep_file, out=result.folder)
        except SweepError as exc:
            result.problem = f"the sweep file does not load: {exc}"
        else:
            result.expected = len(sweep.runs)
            for run in sweep.runs:
                state = run_state(run)
                result.finished += state == "finished"
                result.stale += state == "stale"
                result.failed += state == "todo" and (run.folder / "error.txt").is_file()
    if not result.folder.is_dir():
        return result
    records, result.incomplete = plots.load_runs([result.folder])
    metric = plots.FAIRNESS_METRIC[fairness]
    result.records = [
        r
        for r in records
        if r.get("fairness") in (fairness, None)  # None: an algorithm without a fairness notion
    ]
    if not result.records:
        return result
    result.files = _records_files(result.records)
    result.panels = panels_of(result.records, fairness)
    drawn = plots.fairness_figures([r for r in result.records if plots._has(r, metric)])
    result.figures = plots.save_figures(drawn, figures, ("png",))
    for _, fig in drawn:
        fig.clear()
    return result


def _shared_config(records: Sequence[plots.RunRecord]) -> str:
    steffle = [r for r in records if r.method == STEFFLE] or list(records)
    parts = []
    for key in SHOWN_KEYS:
        values = {json.dumps(r.get(key)) for r in steffle}
        if len(values) == 1 and steffle[0].get(key) not in (None, "", 0, 0.0):
            parts.append(f"{key} {_fmt(steffle[0].get(key))}")
    return ", ".join(parts)


def _grid_text(records: Sequence[plots.RunRecord]) -> str:
    by_method: dict[str, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        by_method[r.method].append(r)
    varied = plots.varied_keys(records)
    parts = []
    for method, runs in sorted(by_method.items(), key=lambda kv: (kv[0] != STEFFLE, kv[0])):
        keys = [k for k in varied[method] if k not in ("seed",)]
        grid = "; ".join(
            f"{k} {{{', '.join(_fmt(v) for v in sorted({r.get(k) for r in runs}, key=plots._sort_key))}}}" for k in keys
        )
        seeds = sorted({r.get("seed") for r in runs}, key=plots._sort_key)
        parts.append(f"{method}: {len(runs)} runs ({grid + '; ' if grid else ''}seeds {', '.join(map(str, seeds))})")
    return "; ".join(parts)


def _run_state_text(result: SweepResult) -> str:
    found = len(result.records)
    text = f"{found} completed runs in `{_rel(result.folder)}`"
    if result.expected is not None:
        text += f"; the sweep file has {result.expected} runs, {result.finished} finished"
        if result.failed:
            text += f", {result.failed} failed (error.txt)"
        if result.stale:
            text += f", {result.stale} folders hold a completed run of another configuration"
        missing = result.expected - result.finished - result.failed - result.stale
        if missing:
            text += f", {missing} not run yet"
    if result.incomplete:
        text += f"; {result.incomplete} incomplete result.json skipped"
    if result.problem:
        text += f"; {result.problem}"
    return text + "."


def _rel(path: Path, start: Path | None = None) -> str:
    start = start or Path.cwd()
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def steffle_section(result: SweepResult, doc_dir: Path) -> list[str]:
    """Markdown of one (dataset, fairness) sweep: commands, state, figure, reduction table, mean points."""
    title = f"{plots.DATASET_NAMES.get(result.dataset, result.dataset)}, {plots.FAIRNESS_NAMES[result.fairness]}"
    command = f"{DATA_ENV} silofl sweep {_rel(result.sweep_file, ROOT)}"
    lines = [f"### {title}", ""]
    if not result.records:
        state = f" ({_run_state_text(result)})" if result.folder.is_dir() else ""
        return [*lines, f"Not generated yet: run `{command}`, then `python benchmarks/results.py`{state}.", ""]
    lines += [
        "Commands:",
        "",
        "```bash",
        command,
        "python benchmarks/results.py",
        "```",
        "",
        f"Runs: {_run_state_text(result)} Grid: {_grid_text(result.records)}.",
        "",
        f"SteFFLe's configuration (the same in all its runs): {_shared_config(result.records)}.",
        "",
    ]
    for path in result.figures:
        lines += [f"![{title}: fairness violation vs test error]({_rel(path, doc_dir)})", ""]
    present = [b for b in BASELINES if any(b in p.points for p in result.panels)]
    if not any(STEFFLE in p.points for p in result.panels):
        return [*lines, "No SteFFLe runs in this sweep yet: no reduction to compute.", ""]
    if not present:
        return [*lines, "No baseline runs in this sweep yet: no reduction to compute.", "", *_points_details(result)]
    lines += [
        "Reduction in fairness violation at matched test error, 1 - SteFFLe / baseline (positive: SteFFLe lower), "
        "mean over the baseline's points inside SteFFLe's error range; in brackets matched / all baseline points "
        "(each point the mean over seeds). The last row is the mean over the panels with a matched point.",
        "",
        "| h | epsilon | " + " | ".join(f"vs {b}" for b in present) + " |",
        "|---|---|" + "---|" * len(present),
    ]
    for panel in result.panels:
        cells = [panel.reductions[b].text() if b in panel.reductions else "no runs" for b in present]
        lines.append(f"| {_fmt(panel.h)} | {_fmt(panel.epsilon)} | " + " | ".join(cells) + " |")
    overall = []
    for b in present:
        values = [p.reductions[b].mean for p in result.panels if b in p.reductions]
        found = [v for v in values if v is not None]
        overall.append(f"{_pct(mean_or_none(found))} ({len(found)} of {len(values)} panels)")
    lines += ["| all | all | " + " | ".join(overall) + " |", ""]
    unique = {(p.method, p.label, p.xy): p for panel in result.panels for ps in panel.points.values() for p in ps}
    spread = [p for p in unique.values() if p.seeds > 1]  # a non-private or one-silo point counted once
    if spread:
        error_sd = statistics.median(p.error[1] for p in spread)
        violation_sd = statistics.median(p.violation[1] for p in spread)
        lines += [
            f"Seed spread: the median standard deviation over seeds of a point's test error is {error_sd:.4f}, of "
            f"its violation {violation_sd:.4f} ({len(spread)} points with several seeds); differences in test error "
            "smaller than that decide which baseline points are matched and where.",
            "",
        ]
    claims = [c for c in PAPER_CLAIMS if c.fairness == result.fairness]
    lines += [
        "The paper's claims (over all its datasets): "
        + "; ".join(f"vs {_claim_name(c.baseline)}: {c.text}" for c in claims)
        + ". See [the summary](#summary-against-the-papers-claims).",
        "",
    ]
    lines += _points_details(result)
    return lines


# -- SteFFLe with the sensitive attributes held apart (issues 18 and 31, ../shared/specs/steffle-hybrid.md) -------

#: The first version's topology comparison (issue 18): frozen history, never regenerated (:func:`topology_history`).
#: Its runs sent rows (id, y, F(x_i), J_F(x_i)) through the server (options `share-rows` and `keep-rate`, removed in
#: issue 31), so neither its sweep file (benchmarks/sweeps/history/steffle_adult_topologies.toml) nor its result.json
#: files validate against this version; they rerun at silofl commit :data:`HISTORY_COMMIT`.
TOPOLOGY_HEADING = "## SteFFLe with separate sensitive parties: silos, divided, central-sensitive"
#: The last silofl commit with the first version's options (the one before their removal).
HISTORY_COMMIT = "cc0e2f6"
MU2_HEADING = "## DP-mu2-FL: the paper's Tables 1 and 2 (MNIST)"
#: The sealed-records sweep (issue 31, the spec's "Revision"): the parties' protocol against silos.
SEALED_SWEEP = ("steffle_adult_sealed", "adult", "dp")
SEALED_HEADING = "## SteFFLe with separate sensitive parties, sealed records (the default)"
SEALED_INTRO = (
    "The parties' protocol since issue 31 (the second version of ../shared/specs/steffle-hybrid.md; the first "
    "version's row modes, the previous section, are removed): at setup each feature party sends each sensitive party "
    "the (pseudonym, features, label) of the records whose sensitive attribute it holds, encrypted end to end (the "
    "server relays bytes it cannot read); each round a sensitive party computes F and J_F from the broadcast model on "
    "its own secret Poisson sample at the silos' rate q = m / (n / N), and sends noised means: the silos' amplified "
    "mechanism. The server sees the model, W, means, counts and sealed bytes, no record id, feature, label, output or "
    "Jacobian (SECURITY.md: what each party learns over a run). Same base as the previous section (3 parties, 40 "
    "epochs, batch 256); bytes and time per round against silos: `benchmarks/steffle_parties.py` "
    "(benchmarks/README.md)."
)


def noise_on_h(folder: Path) -> float | None:
    """The std per coordinate of the noise on the server's h_theta in one round (the fairness gradient that enters
    theta's step as lambda h), from a run's result.json: silos: sqrt(sum_j (w_j sigma_j C / (q_j n_j))^2), w_j = n_j/n
    (each silo's noised sum over its own sample divided by q_j n_j, averaged with weights w_j); separate parties:
    sqrt(sum_c sigma_c^2) C / (q n), each sensitive party's noised sum over its own sample at the silos' rate q
    divided by q n (its mean weighted n_c / n), n the feature parties' records. None for a non-private run or one
    without the fairness term."""
    result = _read_json(folder / "result.json")
    config, privacy = result.get("config") or {}, result.get("privacy") or {}
    per = list((privacy.get("per_silo") or {}).values())
    if not per or float(config.get("lambda", 0)) == 0 or not math.isfinite(float(privacy.get("epsilon_target", 0))):
        return None
    clip = float(config.get("clip", 1.0))
    if str(config.get("topology", "silos")) == "silos":
        n = sum(p["n_train"] for p in per)
        return clip * math.sqrt(
            sum((p["n_train"] / n * p["noise_multiplier"] / (p["sampling_rate"] * p["n_train"])) ** 2 for p in per)
        )
    n = sum(f["n_train"] for f in (result.get("federation") or {}).get("silos") or [])
    return clip * math.sqrt(sum(p["noise_multiplier"] ** 2 for p in per)) / (per[0]["sampling_rate"] * n)


def _section_runs(folder: Path, sweep_file: Path, metric: str) -> tuple[list[plots.RunRecord], RunFiles, str]:
    """The completed runs of a one-sweep section (those with an error and `metric`), their files, and a sentence on
    their state against the sweep file (how many it has, how many finished)."""
    records, incomplete = plots.load_runs([folder])
    records = [r for r in records if plots._has(r, "error") and plots._has(r, metric)]
    return records, _records_files(records), sweep_state_text(folder, sweep_file, len(records), incomplete)


def sweep_state_text(folder: Path, sweep_file: Path, found: int, incomplete: int) -> str:
    """A sentence on a section's runs against its sweep file: how many completed runs were read, how many incomplete
    ones skipped, how many runs the sweep file has and how many of them finished."""
    from server.sweep import SweepError, load_sweep, run_state

    state = f"{found} completed runs in `{_rel(folder)}`" + (f", {incomplete} incomplete skipped" if incomplete else "")
    try:
        expected = load_sweep(sweep_file, out=folder).runs
        done = sum(run_state(run) == "finished" for run in expected)
        state += f"; the sweep file has {len(expected)} runs, {done} finished"
    except (SweepError, OSError, ValueError) as exc:
        state += f"; the sweep file does not load: {exc}"
    return state


def topology_history(document: str) -> list[str]:
    """The first version's topology section as `document` (the existing docs/RESULTS.md, "" if none) has it,
    verbatim: its runs used options removed since (:data:`TOPOLOGY_HEADING`), so it is history, never regenerated.
    Without it, a line saying where it is."""
    section = section_lines(document, TOPOLOGY_HEADING)
    if section:
        return section
    return [
        TOPOLOGY_HEADING,
        "",
        "The first version's measurements (rows through the server, removed in issue 31) are history: see "
        f"docs/RESULTS.md at silofl commit `{HISTORY_COMMIT}`, where its sweep file reruns.",
        "",
    ]


def sealed_section(sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path) -> tuple[list[str], RunFiles]:
    """Markdown of the sealed-records comparison (silos, divided, central-sensitive): its figure, and per (epsilon,
    method, batch, lambda) the error, violation, the noise each topology puts on h and the seconds per round (each
    mean ± sd over seeds)."""
    name, dataset, fairness = SEALED_SWEEP
    folder, sweep_file = sweeps / name, sweep_files / f"{name}.toml"
    command = f"{DATA_ENV} silofl sweep {_rel(sweep_file, ROOT)}"
    lines = [SEALED_HEADING, "", SEALED_INTRO, ""]
    if not folder.is_dir():
        return [*lines, f"Not generated yet: run `{command}`, then `python benchmarks/results.py`.", ""], RunFiles()
    metric = plots.FAIRNESS_METRIC[fairness]
    records, files, state = _section_runs(folder, sweep_file, metric)
    lines += ["Commands:", "", "```bash", command, "python benchmarks/results.py --only sealed", "```", ""]
    lines += [f"Runs: {state}. Grid: {_grid_text(records)}.", ""]
    if not records:
        return lines, files
    drawn = [(f"sealed-{plots._slug(dataset, fairness)}", fig) for _, fig in plots.fairness_figures(records)]
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![SteFFLe topologies: fairness violation vs test error]({_rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    lines += [
        f"Test error and {plots.METRIC_LABELS[metric]} (mean ± sd over seeds); noise on h: the std per coordinate "
        "of the noise on the server's fairness gradient h_theta in one round (`noise_on_h`: the silos' or the "
        "sensitive parties' noise multipliers sigma, times C, over the records the sum is divided by), the cost "
        "each topology pays for its privacy; sensitive-side sigma and its sampling rate; seconds per round of the "
        "run on the in-process engine (`timing.seconds_per_round`, two runs at a time on 2 cores).",
        "",
        "| epsilon | method | batch | lambda | seeds | test error | violation | noise on h | sigma (rate) | s/round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        groups[(r.epsilon, r.method, plots._float(r.get("lambda")))].append(r)
    order = {m: i for i, m in enumerate(dict.fromkeys(r.method for r in records))}
    curves: dict[tuple, list[tuple[Point, float | None]]] = defaultdict(list)  # (eps, method, topology, batch)
    for (eps, method, lam), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])):
        error = plots.mean_sd([r.final["error"] for r in runs])
        violation = plots.mean_sd([r.final[metric] for r in runs])
        noise = [v for r in runs if (v := noise_on_h(r.folder)) is not None]
        results = [_read_json(r.folder / "result.json") for r in runs]
        per = list(((results[0].get("privacy") or {}).get("per_silo") or {}).values())
        sigma = f"{per[0]['noise_multiplier']:.3g} ({per[0]['sampling_rate']:.3g})" if per and lam > 0 else "-"
        seconds = plots.mean_sd([float(res["timing"]["seconds_per_round"]) for res in results])
        batch = _fmt(runs[0].get("batch-size"))
        noise_text = f"{statistics.mean(noise):.4f}" if noise else "-"
        lines.append(
            f"| {_fmt(eps)} | {method} | {batch} | {_fmt(lam)} | {len(runs)} | {error[0]:.4f} ± {error[1]:.4f} | "
            f"{violation[0]:.4f} ± {violation[1]:.4f} | {noise_text} | {sigma} | {seconds[0]:.3f} |"
        )
        curves[(eps, method, _topology(runs[0]), batch)].append(
            ((error[0], violation[0]), statistics.mean(noise) if noise else None)
        )
    lines += ["", *_topology_summary(curves), *_same_seed_text(records, metric)]
    return [*lines, ""], files


def _topology(record: plots.RunRecord) -> str:
    """A run's topology (runs on silos may not record one)."""
    return str(record.get("topology") or "silos")


def _topology_summary(curves: Mapping[tuple, list[tuple[Point, float | None]]]) -> list[str]:
    """Per epsilon and curve with separate parties: its noise on h against the silos' at the same batch size, and the
    silos' violation at the same test error (:func:`matched_error_reduction` with the silos as the reference curve:
    positive = the silos' violation is lower)."""
    lines = [
        "What each topology pays, per epsilon: the mean noise on h over the curve's points against the silos' at the "
        "same batch size, and the silos' violation at the curve's test errors (`matched_error_reduction` with the "
        "silos' curve as the reference: positive = the silos reach a lower violation at the same error; in brackets "
        "the curve's points matched inside the silos' error range).",
        "",
        "| epsilon | method | batch | noise on h | x silos | silos' violation at the same error |",
        "|---|---|---|---|---|---|",
    ]
    for (eps, method, topology, batch), points in curves.items():
        if topology == "silos":
            continue  # the reference
        silos = next((p for (e, _, t, b), p in curves.items() if (e, t, b) == (eps, "silos", batch)), [])
        base = [n for _, n in silos if n is not None]
        noise = [n for _, n in points if n is not None]
        mean = statistics.mean(noise) if noise else None
        ratio = f"{mean / statistics.mean(base):.1f}" if mean is not None and base else "-"
        reduction = matched_error_reduction([p for p, _ in silos], [p for p, _ in points])
        lines.append(
            f"| {_fmt(eps)} | {method} | {batch} | {'-' if mean is None else f'{mean:.4f}'} | {ratio} | "
            f"{reduction.text('the silos') if silos else 'no silos runs'} |"
        )
    return [*lines, ""]


def _same_seed_text(records: Sequence[plots.RunRecord], metric: str) -> list[str]:
    """Per method with separate parties: how many of its runs give exactly the test error and violation of the silos'
    run with the same seed, epsilon, lambda and batch (the same mechanism and random streams give the same numbers)."""
    keys = ("seed", "epsilon", "lambda", "batch-size")
    silos = {tuple(_fmt(r.get(k)) for k in keys): r for r in records if _topology(r) == "silos"}
    lines = []
    for method in dict.fromkeys(r.method for r in records if _topology(r) != "silos"):
        pairs = [
            (r, silos[key])
            for r in records
            if r.method == method and (key := tuple(_fmt(r.get(k)) for k in keys)) in silos
        ]
        if not pairs:
            continue
        same = sum(r.final["error"] == s.final["error"] and r.final[metric] == s.final[metric] for r, s in pairs)
        gap = max(abs(r.final[metric] - s.final[metric]) for r, s in pairs)
        lines.append(
            f"- `{method}`: {same} of its {len(pairs)} runs give exactly the test error and violation of the silos' "
            f"run with the same seed, epsilon, lambda and batch (largest violation difference {gap:.4f})."
        )
    if lines:
        lines = ["Same seed, same numbers?", "", *lines, ""]
    return lines


#: The number-of-silos sweep (the SteFFLe paper's Figure 2 c, d): (sweep file stem = run folder, dataset, notion).
SILOS_SWEEP = ("steffle_credit_silos", "credit", "dp")
SILOS_HEADING = "## SteFFLe against the number of silos (Credit Card, epsilon 1)"
#: The lambdas whose error and violation the figure against N draws (the sweep has more; the table has them all).
SILOS_LAMBDAS = (0.0, 1.0, 4.0)


def silos_figure(records: Sequence[plots.RunRecord], metric: str) -> Any:
    """Test error and violation (mean ± sd over seeds) against the number of silos N, one line per (h, lambda):
    the paper's claim is about how both move with N at fixed total data."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), constrained_layout=True)
    hs = sorted({plots._float(r.get("heterogeneity")) for r in records if int(r.get("num-silos")) > 1})
    styles = {0.0: "-", 0.75: "--"}
    colors = dict(zip(SILOS_LAMBDAS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for h in hs:
        for lam in SILOS_LAMBDAS:
            by_n: dict[int, list[plots.RunRecord]] = defaultdict(list)
            for r in records:
                n = int(r.get("num-silos"))
                if plots._float(r.get("lambda")) == lam and (n == 1 or plots._float(r.get("heterogeneity")) == h):
                    by_n[n].append(r)
            ns = sorted(by_n)
            if not ns:
                continue
            for ax, key in zip(axes, ("error", metric), strict=True):
                stats = [plots.mean_sd([r.final[key] for r in by_n[n]]) for n in ns]
                ax.errorbar(
                    ns,
                    [m for m, _ in stats],
                    yerr=[sd for _, sd in stats],
                    color=colors[lam],
                    linestyle=styles.get(h, ":"),
                    marker="o",
                    markersize=3,
                    capsize=2,
                    label=f"h {_fmt(h)}, λ {_fmt(lam)}",
                )
    for ax, key in zip(axes, ("error", metric), strict=True):
        ax.set_xlabel("number of silos N (same total data)")
        ax.set_ylabel("test error" if key == "error" else plots.METRIC_LABELS[metric])
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle("SteFFLe on Credit Card, epsilon 1: against the number of silos (mean ± sd over seeds)", fontsize=10)
    return fig


def silos_section(sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path) -> tuple[list[str], RunFiles]:
    """Markdown of the number-of-silos comparison (the SteFFLe paper's Figure 2 c, d): the violation-vs-error curves
    per N, error and violation against N, and per (h, N, lambda) the means ± sd over seeds with each silo's noise."""
    name, dataset, fairness = SILOS_SWEEP
    folder, sweep_file = sweeps / name, sweep_files / f"{name}.toml"
    command = f"{DATA_ENV} silofl sweep {_rel(sweep_file, ROOT)}"
    lines = [
        SILOS_HEADING,
        "",
        "The SteFFLe paper's Figure 2 (c, d): Credit Card, demographic parity, epsilon 1, N in {1, 2, 3, 6, 9, 12} "
        "silos holding the same records between them (Algorithm 3 on age, h in {0, 0.75}; with N = 1 there is one "
        'block and h does not apply), lambda swept. The paper (Section 5.2): "as the number of silos increases from '
        '1 to 12, both demographic parity violation rise and misclassification error grows". Every run makes the '
        "same number of record visits (40 epochs of the mean silo: 3,750 rounds with one silo, about 313 with 12); "
        "each silo noises its own sums (inter-silo record-level DP), so with N silos each noised sum covers n/N "
        "records and its noise weighs N times more against the signal.",
        "",
    ]
    if not folder.is_dir():
        return [*lines, f"Not generated yet: run `{command}`, then `python benchmarks/results.py`.", ""], RunFiles()
    metric = plots.FAIRNESS_METRIC[fairness]
    records, files, state = _section_runs(folder, sweep_file, metric)
    lines += ["Commands:", "", "```bash", command, "python benchmarks/results.py --only silos", "```", ""]
    lines += [f"Runs: {state}. Grid: {_grid_text(records)}.", ""]
    if not records:
        return lines, files
    drawn = [(f"silos-{plots._slug(dataset, fairness)}", fig) for _, fig in plots.fairness_figures(records)]
    drawn.append((f"silos-against-n-{plots._slug(dataset, fairness)}", silos_figure(records, metric)))
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![SteFFLe against the number of silos]({_rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    lines += [
        f"Test error and {plots.METRIC_LABELS[metric]} (mean ± sd over seeds); sigma: the noise multiplier of each "
        "silo's fairness release (silo 0's; the silos of one run hold about n/N records each), q its sampling rate; "
        "s/round on the in-process engine.",
        "",
        "| h | N | lambda | seeds | test error | violation | sigma (q) | s/round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        n = int(r.get("num-silos"))
        h = 0.0 if n == 1 else plots._float(r.get("heterogeneity"))
        groups[(h, n, plots._float(r.get("lambda")))].append(r)
    summary: dict[tuple[float, int], dict[float, tuple[float, float]]] = defaultdict(dict)
    spreads: list[float] = []
    for (h, n, lam), runs in sorted(groups.items()):
        error = plots.mean_sd([r.final["error"] for r in runs])
        violation = plots.mean_sd([r.final[metric] for r in runs])
        results = [_read_json(r.folder / "result.json") for r in runs]
        per = list(((results[0].get("privacy") or {}).get("per_silo") or {}).values())
        sigma = f"{per[0]['noise_multiplier']:.3g} ({per[0]['sampling_rate']:.3g})" if per else "-"
        seconds = plots.mean_sd([float(res["timing"]["seconds_per_round"]) for res in results])
        lines.append(
            f"| {_fmt(h) if n > 1 else '-'} | {n} | {_fmt(lam)} | {len(runs)} | {error[0]:.4f} ± {error[1]:.4f} | "
            f"{violation[0]:.4f} ± {violation[1]:.4f} | {sigma} | {seconds[0]:.4f} |"
        )
        summary[(h, n)][lam] = (error[0], violation[0])
        spreads.append(violation[1])
    lines += ["", *_silos_summary(summary), *_silos_conclusion(summary, spreads), ""]
    return lines, files


def _silos_conclusion(
    summary: Mapping[tuple[float, int], Mapping[float, tuple[float, float]]], spreads: Sequence[float]
) -> list[str]:
    """What the runs say about the paper's claim, computed: per h, the error and the violation at lambda 0 with one
    silo and with the most silos, and whether the violation's range over N exceeds its typical seed spread."""
    if not spreads:
        return []
    typical = statistics.median(spreads)
    parts = []
    for h in sorted({h for h, n in summary if n > 1}):
        rows = {n: v for (hh, n), v in summary.items() if n == 1 or hh == h}
        base = {n: v[0.0] for n, v in rows.items() if 0.0 in v}
        if len(base) < 2:
            continue
        first, last = min(base), max(base)
        violations = [v for _, v in base.values()]
        spread = max(violations) - min(violations)
        parts.append(
            f"h {_fmt(h)}: error {base[first][0]:.4f} with {first} silo{'s' if first > 1 else ''} and "
            f"{base[last][0]:.4f} with {last} ({'grows' if base[last][0] > base[first][0] else 'does not grow'}); "
            f"violation between {min(violations):.4f} and {max(violations):.4f} over N, a range "
            f"{'within' if spread <= typical else 'beyond'} the typical seed sd ({typical:.4f})"
        )
    if not parts:
        return []
    return ["", "At lambda 0 (computed from the table): " + "; ".join(parts) + "."]


def _silos_summary(summary: Mapping[tuple[float, int], Mapping[float, tuple[float, float]]]) -> list[str]:
    """Per h: error and violation without the fairness term (lambda 0), and the lowest violation over lambda with
    its error, against N."""
    lines = [
        "Per h and N: test error and violation at lambda 0 (no fairness term), and the lowest mean violation over "
        "lambda with the error it comes with (N = 1 is the same run for both h):",
        "",
        "| h | N | error, lambda 0 | violation, lambda 0 | lowest violation (lambda) | its error |",
        "|---|---|---|---|---|---|",
    ]
    ones = {n: v for (h, n), v in summary.items() if n == 1}
    for h in sorted({h for h, n in summary if n > 1}):
        rows = {**ones, **{n: v for (hh, n), v in summary.items() if hh == h and n > 1}}
        for n, by_lam in sorted(rows.items()):
            base = by_lam.get(0.0)
            lam, (err, vio) = min(by_lam.items(), key=lambda kv: kv[1][1])
            lines.append(
                f"| {_fmt(h)} | {n} | {f'{base[0]:.4f}' if base else '-'} | {f'{base[1]:.4f}' if base else '-'} | "
                f"{vio:.4f} ({_fmt(lam)}) | {err:.4f} |"
            )
    return lines


def _section_span(lines: Sequence[str], heading: str) -> tuple[int, int] | None:
    """Where the `heading` section of a document's `lines` starts and ends (up to the next heading of the same level
    or above), or None if it has none."""
    level = len(heading.split(" ", 1)[0])
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        return None

    def ends_it(line: str) -> bool:  # a heading of the same level or above
        marks = len(line) - len(line.lstrip("#"))
        return 0 < marks <= level and line[marks : marks + 1] == " "

    return start, next((i for i in range(start + 1, len(lines)) if ends_it(lines[i])), len(lines))


def section_lines(document: str, heading: str) -> list[str]:
    """The lines of `document`'s `heading` section as it stands (its subsections included; [] if it has none)."""
    lines = document.splitlines()
    span = _section_span(lines, heading)
    return lines[span[0] : span[1]] if span else []


def replace_section(document: str, heading: str, section: Sequence[str], before: str) -> str:
    """`document` with its `heading` section (up to the next heading of the same level or above) replaced by
    `section`, or with `section` inserted before the heading `before` (at the end if that is missing too)."""
    text = "\n".join(section).rstrip() + "\n\n"
    lines = document.splitlines(keepends=True)
    span = _section_span(lines, heading)
    if span:
        return "".join(lines[: span[0]]) + text + "".join(lines[span[1] :])
    at = next((i for i, line in enumerate(lines) if line.rstrip("\n") == before), len(lines))
    return "".join(lines[:at]) + text + "".join(lines[at:])


def _claim_name(baseline: str) -> str:
    return {"tran": "Tran et al.", "fedfdp": "FedFDP"}.get(baseline, baseline)


def _points_details(result: SweepResult) -> list[str]:
    metric = plots.METRIC_LABELS[plots.FAIRNESS_METRIC[result.fairness]]
    lines = [
        "<details><summary>Mean points per panel (the numbers behind the figure and the table)</summary>",
        "",
        f"Test error and {metric}, mean ± sd over seeds; SteFFLe's Pareto-front points are marked *front*; for a "
        "baseline point, SteFFLe's interpolated violation at the same error and the reduction.",
        "",
        "| h | epsilon | method | point | seeds | test error | violation | SteFFLe at this error | reduction |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for panel in result.panels:
        steffle = panel.steffle_points()
        front = set(pareto_front(steffle))
        order = [STEFFLE, *BASELINES, *sorted(set(panel.points) - {STEFFLE, *BASELINES})]
        for method in order:
            for p in panel.points.get(method, []):
                if method == STEFFLE:
                    at, red = ("front" if p.xy in front else ""), ""
                else:
                    env = lower_envelope(steffle, p.error[0])
                    at = "outside range" if env is None else f"{env:.4f}"
                    red = "" if env is None or p.violation[0] <= 0 else _pct(1 - env / p.violation[0])
                lines.append(
                    f"| {_fmt(panel.h)} | {_fmt(panel.epsilon)} | {method} | {p.label} | {p.seeds} | "
                    f"{p.error[0]:.4f} ± {p.error[1]:.4f} | {p.violation[0]:.4f} ± {p.violation[1]:.4f} | {at} | "
                    f"{red} |"
                )
    return [*lines, "", "</details>", ""]


SUMMARY_HEADING = "### Summary against the paper's claims"


def summary_section(results: Sequence[SweepResult]) -> list[str]:
    """The reductions over all datasets (mean over every (dataset, h, epsilon) panel with a matched point) next to
    the paper's claims."""
    lines = [
        SUMMARY_HEADING,
        "",
        "The paper averages over all its datasets (Adult, Retired Adult and Credit Card for demographic parity; Credit "
        "Card for equalized odds), epsilon and h. Here: the mean of the per-panel reductions over every (dataset, h, "
        "epsilon) panel of the sweeps found with at least one matched baseline point.",
        "",
        "| fairness | baseline | silofl: reduction at matched test error | panels (matched / all) | datasets | paper |",
        "|---|---|---|---|---|---|",
    ]
    for fairness in ("dp", "eo"):
        done = [r for r in results if r.fairness == fairness and r.panels]
        for baseline in BASELINES:
            claim = next((c for c in PAPER_CLAIMS if c.fairness == fairness and c.baseline == baseline), None)
            paper = (f"{100 * claim.reduction:.2f}%" if claim.reduction is not None else claim.text) if claim else "-"
            name = plots.FAIRNESS_NAMES[fairness]
            values, datasets = [], []
            for r in done:
                vals = [p.reductions[baseline].mean for p in r.panels if baseline in p.reductions]
                values += vals
                if any(v is not None for v in vals):
                    datasets.append(plots.DATASET_NAMES.get(r.dataset, r.dataset))
            found = [v for v in values if v is not None]
            names = " and ".join(
                f"`silofl sweep benchmarks/sweeps/{n}.toml`" for n, _, f in STEFFLE_SWEEPS if f == fairness
            )
            value = _pct(mean_or_none(found)) if done else f"not generated yet: run {names}"
            lines.append(
                f"| {name} | {baseline} | {value} | {len(found)} / {len(values)} | {', '.join(datasets) or '-'} | "
                f"{paper} |"
            )
    return [*lines, ""]


def method_section() -> list[str]:
    return [
        "### How the reduction at matched test error is computed",
        "",
        'The paper says only this about its headline numbers (Section 5, "Average results"):',
        "",
        f"> {PAPER_METHOD_QUOTE}",
        "",
        f'and in its introduction: "{PAPER_INTRO_QUOTE}" It does not say how the accuracy levels are matched. '
        "`benchmarks/results.py` (`matched_error_reduction`) uses the standard choice, panel by panel (one dataset, "
        "fairness notion, h and epsilon; non-private and one-silo baselines appear in every panel, as in the "
        "figures):",
        "",
        "1. every configuration is one point: the mean over seeds of its test error and fairness violation (SteFFLe: "
        "one point per lambda; Tran et al.: one per dual step; FedAvg and DP-FedSGD: one point);",
        "2. SteFFLe's trade-off curve is the lower envelope of its points: the Pareto front (points no other "
        "SteFFLe point beats in both error and violation), linearly interpolated between front points and flat "
        "after the last one (the lowest violation SteFFLe reaches at that error or less);",
        "3. each baseline point whose test error e lies inside SteFFLe's error range (from its smallest to its "
        "largest mean error) is matched: reduction = 1 - v_SteFFLe(e) / v_baseline (negative when SteFFLe's "
        "violation is higher); points outside the range are not matched (no extrapolation), so a baseline more "
        "accurate than every SteFFLe point (often FedAvg and FERMI) has no number;",
        "4. a panel's reduction is the mean over its matched points; the tables give matched / all points.",
        "",
    ]


# -- DP-mu2-FL --------------------------------------------------------------------------------------------------------

_CELL_NAME = re.compile(
    r"^(?P<algorithm>mu2fl|noisy-sgd)-(?P<trust>untrusted|trusted)-rho(?P<rho>[^-]+)-M(?P<silos>\d+)"
    r"-b(?P<batch>\d+)-s(?P<seed>\d+)(?:-(?P<partition>.+))?\.json$"
)


def _load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mu2_cells_from_cache(folder: Path) -> list[dict[str, Any]]:
    """The IID, batch-1 cells benchmarks/mu2_tables.py cached in `folder` (one JSON per cell and seed)."""
    cells = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        match = _CELL_NAME.match(path.name)
        if not match or match["partition"] or int(match["batch"]) != 1:
            continue
        cell = _read_json(path)
        if not {"loss", "accuracy", "rho", "silos", "trust", "algorithm"} <= cell.keys():
            continue
        cells.append(dict(cell, seed=int(match["seed"]), partition="iid", source=path))
    return cells


def mu2_cells_from_runs(records: Sequence[plots.RunRecord]) -> list[dict[str, Any]]:
    """Cells (as benchmarks/mu2_tables.py's) from the result.json files of the mu2_mnist sweep."""
    cells = []
    for r in records:
        if not plots.in_plot(r, "mu2") or not plots._has(r, "accuracy"):
            continue
        if r.get("partition") not in (None, "iid") or int(r.get("batch-size") or 1) != 1:
            continue
        rho = plots._float(r.get("rho") or 0.0)
        privacy = _read_json(r.folder / "result.json").get("privacy") or {}
        cells.append(
            {
                "algorithm": r.get("algorithm"),
                "trust": r.get("trust"),
                "rho": rho if rho > 0 else math.inf,
                "silos": int(r.get("num-silos")),
                "loss": r.final.get("loss"),
                "accuracy": r.final["accuracy"],
                "epsilon": privacy.get("epsilon_spent", "inf"),
                "seed": int(r.get("seed") or 0),
                "partition": "iid",
                "source": r.folder,
            }
        )
    return cells


def mu2_records(cells: Sequence[dict[str, Any]]) -> list[plots.RunRecord]:
    """The cells as RunRecords for `plots.mu2_figures` (a cached cell has no run folder: its file stands in)."""
    return [
        plots.RunRecord(
            Path(c["source"]),
            c["algorithm"],
            {
                "algorithm": c["algorithm"],
                "dataset": "mnist",
                "partition": "iid",
                "trust": c["trust"],
                "rho": c["rho"] if math.isfinite(c["rho"]) else 0.0,
                "num-silos": c["silos"],
                "epsilon": "inf",
                "seed": c["seed"],
            },
            {"accuracy": c["accuracy"], "loss": c["loss"]},
        )
        for c in cells
    ]


def mu2_section(
    sweeps: Path, cache: Path, figures: Path, doc_dir: Path, sweep_files: Path
) -> tuple[list[str], RunFiles]:
    """The DP-mu2-FL tables (Tables 1 and 2 of the paper next to silofl's cells) and the figure.

    Source: the mu2_mnist sweep's run folders when all its runs are finished, else benchmarks/mu2_tables.py's cell
    cache (the source of docs/results/mu2_tables.md and docs/results/mu2_seeds.md), else whatever the sweep has
    finished."""
    tables = _load_module("silofl_mu2_tables", ROOT / "benchmarks" / "mu2_tables.py")
    folder = sweeps / "mu2_mnist"
    records, _ = plots.load_runs([folder]) if folder.is_dir() else ([], 0)
    expected = None
    if (sweep_files / "mu2_mnist.toml").is_file():
        from server.sweep import load_sweep

        expected = len(load_sweep(sweep_files / "mu2_mnist.toml", out=folder).runs)
    sweep_cells = mu2_cells_from_runs(records)
    cache_cells = mu2_cells_from_cache(cache)
    files = RunFiles()
    lines = [MU2_HEADING, ""]
    sweep_command = f"{DATA_ENV} silofl sweep {_rel(sweep_files / 'mu2_mnist.toml', ROOT)}"
    if sweep_cells and (expected is None or len(records) >= expected or not cache_cells):
        cells, source = sweep_cells, f"the run folders of `{_rel(folder)}` ({len(records)} completed runs"
        source += f" of the sweep file's {expected})" if expected is not None else ")"
        commands = [sweep_command]
        files = _records_files(records)
    elif cache_cells:
        cells = cache_cells
        source = (
            f"the cells benchmarks/mu2_tables.py cached in `{_rel(cache)}` ({len(cells)} cells: every IID, batch-1 "
            "cell and seed found; the same computations as docs/results/mu2_tables.md and docs/results/mu2_seeds.md)"
        )
        commands = [
            f"{DATA_ENV} python benchmarks/mu2_tables.py --out docs/results/mu2_tables.md",
            f"{DATA_ENV} python benchmarks/mu2_tables.py --silos 100 --rhos 4,8 --trusts untrusted --seeds 0,1,2,3 "
            "--skip-non-private --algorithms mu2fl --out docs/results/mu2_seeds.md",
        ]
        for c in cells:
            files.add(c.get("seconds"), None)
        if folder.is_dir():
            source += f"; the mu2_mnist sweep has {len(records)} of {expected} runs finished, not used yet"
    else:
        return [
            *lines,
            f"Not generated yet: run `{sweep_command}` (or `{DATA_ENV} python benchmarks/mu2_tables.py`), then "
            "`python benchmarks/results.py`.",
            "",
        ], files
    lines += ["Commands:", "", "```bash", *commands, "python benchmarks/results.py", "```", ""]
    lines += [
        f"Source: {source}.",
        "",
        "Each cell: test loss / accuracy of the last averaged iterate x_T (mean over the seeds found, with the "
        "accuracy's sd and range when there are several), the paper's cell and the gap (loss, accuracy points; "
        "MISS when outside the target of 0.01 loss and 1.5 points); `eps`: the largest epsilon the silos' ledgers "
        "report (untrusted server). The noisy-SGD rows are the baseline at the same rho (not in the paper). "
        "MNIST, IID silos, one pass (T = 60,000 / M rounds of b = 1 record per silo), delta = 1e-5.",
        "",
    ]
    silos = sorted({c["silos"] for c in cells})
    rhos = sorted({c["rho"] for c in cells if math.isfinite(c["rho"])})
    within = compared = 0
    for trust in ("untrusted", "trusted"):
        title = "Table 1: untrusted server" if trust == "untrusted" else "Table 2: trusted server"
        lines += [f"### {title}", "", "| rho | " + " | ".join(f"M = {m}" for m in silos) + " |"]
        lines.append("|---|" + "---|" * len(silos))
        rows = [("mu2fl", rho) for rho in [*rhos, math.inf]] + [("noisy-sgd", rho) for rho in rhos]
        for algorithm, rho in rows:
            label = _fmt(rho) if math.isfinite(rho) else "non-private"
            row = [label if algorithm == "mu2fl" else f"noisy SGD, {label}"]
            for m in silos:
                found = [
                    c
                    for c in cells
                    if c["algorithm"] == algorithm
                    and c["rho"] == rho
                    and c["silos"] == m
                    and (c["trust"] == trust or not math.isfinite(rho))
                ]
                if not found:
                    row.append("-")
                    continue
                paper = tables.PAPER[trust].get((rho, m)) if algorithm == "mu2fl" and math.isfinite(rho) else None
                text, good = tables._cell_text(found, paper, trust == "untrusted" and math.isfinite(rho))
                if paper is not None:
                    compared += 1
                    within += good
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += [f"DP-mu2-FL cells within the target of the paper's: {within} of {compared}.", ""]
    drawn = plots.mu2_figures(mu2_records(cells))
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![DP-mu2-FL accuracy]({_rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    return lines, files


# -- FedSC ------------------------------------------------------------------------------------------------------------

_FEDSC_FOLDER = re.compile(r"^(?P<method>fedavg-sc|fedsc-dp|fedsc)-")
#: The FedSC paper's CIFAR-10, 10 clients x 1 class (Table 2 and its DP paragraph), linear-probe accuracy %.
FEDSC_PAPER = {"fedavg-sc": 77.82, "fedsc": 80.06, "fedsc-dp": 79.42}


def fedsc_records(sweeps: Path, fallback: Path) -> tuple[list[plots.RunRecord], Path, bool]:
    """The FedSC runs: the fedsc_fmnist sweep's folders if it has completed runs, else benchmarks/fedsc_fmnist.py's
    run folders (method named from the folder: fedavg-sc-..., fedsc-..., fedsc-dp-...). (records, folder, is_sweep)"""
    folder = sweeps / "fedsc_fmnist"
    if folder.is_dir():
        records, _ = plots.load_runs([folder])
        records = [r for r in records if r.get("algorithm") in ("fedsc", "fedavg-sc")]
        if records:
            return records, folder, True
    if not fallback.is_dir():
        return [], fallback, False
    records, _ = plots.load_runs([fallback])
    out = []
    for r in records:
        match = _FEDSC_FOLDER.match(r.folder.name)
        if match and r.get("algorithm") in ("fedsc", "fedavg-sc"):
            out.append(plots.RunRecord(r.folder, match["method"], r.config, r.final))
    return out, fallback, False


def fedsc_configurations(records: Sequence[plots.RunRecord]) -> dict[tuple, list[plots.RunRecord]]:
    """The runs grouped by the benchmark flags that shape them (benchmarks/fedsc_fmnist.py's RUN_FLAGS)."""
    bench = _load_module("silofl_fedsc_fmnist", ROOT / "benchmarks" / "fedsc_fmnist.py")
    defaults = vars(bench.build_parser().parse_args([]))
    groups: dict[tuple, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        key = []
        for name, flag in bench.RUN_FLAGS.items():
            default = defaults[flag.lstrip("-").replace("-", "_")]
            value = r.get(name)
            key.append((flag, default if value is None else type(default)(value), default))
        groups[tuple(key)].append(r)
    return dict(sorted(groups.items(), key=lambda item: [v for _, v, _ in item[0]]))


def _fedsc_command(key: tuple) -> str:
    flags = " ".join(f"{flag} {_flag_value(value)}" for flag, value, default in key if value != default)
    return f"{DATA_ENV} python benchmarks/fedsc_fmnist.py" + (f" {flags}" if flags else "")


def _flag_value(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _fedsc_label(key: tuple) -> str:
    v = {flag: value for flag, value, _ in key}
    local = f"{v['--local-steps']:g} step" if v.get("--local-steps") else f"{v['--local-epochs']:g} epochs"
    label = (
        f"{v['--rounds']:g} rounds x {local}, {v['--records']:g} img/silo, "
        f"batch {v['--batch-size']:g}, alpha {v['--alpha-start']:g} -> {v['--alpha-end']:g}"
    )
    if v.get("--server-optimizer", "avg") != "avg":
        label += f", server {v['--server-optimizer']} lr {v['--server-lr']:g}"
    if v.get("--calr-sampling-rate", 1.0) < 1.0:
        label += f", DP-CalR on {v['--calr-sampling-rate']:g} of the records"
    return label


def fedsc_section(
    sweeps: Path, fallback: Path, figures: Path, doc_dir: Path, sweep_files: Path
) -> tuple[list[str], RunFiles]:
    """FedSC vs FedAvg+SC (linear probe, kNN, epsilon spent) per number of rounds, and the figure."""
    records, folder, is_sweep = fedsc_records(sweeps, fallback)
    lines = ["## FedSC vs FedAvg+SC (Fashion-MNIST, 10 silos x 1 class, CPU scale)", ""]
    sweep_command = f"{DATA_ENV} silofl sweep {_rel(sweep_files / 'fedsc_fmnist.toml', ROOT)}"
    if not records:
        return [
            *lines,
            f"Not generated yet: run `{sweep_command}`, then `python benchmarks/results.py`.",
            "",
        ], RunFiles()
    files = _records_files(records)
    configurations = fedsc_configurations(records)
    commands = [sweep_command] if is_sweep else [_fedsc_command(key) for key in configurations]
    lines += ["Commands:", "", "```bash", *commands, "python benchmarks/results.py", "```", ""]
    lines += [
        f"Source: {len(records)} completed runs in `{_rel(folder)}`"
        + ("" if is_sweep else f" (benchmarks/fedsc_fmnist.py's runs; the sweep `{sweep_command}` is not run yet)")
        + ". Linear-probe accuracy (`final.accuracy`: logistic regression on the frozen backbone's features of the "
        "60,000 training images, tested on the 10,000 test images) and kNN accuracy, mean ± sd over seeds; gain: "
        "FedSC (or FedSC with DP-CalR) minus FedAvg+SC, in points. The paper's numbers are GPU scale (CIFAR-10, "
        "ResNet-20, 10 clients x 1 class, 200 rounds): FedAvg+SC 77.82%, FedSC 80.06% (+2.24), FedSC with DP at "
        "epsilon 6: 79.42% (+1.60); the spec asks for the ordering at CPU scale.",
        "",
        "| configuration | method | seeds | linear probe | kNN | epsilon spent | gain over FedAvg+SC | s / round "
        "| paper (CIFAR-10) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"fedavg-sc": "FedAvg+SC", "fedsc": "FedSC", "fedsc-dp": "FedSC, DP-CalR"}
    for key, group in configurations.items():
        methods = defaultdict(list)
        for r in group:
            methods[r.method].append(r)
        base = methods.get("fedavg-sc")
        base_acc = plots.mean_sd([100 * r.final["accuracy"] for r in base])[0] if base else None
        for method in sorted(methods, key=lambda m: (list(names).index(m) if m in names else 9, m)):
            runs = methods[method]
            acc_text = _mean_sd_text([100 * r.final["accuracy"] for r in runs])
            acc = plots.mean_sd([100 * r.final["accuracy"] for r in runs])[0]
            knn = [100 * r.final["knn_accuracy"] for r in runs if plots._has(r, "knn_accuracy")]
            knn_text = _mean_sd_text(knn) if knn else "-"
            privacy = [_read_json(r.folder / "result.json").get("privacy") or {} for r in runs]
            spent = [p.get("epsilon_spent") for p in privacy if isinstance(p.get("epsilon_spent"), int | float)]
            eps_text = f"{max(spent):.2f} (target {_fmt(runs[0].get('epsilon'))})" if spent else "inf"
            timings = [_read_json(r.folder / "result.json").get("timing") or {} for r in runs]
            per_round = [t["seconds_per_round"] for t in timings if "seconds_per_round" in t]
            gain = "" if base_acc is None or method == "fedavg-sc" else f"{acc - base_acc:+.1f}"
            lines.append(
                f"| {_fedsc_label(key)} | {names.get(method, method)} | {len(runs)} | {acc_text} | {knn_text} | "
                f"{eps_text} | {gain} | {sum(per_round) / max(len(per_round), 1):.1f} | "
                f"{FEDSC_PAPER.get(method, '-')}% |"
            )
    lines.append("")
    drawn = plots.fedsc_figures(records)
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![FedSC linear-probe accuracy]({_rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    return lines, files


# -- the document -----------------------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def machine_text() -> str:
    """`2 CPUs (nproc), AMD EPYC, Linux x86_64`."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return ", ".join(p for p in (f"{nproc} CPUs (nproc)", model, f"{platform.system()} {platform.machine()}") if p)


def header(files: Mapping[str, RunFiles], now: dt.datetime) -> list[str]:
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    commit_text = (f"`{commit[:12]}`" + (" with uncommitted changes" if dirty else "")) if commit else "unknown"
    total = RunFiles()
    for f in files.values():
        total.merge(f)
    per = ", ".join(f"{name} {f.runs}" for name, f in files.items() if f.runs)
    if total.cpu_recorded == total.runs and total.runs:
        cpu = f"total CPU time {_hours(total.cpu_seconds)}"
    elif total.cpu_recorded:
        cpu = (
            f"CPU time recorded for {total.cpu_recorded} of the {total.runs} runs: {_hours(total.cpu_seconds)}; "
            f"wall time of all runs {_hours(total.wall_seconds)}"
        )
    else:
        cpu = (
            "CPU time: not recorded in the run files (`silofl sweep` prints each run's CPU seconds but does not "
            f"store them); wall time summed over the runs: {_hours(total.wall_seconds)} (`timing.total_seconds`, "
            "or a mu2 cell's `seconds`; runs went two at a time on a shared machine, so this is not the elapsed time)"
        )
    return [
        "# silofl results",
        "",
        f"Generated by `python benchmarks/results.py` on {now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}); "
        f"machine: {machine_text()}; git commit {commit_text}.",
        "",
        f"Runs read: {total.runs} ({per or 'none'}); {cpu}.",
        "",
        "Every number below is read by `benchmarks/results.py` from a run file: a run folder's `result.json` (and "
        "the sweep's `run.json` for the method's name) or a cell cached by `benchmarks/mu2_tables.py`. The papers' "
        "numbers are quoted as constants and marked as the paper's. Rerun the script after more runs finish; "
        "sections whose runs are missing say so and name the command that makes them.",
        "",
        "Contents: [SteFFLe](#steffle-fairness-violation-vs-test-error), "
        "[SteFFLe with separate sensitive parties]"
        "(#steffle-with-separate-sensitive-parties-silos-divided-central-sensitive), "
        "[DP-mu2-FL](#dp-mu2-fl-the-papers-tables-1-and-2-mnist), "
        "[FedSC](#fedsc-vs-fedavgsc-fashion-mnist-10-silos-x-1-class-cpu-scale).",
        "",
    ]


STEFFLE_HEADING = "## SteFFLe: fairness violation vs test error"


def load_steffle_sweeps(sweeps: Path, sweep_files: Path, figures: Path) -> list[SweepResult]:
    return [
        load_steffle_sweep(name, dataset, fairness, sweeps, sweep_files, figures)
        for name, dataset, fairness in STEFFLE_SWEEPS
    ]


def _section_module(name: str) -> ModuleType:
    """benchmarks/<name>.py, a module of sections that uses this one as `results` (the same module object, not a
    second copy)."""
    sys.modules.setdefault("results", sys.modules[__name__])
    return _load_module(name, ROOT / "benchmarks" / f"{name}.py")


def _headline_module() -> ModuleType:
    """benchmarks/results_headline.py: the headline and the Tran-gap sections."""
    return _section_module("results_headline")


def _tran_gap_module() -> ModuleType:
    """benchmarks/results_tran_gap.py: the Tran-gap factors on Adult, demographic parity, h 0 (it imports
    results_headline, loaded first if it is not)."""
    if "results_headline" not in sys.modules:
        _headline_module()
    return _section_module("results_tran_gap")


def _race_module() -> ModuleType:
    """benchmarks/results_race.py (the many-valued attribute section)."""
    return _section_module("results_race")


def steffle_part(results: Sequence[SweepResult], sweeps: Path, sweep_files: Path, doc_dir: Path) -> list[str]:
    """The SteFFLe sweeps' part of the document: every sweep's section, the summary, the headline and the gap."""
    headline = _headline_module()
    body = [
        STEFFLE_HEADING,
        "",
        "The SteFFLe paper's experiments (Section 5, Appendix E): 3 silos, heterogeneity h in {0, 0.75} (Algorithm 3 "
        "on age), epsilon in {1, 3, 9} for demographic parity and {1, 3} for equalized odds, lambda swept over "
        "[0, 2], against its baselines. Baselines here: "
        + "; ".join(f"`{k}`: {v}" for k, v in BASELINES.items())
        + ". The paper's Retired Adult dataset is not available here; Parkinsons telemonitoring (a dataset of the "
        "DP-FERMI paper, not of SteFFLe's) is added.",
        "",
        *method_section(),
    ]
    for result in results:
        body += steffle_section(result, doc_dir)
    body += summary_section(results)
    body += headline.headline_section(results)
    body += headline.gap_section(results)
    adult = next((r for r in results if r.dataset == "adult" and r.fairness == "dp"), None)
    body += _tran_gap_module().factor_section(adult.records if adult else [], sweeps, sweep_files)
    return body


def build_document(
    *,
    sweeps: Path,
    sweep_files: Path,
    out: Path,
    figures: Path,
    mu2_cache: Path,
    fedsc_runs: Path,
    now: dt.datetime | None = None,
) -> tuple[str, list[SweepResult]]:
    """The markdown of docs/RESULTS.md (figures written to `figures` on the way) and the SteFFLe sweeps' results.
    The first version's topology section is copied from the document at `out` as it stands
    (:func:`topology_history`)."""
    doc_dir = out.parent
    results = load_steffle_sweeps(sweeps, sweep_files, figures)
    body = steffle_part(results, sweeps, sweep_files, doc_dir)
    body += topology_history(out.read_text() if out.is_file() else "")
    sealed_lines, sealed_files = sealed_section(sweeps, sweep_files, figures, doc_dir)
    body += sealed_lines
    silos_lines, silos_files = silos_section(sweeps, sweep_files, figures, doc_dir)
    body += silos_lines
    race = _race_module()
    race_lines, race_files = race.race_section(sweeps, sweep_files, figures, doc_dir)
    body += race_lines
    mu2_lines, mu2_files = mu2_section(sweeps, mu2_cache, figures, doc_dir, sweep_files)
    fedsc_lines, fedsc_files = fedsc_section(sweeps, fedsc_runs, figures, doc_dir, sweep_files)
    files = {r.name: r.files for r in results}
    files[SEALED_SWEEP[0]] = sealed_files
    files[SILOS_SWEEP[0]] = silos_files
    files.update(race_files)
    files["mu2"] = mu2_files
    files["fedsc"] = fedsc_files
    now = now or dt.datetime.now().astimezone()
    text = "\n".join([*header(files, now), *body, *mu2_lines, *fedsc_lines]).rstrip() + "\n"
    return text, results


def sweeps_read(only: str | None) -> list[str]:
    """The sweep folders (names under --sweeps) whose runs the sections of `--only only` read (None: every one)."""
    steffle = [name for name, _, _ in STEFFLE_SWEEPS]
    gap = _tran_gap_module()
    race = [sweep.name for sweep in _race_module().MANY_VALUED]
    by_mode = {
        "parkinsons": [name for name, _, _ in PARKINSONS_SWEEPS],
        "tran-gap": [gap.MAIN_SWEEP, gap.GAP_SWEEP],
        "steffle": [*steffle, gap.GAP_SWEEP],
        "sealed": [SEALED_SWEEP[0]],
        "silos": [SILOS_SWEEP[0]],
        "race": race,
    }
    if only is not None:
        return by_mode[only]
    return list(dict.fromkeys(name for names in by_mode.values() for name in names))


def sweeps_without_runs(sweeps: Path, names: Iterable[str]) -> list[str]:
    """The sweeps among `names` without a single result.json under `sweeps`/<name>: a fresh checkout has none (run
    folders are not in git), and writing their sections then would replace documented results with "not run yet"."""
    return [n for n in names if not (sweeps / n).is_dir() or next((sweeps / n).rglob("result.json"), None) is None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", default="runs/sweeps", help="folder of the sweeps' run folders (<name>/)")
    parser.add_argument("--sweep-files", default=str(ROOT / "benchmarks" / "sweeps"), help="folder of <name>.toml")
    parser.add_argument("--out", default="docs/RESULTS.md", help="the markdown document to write")
    parser.add_argument("--figures", default="", help="folder of the PNG figures (default: <out's folder>/figures)")
    parser.add_argument("--mu2-cells", default="runs/mu2_tables", help="benchmarks/mu2_tables.py's cell cache")
    parser.add_argument("--fedsc-runs", default="runs/fedsc_fmnist", help="benchmarks/fedsc_fmnist.py's run folders")
    parser.add_argument(
        "--only",
        choices=["steffle", "tran-gap", "sealed", "silos", "race", "parkinsons"],
        help="regenerate only this section of the existing document from its runs (the others stay as they are)",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="write the sections even where a sweep they read has no run folder (they then say 'not run yet' in "
        "place of the documented results)",
    )
    args = parser.parse_args(argv)
    missing = sweeps_without_runs(Path(args.sweeps), sweeps_read(args.only))
    if missing and not args.allow_missing:
        commands = "; ".join(f"silofl sweep {_rel(Path(args.sweep_files) / f'{name}.toml', ROOT)}" for name in missing)
        print(
            f"results.py: no runs of {', '.join(missing)} under {args.sweeps}/ (run folders are not in git): writing "
            f"{args.out} now would replace their documented results with 'not run yet'. Nothing was written. Run "
            f"the sweeps first ({commands}), point --sweeps at their folder, or pass --allow-missing.",
            file=sys.stderr,
        )
        return 2
    import matplotlib

    matplotlib.use("Agg")
    out = Path(args.out)
    figures = Path(args.figures) if args.figures else out.parent / "figures"
    if args.only == "parkinsons":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        document = out.read_text()
        now = dt.datetime.now().astimezone()
        for name, dataset, fairness in PARKINSONS_SWEEPS:
            result = load_steffle_sweep(name, dataset, fairness, Path(args.sweeps), Path(args.sweep_files), figures)
            section = steffle_section(result, out.parent)
            section[1:1] = [
                "",
                f"This section was regenerated alone (`python benchmarks/results.py --only parkinsons`) on "
                f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {len(result.records)} runs; the summary "
                "table below does not include it yet (it needs every sweep's runs: a full regeneration).",
            ]
            document = replace_section(document, section[0], section, SUMMARY_HEADING)
            print(f"wrote the section '{section[0][4:]}' of {out} ({len(result.records)} runs)")
        out.write_text(document)
        return 0
    if args.only == "tran-gap":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        gap = _tran_gap_module()
        main_runs = Path(args.sweeps) / gap.MAIN_SWEEP
        adult = plots.load_runs([main_runs])[0] if main_runs.is_dir() else []  # no figure: the sweep may be partial
        section = gap.factor_section(adult, Path(args.sweeps), Path(args.sweep_files))
        now = dt.datetime.now().astimezone()
        section[1:1] = [
            "",
            f"This section was regenerated alone (`python benchmarks/results.py --only tran-gap`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}).",
        ]
        out.write_text(replace_section(out.read_text(), gap.FACTORS_HEADING, section, TOPOLOGY_HEADING))
        print(f"wrote the section '{gap.FACTORS_HEADING[4:]}' of {out}")
        return 0
    if args.only == "steffle":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        results = load_steffle_sweeps(Path(args.sweeps), Path(args.sweep_files), figures)
        section = steffle_part(results, Path(args.sweeps), Path(args.sweep_files), out.parent)
        now = dt.datetime.now().astimezone()
        runs = sum(len(r.records) for r in results)
        section[1:1] = [
            "",
            f"This part was regenerated alone (`python benchmarks/results.py --only steffle`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {runs} runs of the six SteFFLe sweeps, plus "
            "the runs of `steffle_adult_tran_gap` for the Tran-gap section; the header's counts are those of the last "
            "full regeneration.",
        ]
        out.write_text(replace_section(out.read_text(), STEFFLE_HEADING, section, TOPOLOGY_HEADING))
        print(f"wrote the part '{STEFFLE_HEADING[3:]}' of {out} ({runs} runs)")
        for r in results:
            print(f"  {r.name}: {len(r.records)} runs")
        return 0
    if args.only:
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        race = _race_module()
        make, heading = {
            "sealed": (sealed_section, SEALED_HEADING),
            "silos": (silos_section, SILOS_HEADING),
            "race": (race.race_section, race.RACE_HEADING),
        }[args.only]
        section, files = make(Path(args.sweeps), Path(args.sweep_files), figures, out.parent)
        if isinstance(files, dict):  # a section of several sweeps (race)
            total = RunFiles()
            for part in files.values():
                total.merge(part)
            files = total
        now = dt.datetime.now().astimezone()
        section[1:1] = [
            "",
            f"This section was regenerated alone (`python benchmarks/results.py --only {args.only}`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {files.runs} runs; the header's counts "
            "are those of the last full regeneration.",
        ]
        before = SILOS_HEADING if args.only == "sealed" else MU2_HEADING  # build_document's order
        out.write_text(replace_section(out.read_text(), heading, section, before))
        print(f"wrote the section '{heading[3:]}' of {out} ({files.runs} runs)")
        return 0
    text, results = build_document(
        sweeps=Path(args.sweeps),
        sweep_files=Path(args.sweep_files),
        out=out,
        figures=figures,
        mu2_cache=Path(args.mu2_cells),
        fedsc_runs=Path(args.fedsc_runs),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    for r in results:
        print(
            f"  {r.name}: {len(r.records)} runs" + (f", figure {', '.join(map(str, r.figures))}" if r.figures else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
