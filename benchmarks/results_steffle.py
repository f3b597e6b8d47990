"""SteFFLe's sweeps in docs/RESULTS.md: per (dataset, fairness notion) sweep its figure, its reduction in fairness
violation at matched test error against each baseline (:func:`server.analysis.matched_error_reduction`) and its
mean points; then the summary over all sweeps next to the paper's claims, and how the reduction is computed.

SteFFLe's figures and tables come from the sweeps `steffle_{adult,credit,parkinsons}_{dp,eo}` (run folders under
`--sweeps/<name>/`, the sweep files under `--sweep-files/<name>.toml`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.results_runs import DATA_ENV, ROOT, STEFFLE, RunFiles, grid_text, records_files, rel
from benchmarks.results_text import fmt, pct
from silofl.server import plots
from silofl.server.analysis import (
    MeanPoint,
    Point,
    Reduction,
    lower_envelope,
    matched_error_reduction,
    mean_or_none,
    mean_points,
    pareto_front,
)

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


STEFFLE_HEADING = "## SteFFLe: fairness violation vs test error"
SUMMARY_HEADING = "### Summary against the paper's claims"


# -- one sweep ---------------------------------------------------------------------------------------------------------


@dataclass
class Panel:
    """One (h, epsilon) panel of a sweep: each method's mean points and SteFFLe's reduction against each baseline."""

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


def panels_of(records: Sequence[plots.RunRecord], fairness: str) -> list[Panel]:
    """One panel per (h, epsilon) of the multi-silo private runs, as in `silofl plot fairness` (a one-silo run belongs
    to every h, a non-private run to every epsilon), with SteFFLe's reduction against each baseline."""
    metric = plots.FAIRNESS_METRIC[fairness]
    records = [r for r in records if plots.has(r, "error") and plots.has(r, metric)]
    multi = [r for r in records if int(r.get("num-silos") or 1) > 1]
    hs = sorted({plots.as_float(r.get("heterogeneity")) for r in multi}) or sorted(
        {plots.as_float(r.get("heterogeneity")) for r in records}
    )
    eps = sorted({r.epsilon for r in records if math.isfinite(r.epsilon)}) or [math.inf]
    panels = []
    for h in hs:
        for e in eps:
            members = [r for r in records if plots.in_panel(r, h, e)]
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
    from silofl.server.sweep import SweepError, load_sweep, run_state

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
    result.files = records_files(result.records)
    result.panels = panels_of(result.records, fairness)
    drawn = plots.fairness_figures([r for r in result.records if plots.has(r, metric)])
    result.figures = plots.save_figures(drawn, figures, ("png",))
    for _, fig in drawn:
        fig.clear()
    return result


def load_steffle_sweeps(sweeps: Path, sweep_files: Path, figures: Path) -> list[SweepResult]:
    """Every sweep of :data:`STEFFLE_SWEEPS`, loaded (figures drawn into `figures`)."""
    return [
        load_steffle_sweep(name, dataset, fairness, sweeps, sweep_files, figures)
        for name, dataset, fairness in STEFFLE_SWEEPS
    ]


def _shared_config(records: Sequence[plots.RunRecord]) -> str:
    steffle = [r for r in records if r.method == STEFFLE] or list(records)
    parts = []
    for key in SHOWN_KEYS:
        values = {json.dumps(r.get(key)) for r in steffle}
        if len(values) == 1 and steffle[0].get(key) not in (None, "", 0, 0.0):
            parts.append(f"{key} {fmt(steffle[0].get(key))}")
    return ", ".join(parts)


def _run_state_text(result: SweepResult) -> str:
    found = len(result.records)
    text = f"{found} completed runs in `{rel(result.folder)}`"
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


def steffle_section(result: SweepResult, doc_dir: Path) -> list[str]:
    """Markdown of one (dataset, fairness) sweep: commands, state, figure, reduction table, mean points."""
    title = f"{plots.DATASET_NAMES.get(result.dataset, result.dataset)}, {plots.FAIRNESS_NAMES[result.fairness]}"
    command = f"{DATA_ENV} silofl sweep {rel(result.sweep_file, ROOT)}"
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
        f"Runs: {_run_state_text(result)} Grid: {grid_text(result.records)}.",
        "",
        f"SteFFLe's configuration (the same in all its runs): {_shared_config(result.records)}.",
        "",
    ]
    for path in result.figures:
        lines += [f"![{title}: fairness violation vs test error]({rel(path, doc_dir)})", ""]
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
        lines.append(f"| {fmt(panel.h)} | {fmt(panel.epsilon)} | " + " | ".join(cells) + " |")
    overall = []
    for b in present:
        values = [p.reductions[b].mean for p in result.panels if b in p.reductions]
        found = [v for v in values if v is not None]
        overall.append(f"{pct(mean_or_none(found))} ({len(found)} of {len(values)} panels)")
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
                    red = "" if env is None or p.violation[0] <= 0 else pct(1 - env / p.violation[0])
                lines.append(
                    f"| {fmt(panel.h)} | {fmt(panel.epsilon)} | {method} | {p.label} | {p.seeds} | "
                    f"{p.error[0]:.4f} ± {p.error[1]:.4f} | {p.violation[0]:.4f} ± {p.violation[1]:.4f} | {at} | "
                    f"{red} |"
                )
    return [*lines, "", "</details>", ""]


# -- over all sweeps ---------------------------------------------------------------------------------------------------


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
            value = pct(mean_or_none(found)) if done else f"not generated yet: run {names}"
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
