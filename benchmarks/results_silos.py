"""SteFFLe against the number of silos in docs/RESULTS.md (the SteFFLe paper's Figure 2 c, d): error and violation
against N at fixed total data, from the `steffle_credit_silos` sweep, and what they say about the paper's claim."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_runs import (
    RunFiles,
    figure_lines,
    seconds_per_round,
    sigma_text,
    sweep_opening,
)
from benchmarks.results_text import fmt
from silofl.server import plots

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
    hs = sorted({plots.as_float(r.get("heterogeneity")) for r in records if int(r.get("num-silos")) > 1})
    styles = {0.0: "-", 0.75: "--"}
    colors = dict(zip(SILOS_LAMBDAS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for h in hs:
        for lam in SILOS_LAMBDAS:
            by_n: dict[int, list[plots.RunRecord]] = defaultdict(list)
            for r in records:
                n = int(r.get("num-silos"))
                if plots.as_float(r.get("lambda")) == lam and (n == 1 or plots.as_float(r.get("heterogeneity")) == h):
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
                    label=f"h {fmt(h)}, λ {fmt(lam)}",
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
    metric = plots.FAIRNESS_METRIC[fairness]
    opening, records, files = sweep_opening(folder, sweep_file, "silos", metric)
    lines += opening
    if not records:
        return lines, files
    drawn = [(f"silos-{plots.slug(dataset, fairness)}", fig) for _, fig in plots.fairness_figures(records)]
    drawn.append((f"silos-against-n-{plots.slug(dataset, fairness)}", silos_figure(records, metric)))
    lines += figure_lines(drawn, figures, "SteFFLe against the number of silos", doc_dir)
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
        h = 0.0 if n == 1 else plots.as_float(r.get("heterogeneity"))
        groups[(h, n, plots.as_float(r.get("lambda")))].append(r)
    summary: dict[tuple[float, int], dict[float, tuple[float, float]]] = defaultdict(dict)
    spreads: list[float] = []
    for (h, n, lam), runs in sorted(groups.items()):
        error = plots.mean_sd([r.final["error"] for r in runs])
        violation = plots.mean_sd([r.final[metric] for r in runs])
        seconds = plots.mean_sd(seconds_per_round(runs))
        lines.append(
            f"| {fmt(h) if n > 1 else '-'} | {n} | {fmt(lam)} | {len(runs)} | {error[0]:.4f} ± {error[1]:.4f} | "
            f"{violation[0]:.4f} ± {violation[1]:.4f} | {sigma_text(runs[0])} | {seconds[0]:.4f} |"
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
            f"h {fmt(h)}: error {base[first][0]:.4f} with {first} silo{'s' if first > 1 else ''} and "
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
                f"| {fmt(h)} | {n} | {f'{base[0]:.4f}' if base else '-'} | {f'{base[1]:.4f}' if base else '-'} | "
                f"{vio:.4f} ({fmt(lam)}) | {err:.4f} |"
            )
    return lines
