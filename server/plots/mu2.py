"""`silofl plot mu2` (DP-mu2-FL's Tables 1 and 2 as figures): grouped bars of test accuracy by privacy level (rho)
and number of silos M, one panel per trust model, the value printed on each bar; one figure per (dataset,
partition)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from silofl.server.plots.grouping import _group
from silofl.server.plots.labels import METRIC_LABELS, _check_metric, _dataset_title, _seeds_text, fmt, slug
from silofl.server.plots.layout import _Colors, _legend, _new_figure
from silofl.server.plots.runs import RunRecord, has, in_plot, mean_sd
from silofl.server.run_result import as_float

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def mu2_figures(runs: Sequence[RunRecord], *, metric: str = "accuracy") -> list[tuple[str, Figure]]:
    """DP-mu2-FL's tables as grouped bars: groups = privacy level (rho, or epsilon), bars = (method, M), one panel per
    trust model; one figure per (dataset, partition)."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "mu2") and has(r, metric)]
    if not runs:
        return []
    percent = metric in ("accuracy", "knn_accuracy")
    figures = []
    for (dataset, partition), group in sorted(_group(runs, lambda r: (r.get("dataset"), r.get("partition"))).items()):
        trusts = sorted({r.get("trust") for r in group if r.private}, key=lambda t: (t != "untrusted", t))
        trusts = trusts or ["untrusted"]
        levels = sorted({_level(r) for r in group}, key=lambda lv: (lv[0], lv[1]))
        bars = sorted({(r.method, int(r.get("num-silos"))) for r in group}, key=lambda b: (b[0], b[1]))
        fig, axes = _new_figure(1, len(trusts), width=max(4.5, 0.2 * len(levels) * len(bars) + 1.5))
        colors = _Colors(f"{m}, M = {k}" for m, k in bars)
        counts = []
        for j, trust in enumerate(trusts):
            ax = axes[0][j]
            members = [r for r in group if not r.private or r.get("trust") == trust]
            width = 0.8 / len(bars)
            lows = []
            for b, (method, silos) in enumerate(bars):
                label = f"{method}, M = {silos}"
                xs, heights, errs = [], [], []
                for g, level in enumerate(levels):
                    cell = [r for r in members if (r.method, int(r.get("num-silos"))) == (method, silos)]
                    cell = [r for r in cell if _level(r) == level]
                    if not cell:
                        continue
                    mean, sd = mean_sd([r.final[metric] * (100 if percent else 1) for r in cell])
                    counts.append(len(cell))
                    xs.append(g - 0.4 + width * (b + 0.5))
                    heights.append(mean)
                    errs.append(sd)
                if not xs:
                    continue
                color, _ = colors.style[label]
                container = ax.bar(xs, heights, width=width * 0.95, yerr=errs, capsize=2, color=color, label=label)
                ax.bar_label(container, fmt="%.1f" if percent else "%.3f", fontsize=6, rotation=90, padding=2)
                lows.append(min(heights))
            ax.set_xticks(range(len(levels)), [lv[2] for lv in levels])
            ax.set_xlabel("privacy (the paper's rho; larger is less private)")
            ax.set_ylabel(METRIC_LABELS[metric] + (" (%)" if percent else ""))
            if percent and lows:
                ax.set_ylim(bottom=max(0.0, min(lows) - 10))
            ax.set_title(f"{trust} server", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        _legend(fig, axes)
        fig.suptitle(
            f"{_dataset_title(group[0].config)}, {partition} silos: {METRIC_LABELS[metric]} of DP-mu2-FL\n"
            f"{_seeds_text(counts)}",
            fontsize=11,
        )
        figures.append((f"mu2-{slug(dataset, partition)}", fig))
    return figures


def _level(run: RunRecord) -> tuple[int, float, str]:
    """The privacy level of a mu2 run: (order, value, label): rho, else epsilon, else non-private (last)."""
    rho = as_float(run.get("rho") or 0.0)
    if rho > 0:
        return (0, rho, f"rho {fmt(rho)}")
    if math.isfinite(run.epsilon):
        return (1, run.epsilon, f"eps {fmt(run.epsilon)}")
    return (2, math.inf, "non-private")
