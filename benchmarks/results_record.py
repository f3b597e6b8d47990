"""SteFFLe protecting the whole record against FedFDP in docs/RESULTS.md (issue 34): the comparison the headline
cannot make, at the same epsilon of the same thing.

The headline's SteFFLe protects the sensitive attribute only (`--protect sensitive`: its epsilon covers s), while
FedFDP's epsilon covers the whole record (x, s, y). `--protect record` (DP-FERMI's Theorem D.2, second part) makes
SteFFLe's epsilon cover the whole record too, under add/remove, so the two are compared at equal privacy. The rule is
the headline's (:func:`benchmarks.results_headline.headline`: the best test error both reach, each method's lowest
violation at an error <= it), applied per panel (dataset, epsilon) to SteFFLe-record and FedFDP, and, for contrast,
to SteFFLe-sensitive and FedFDP on the same runs. Runs: the `steffle_{adult,credit}_record` sweeps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.results_headline import Headline, headline, panel_points, t_interval
from benchmarks.results_runs import DATA_ENV, ROOT, STEFFLE, RunFiles, figure_lines, grid_text, rel, section_runs
from benchmarks.results_text import fmt, pct
from silofl.server import plots
from silofl.server.analysis import mean_points

#: The sweeps: (sweep file stem = run folder, dataset, fairness notion).
RECORD_SWEEPS = (
    ("steffle_adult_record", "adult", "dp"),
    ("steffle_credit_record", "credit", "dp"),
)

RECORD_HEADING = "## SteFFLe protecting the whole record against FedFDP (the same epsilon of the same thing)"

#: The method names of the sweeps.
RECORD = "steffle-record"
FEDFDP = "fedfdp"

#: Paired against FedFDP per panel: (the SteFFLe method, what its epsilon covers).
COMPARED = ((RECORD, "the whole record"), (STEFFLE, "the sensitive attribute"))


def _per_seed(records: Sequence[plots.RunRecord], eps: float, metric: str, method: str) -> list[float]:
    """Each seed's (v_FedFDP - v_method) / v_FedFDP at that seed's own matched error (the headline's seed replicate,
    on that seed's own FedFDP violation: one panel here, no mean points to scale by)."""
    values = []
    for seed in sorted({int(r.get("seed") or 0) for r in records}):
        mine = [r for r in records if int(r.get("seed") or 0) == seed]
        got = panel_points(mine, 0.0, eps, metric, (method, FEDFDP))
        value = headline(got) if set(got) == {method, FEDFDP} else None
        if value is not None and (reduction := value.reduction(FEDFDP, method)) is not None:
            values.append(reduction)
    return values


def panel_rows(
    records: Sequence[plots.RunRecord], dataset: str, metric: str
) -> tuple[list[str], dict[str, list[float]]]:
    """Per epsilon: for each SteFFLe mode, the matched error against FedFDP, both violations there, the reduction on
    the means and per seed. Also each mode's reductions (on the means) over the panels."""
    rows: list[str] = []
    reductions: dict[str, list[float]] = {m: [] for m, _ in COMPARED}
    for eps in sorted({plots.as_float(r.get("epsilon")) for r in records}):
        if not math.isfinite(eps):
            continue
        for method, covers in COMPARED:
            points = panel_points(records, 0.0, eps, metric, (method, FEDFDP))
            value: Headline | None = headline(points) if set(points) == {method, FEDFDP} else None
            name = plots.DATASET_NAMES.get(dataset, dataset)
            if value is None:
                rows.append(f"| {name} | {fmt(eps)} | {method} ({covers}) | no runs of both | | | | |")
                continue
            reduction = value.reduction(FEDFDP, method)
            seeds = _per_seed(records, eps, metric, method)
            if reduction is not None:
                reductions[method].append(reduction)
            rows.append(
                f"| {name} | {fmt(eps)} | {method} ({covers}) | {value.error:.4f} ({value.set_by}) | "
                f"{value.violations[method]:.4f} | {value.violations[FEDFDP]:.4f} | {pct(reduction)} | "
                f"{', '.join(pct(s) for s in seeds) or '-'} |"
            )
    return rows, reductions


def reach_rows(records: Sequence[plots.RunRecord], dataset: str, metric: str) -> list[str]:
    """Per epsilon and method: the most accurate configuration (its error and violation) and the one with the lowest
    violation (its violation and error), on the means over seeds: how far each method's lambda moves it, which a
    single matched error cannot show when one method's configurations barely trade accuracy for fairness."""
    rows = []
    name = plots.DATASET_NAMES.get(dataset, dataset)
    for eps in sorted({plots.as_float(r.get("epsilon")) for r in records}):
        members = [r for r in records if plots.as_float(r.get("epsilon")) == eps and plots.has(r, metric)]
        for method, points in sorted(mean_points(members, metric).items()):
            accurate = min(points, key=lambda p: p.error[0])
            fairest = min(points, key=lambda p: p.violation[0])
            rows.append(
                f"| {name} | {fmt(eps)} | {method} | {accurate.error[0]:.4f} / {accurate.violation[0]:.4f} "
                f"({accurate.label}) | {fairest.violation[0]:.4f} / {fairest.error[0]:.4f} ({fairest.label}) |"
            )
    return rows


def record_conclusion(reductions: dict[str, list[float]], seeds: dict[str, list[float]]) -> list[str]:
    """The mean reduction over panels per SteFFLe mode, with Student's 95% interval over the per-seed values."""
    parts = []
    for method, covers in COMPARED:
        values = reductions.get(method) or []
        if not values:
            continue
        ci = t_interval(seeds.get(method) or [])
        count = len(seeds.get(method) or [])
        interval = f" (Student's t 95% interval over its {count} (panel, seed) values: [{pct(ci[0])}, {pct(ci[1])}])"
        interval = interval if ci else ""
        parts.append(
            f"SteFFLe protecting {covers} against FedFDP: {pct(statistics.fmean(values))} lower violation at the "
            f"matched error on average over {len(values)} panels{interval}"
        )
    if not parts:
        return []
    return [
        "Computed from the table: " + "; ".join(parts) + ". Positive: SteFFLe's violation is lower. The paper's "
        "52.93% against FedFDP compares SteFFLe's epsilon for the sensitive attribute with FedFDP's epsilon for the "
        "whole record; the first row of each panel is the comparison at the same guarantee.",
        "",
    ]


def record_section(
    sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path
) -> tuple[list[str], dict[str, RunFiles]]:
    """Markdown of the comparison: the commands, per dataset the runs' state and the violation-vs-error figure, one
    table over the datasets' panels, and the computed summary."""
    lines = [
        RECORD_HEADING,
        "",
        "SteFFLe with `--protect record` (DP-FERMI's Theorem D.2, second part: every record's loss gradient clipped "
        "and noised with the fairness releases, one Poisson sample per round, one accountant under add/remove of a "
        "whole record) against FedFDP, whose epsilon covers the whole record too; SteFFLe protecting the sensitive "
        "attribute only (the headline's) on the same panels for contrast. 3 silos, h 0, demographic parity, "
        "epsilon in {1, 3}; SteFFLe lambda in {0, 0.5, 1, 2, 4} (both modes), FedFDP lambda in {0.1, 0.5, 2}; "
        "seeds {0, 1, 2}; the rule is the headline's (the best test error both methods of a row reach, each one's "
        "lowest violation at an error <= it).",
        "",
    ]
    files: dict[str, RunFiles] = {}
    rows: list[str] = []
    reach: list[str] = []
    reductions: dict[str, list[float]] = {m: [] for m, _ in COMPARED}
    seeds: dict[str, list[float]] = {m: [] for m, _ in COMPARED}
    for name, dataset, fairness in RECORD_SWEEPS:
        folder, sweep_file = sweeps / name, sweep_files / f"{name}.toml"
        command = f"{DATA_ENV} silofl sweep {rel(sweep_file, ROOT)}"
        title = plots.DATASET_NAMES.get(dataset, dataset)
        if not folder.is_dir():
            lines += [f"{title}: not generated yet: run `{command}`, then `python benchmarks/results.py`.", ""]
            files[name] = RunFiles()
            continue
        metric = plots.FAIRNESS_METRIC[fairness]
        records, files[name], state = section_runs(folder, sweep_file, metric)
        lines += [f"{title}: `{command}`. Runs: {state}. Grid: {grid_text(records)}.", ""]
        if not records:
            continue
        drawn = [(f"record-{plots.slug(dataset, fairness)}", fig) for _, fig in plots.fairness_figures(records)]
        lines += figure_lines(drawn, figures, "SteFFLe protecting the whole record against FedFDP", doc_dir)
        mine, by_method = panel_rows(records, dataset, metric)
        rows += mine
        reach += reach_rows(records, dataset, metric)
        for method, _ in COMPARED:
            reductions[method] += by_method[method]
            for eps in sorted({plots.as_float(r.get("epsilon")) for r in records}):
                if math.isfinite(eps):
                    seeds[method] += _per_seed(records, eps, metric, method)
    if rows:
        lines += [
            "Per panel: the matched error e* (and the method that sets it), both violations at e*, SteFFLe's "
            "reduction against FedFDP on the means over seeds (1 - v_SteFFLe / v_FedFDP) and on each seed's runs "
            "alone (each seed its own e*):",
            "",
            "| dataset | epsilon | SteFFLe (epsilon covers) | e* (set by) | v SteFFLe | v FedFDP | reduction | "
            "per seed |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            *record_conclusion(reductions, seeds),
        ]
    if reach:
        lines += [
            "What each method's own knob reaches (means over seeds): its most accurate configuration, test error / "
            "violation, and its fairest, violation / test error. The matched error above is the best error both "
            "methods reach, where the method that sets it is at its least fair point; this table shows the rest of "
            "each curve:",
            "",
            "| dataset | epsilon | method | most accurate: error / violation | fairest: violation / error |",
            "|---|---|---|---|---|",
            *reach,
            "",
        ]
    lines += ["Regenerate this section alone: `python benchmarks/results.py --only record`.", ""]
    return lines, files
