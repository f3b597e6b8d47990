"""DP-FERMI at its own paper's settings in docs/RESULTS.md (Lowy et al., ICLR 2023, Section 4.1.1, Figure 2;
settings of its Appendix F.2.1): logistic regression on Adult, demographic parity, one silo holding every record
(silofl's SteFFLe with one silo), epsilon in {0.5, 1, 3, 9} and without noise (FERMI), lambda in [0, 2.5] (and 4, 6
beyond it), from the `dp_fermi_adult` sweep; the trade-off per epsilon and what the runs say about it as epsilon grows,
computed."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.results_headline import t_interval, violation_at
from benchmarks.results_runs import RunFiles, figure_lines, runs_by, sweep_opening
from benchmarks.results_text import fmt, mean_sd_value_text
from silofl.server import plots
from silofl.server.analysis import lowest_within_budget

#: The sweep (file stem = run folder under --sweeps), its dataset and fairness notion.
DP_FERMI_SWEEP = "dp_fermi_adult"
DATASET, FAIRNESS = "adult", "dp"

DP_FERMI_HEADING = "## DP-FERMI at its own settings (Adult, its Section 4.1.1)"

#: The fixed error budget of the conclusion: a lambda counts when its mean test error is within this of lambda 0's.
ERROR_BUDGET = 0.01

#: The paper's claim about this experiment (Section 4.1.1, about its Figure 2), quoted.
PAPER_CLAIM = (
    "The DP-FERMI paper (Lowy et al., ICLR 2023, Section 4.1.1, Figure 2: Adult, demographic parity, epsilon in "
    '{0.5, 1, 3, 9}, 15 seeds): "Compared to Tran et al. (2021a; b), DP-FERMI offers superior fairness-accuracy '
    'tradeoffs at every privacy (ϵ) level."'
)

Summary = Mapping[float, Mapping[float, tuple[float, float]]]  # epsilon -> lambda -> (mean error, mean violation)
Cells = Mapping[tuple[float, ...], Mapping[int, plots.RunRecord]]  # (epsilon, lambda) -> seed -> run


def summary_of(cells: Mapping[tuple[float, ...], Mapping[int, plots.RunRecord]], metric: str) -> Summary:
    """Per epsilon and lambda: the mean test error and mean `metric` over the seeds."""
    out: dict[float, dict[float, tuple[float, float]]] = {}
    for (eps, lam), runs in sorted(cells.items()):
        values = list(runs.values())
        error = plots.mean_sd([r.final["error"] for r in values])[0]
        out.setdefault(eps, {})[lam] = (error, plots.mean_sd([r.final[metric] for r in values])[0])
    return out


def _median_sd(cells: Mapping[tuple[float, ...], Mapping[int, plots.RunRecord]], metric: str) -> float | None:
    """The median over the cells with two seeds or more of the sd of `metric` over their seeds."""
    sds = [plots.mean_sd([r.final[metric] for r in runs.values()])[1] for runs in cells.values() if len(runs) > 1]
    return statistics.median(sds) if sds else None


def dp_fermi_table(cells: Mapping[tuple[float, ...], Mapping[int, plots.RunRecord]], metric: str) -> list[str]:
    """One row per (epsilon, lambda): the seeds, test error and `metric` (mean ± sd over the seeds)."""
    lines = [
        f"| epsilon | lambda | seeds | test error | {plots.METRIC_LABELS[metric]} |",
        "|---|---|---|---|---|",
    ]
    for (eps, lam), runs in sorted(cells.items()):
        values = list(runs.values())
        errors = mean_sd_value_text([r.final["error"] for r in values])
        violations = mean_sd_value_text([r.final[metric] for r in values])
        lines.append(f"| {fmt(eps)} | {fmt(lam)} | {len(values)} | {errors} | {violations} |")
    return lines


def dp_fermi_conclusion(summary: Summary, seed_sd: float | None = None, matched: Sequence[str] = ()) -> list[str]:
    """Per epsilon: lambda 0's error and violation, the lowest mean violation among the lambdas whose mean error is
    within ERROR_BUDGET of lambda 0's (and whether the lambda grid, not the budget, set it); whether that violation
    falls at every step of the finite epsilons (beside `seed_sd`, the typical sd of a cell's violation over its
    seeds, for scale); `matched` (:func:`matched_error_lines`: the same question at one test error); the paper's
    claim beside it."""
    parts, best, chosen = [], {}, {}
    for eps, by_lam in sorted(summary.items()):
        if 0.0 not in by_lam:
            continue
        base = by_lam[0.0]
        lam, (error, violation) = lowest_within_budget(by_lam, ERROR_BUDGET)
        best[eps], chosen[eps] = violation, lam
        name = f"epsilon {fmt(eps)}" + (" (no noise: FERMI)" if math.isinf(eps) else "")
        change = f"; {100 * (violation / base[1] - 1):+.0f}% against lambda 0" if base[1] > 0 else ""
        parts.append(
            f"- {name}: lambda 0 error {base[0]:.4f}, violation {base[1]:.4f}; within the budget the lowest violation "
            f"is {violation:.4f} (lambda {fmt(lam)}, error {error:.4f}{change})."
        )
    if not parts:
        return []
    largest = max(lam for by_lam in summary.values() for lam in by_lam)
    if all(lam == largest for lam in chosen.values()):
        parts.append(
            f"- At every epsilon that lowest violation is the grid's largest lambda ({fmt(largest)}), still inside "
            "the budget: the lambdas swept do not reach the error budget, so the curves' fair end lies beyond them "
            "at these step sizes."
        )
    finite = [(eps, v) for eps, v in sorted(best.items()) if math.isfinite(eps)]
    steps = list(itertools.pairwise(finite))
    rises = [(a, b) for a, b in steps if b[1] >= a[1]]
    if not steps:
        trend = "One private epsilon only: no trend across epsilon to read."
    elif not rises:
        trend = (
            f"That lowest violation falls at every step of epsilon ({', '.join(f'{v:.4f}' for _, v in finite)} at "
            f"epsilon {', '.join(fmt(e) for e, _ in finite)}): by this measure the trade-off improves as the noise "
            "shrinks."
        )
    else:
        trend = (
            f"That lowest violation does not fall at every step of epsilon ({', '.join(f'{v:.4f}' for _, v in finite)}"
            f" at epsilon {', '.join(fmt(e) for e, _ in finite)}): it does not fall from "
            + ", ".join(f"epsilon {fmt(a[0])} to {fmt(b[0])}" for a, b in rises)
            + "."
        )
    return [
        f"Computed from the table, at a fixed error budget (a lambda counts when its mean test error is at most "
        f"lambda 0's + {ERROR_BUDGET:g}; lambda 0 has no fairness term):",
        "",
        *parts,
        "",
        trend + (f" (A cell's violation varies over its seeds by a median sd of {seed_sd:.4f}.)" if seed_sd else ""),
        "",
        *matched,
        f"{PAPER_CLAIM} That claim is about DP-FERMI against Tran et al.'s methods at each epsilon; this sweep has no "
        "Tran baseline at these settings (the SteFFLe sections above compare SteFFLe, DP-FERMI's federated form, "
        "with Tran et al. at SteFFLe's settings). What this section tests is the part of the figure that needs no "
        "baseline: the trade-off at each epsilon, and whether it improves as epsilon grows.",
        "",
    ]


def _fair_end(points: Mapping[float, Sequence[tuple[float, float]]]) -> tuple[float, dict[float, float]] | None:
    """The largest test error every epsilon's points reach (the smallest of their largest errors) and each epsilon's
    lowest violation at an error <= it (its Pareto front, interpolated: the headline's `violation_at`)."""
    if not points or any(not p for p in points.values()):
        return None
    error = min(max(e for e, _ in p) for p in points.values())
    values = {eps: violation_at(p, error) for eps, p in points.items()}
    return error, {eps: v for eps, v in values.items() if v is not None}


def matched_error_lines(cells: Cells, metric: str) -> list[str]:
    """The trade-off compared across epsilon at one test error: the largest error every epsilon reaches (where the
    fairness term has done the most that all of them can show), each epsilon's lowest violation at an error <= it,
    and the change from the smallest epsilon to the largest (FERMI when present) paired by seed (each seed's runs
    alone, each seed its own matched error), with its 95% Student-t interval."""
    by_eps: dict[float, dict[float, Mapping[int, plots.RunRecord]]] = defaultdict(dict)
    for (eps, lam), runs in cells.items():
        by_eps[eps][lam] = runs
    if len(by_eps) < 2:
        return []
    means = {eps: list(by_lam.values()) for eps, by_lam in summary_of(cells, metric).items()}
    matched = _fair_end(means)
    if matched is None:
        return []
    error, values = matched
    first, last = min(by_eps), max(by_eps)
    seeds = set.intersection(*(set(runs) for runs in cells.values()))
    changes = []
    for seed in sorted(seeds):
        own = {
            eps: [(runs[seed].final["error"], runs[seed].final[metric]) for runs in lams.values()]
            for eps, lams in by_eps.items()
        }
        seed_matched = _fair_end(own)
        if seed_matched is not None and first in seed_matched[1] and last in seed_matched[1]:
            changes.append(seed_matched[1][last] - seed_matched[1][first])
    listing = ", ".join(f"{values[eps]:.4f} (epsilon {fmt(eps)})" for eps in sorted(values))
    line = (
        "The budget's lowest violations lie at different errors; at one test error, the largest every epsilon "
        f"reaches ({error:.4f}), each epsilon's lowest violation at an error <= it (its Pareto front, interpolated as "
        f"in the headline) is {listing}."
    )
    interval = t_interval(changes)
    if interval is not None and first in values and last in values:
        lo, hi = interval
        word = "flat" if lo <= 0 <= hi else ("rises" if lo > 0 else "falls")
        line += (
            f" From epsilon {fmt(first)} to {fmt(last)}, each seed's runs alone (each its own matched error), the "
            f"violation changes by {statistics.fmean(changes):+.4f} (95% t interval over {len(changes)} seeds "
            f"[{lo:+.4f}, {hi:+.4f}]: {word})."
        )
    return [line, ""]


def dp_fermi_section(sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path) -> tuple[list[str], RunFiles]:
    """Markdown of the section: the settings, the commands, the runs' state, the violation-vs-error figure per
    epsilon (FERMI, epsilon inf, overlaid), the table per (epsilon, lambda) and the computed conclusion."""
    folder, sweep_file = sweeps / DP_FERMI_SWEEP, sweep_files / f"{DP_FERMI_SWEEP}.toml"
    lines = [
        DP_FERMI_HEADING,
        "",
        "The DP-FERMI paper's demographic-parity experiment on Adult (Section 4.1.1, Figure 2; settings of its "
        "Appendix F.2.1): logistic regression, sensitive attribute sex, epsilon in {0.5, 1, 3, 9} protecting the "
        "sensitive attribute, lambda swept over [0, 2.5], constant steps from [0.005, 0.01], batch 1024, 200 epochs. "
        "DP-FERMI is silofl's SteFFLe with one silo holding every record; here eta_theta 0.01, eta_w 0.005, C = 1, W "
        "radius 1 (diameter 2), delta 1/n^2, lambda in {0, 0.5, 1, 1.5, 2, 2.5} (the paper's range) and {4, 6} beyond "
        "it (to reach the curves' fair end), epsilon inf (FERMI, no noise) "
        "beside, 3 seeds (the paper averages 15).",
        "",
    ]
    metric = plots.FAIRNESS_METRIC[FAIRNESS]
    opening, records, files = sweep_opening(folder, sweep_file, "dp-fermi", metric)
    lines += opening
    if not records:
        return lines, files
    drawn = [(f"dp-fermi-{plots.slug(DATASET, FAIRNESS)}", fig) for _, fig in plots.fairness_figures(records)]
    lines += figure_lines(drawn, figures, "DP-FERMI on Adult, violation vs test error per epsilon", doc_dir)
    cells = runs_by(records, ("epsilon", "lambda"))
    lines += [
        f"Test error and {plots.METRIC_LABELS[metric]} per (epsilon, lambda), mean ± sd over the seeds (epsilon inf: "
        "FERMI, the same optimisation without noise):",
        "",
        *dp_fermi_table(cells, metric),
        "",
        *dp_fermi_conclusion(summary_of(cells, metric), _median_sd(cells, metric), matched_error_lines(cells, metric)),
    ]
    return lines, files
