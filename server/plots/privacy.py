"""`silofl plot privacy`: the privacy-utility trade-off, test error (or `--metric`) against epsilon, one curve per
method and trade-off value, non-private runs as dashed horizontal lines; one figure per (dataset, fairness notion),
one panel per heterogeneity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from silofl.server.plots.grouping import PANEL_KEYS, _by_dataset_and_notion, _curves, _group, _split, in_panel
from silofl.server.plots.labels import (
    FAIRNESS_NAMES,
    METRIC_LABELS,
    _check_metric,
    _curve_label,
    _dataset_title,
    _mixed_privacy,
    _seeds_text,
    fmt,
    slug,
)
from silofl.server.plots.layout import _Colors, _legend, _new_figure
from silofl.server.plots.runs import RunRecord, has, in_plot, mean_sd, varied_keys
from silofl.server.run_result import as_float

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def privacy_figures(runs: Sequence[RunRecord], *, metric: str = "error") -> list[tuple[str, Figure]]:
    """Privacy-utility: `metric` against epsilon, one curve per method (and trade-off value); non-private runs as
    dashed horizontal lines; one figure per (dataset, fairness), panels by heterogeneity."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "privacy") and has(r, metric)]
    varied = varied_keys(runs)
    figures = []
    for (dataset, fairness), group in sorted(_by_dataset_and_notion(runs).items()):
        if not any(math.isfinite(r.epsilon) for r in group):
            continue
        hs = sorted({as_float(r.get("heterogeneity")) for r in group if int(r.get("num-silos")) > 1}) or [
            as_float(group[0].get("heterogeneity"))
        ]
        fig, axes = _new_figure(1, len(hs))
        mixed = _mixed_privacy(group)  # their non-private runs: a dashed line of their own, labelled non-private
        label_of = {id(r): _curve_label(r, _split(varied[r.method], PANEL_KEYS, ()), r.method in mixed) for r in group}
        colors = _Colors(label_of.values())
        counts = []
        for j, h in enumerate(hs):
            ax = axes[0][j]
            members = [r for r in group if in_panel(r, h, None)]
            for label, curve in _curves(members, label_of):
                color, marker = colors.style[label]
                private = [r for r in curve if math.isfinite(r.epsilon)]
                if private:
                    points = sorted(_group(private, lambda r: r.epsilon).items())
                    stats = [mean_sd([r.final[metric] for r in point]) for _, point in points]
                    counts += [len(point) for _, point in points]
                    ax.errorbar(
                        [e for e, _ in points],
                        [m for m, _ in stats],
                        yerr=[s for _, s in stats],
                        color=color,
                        marker=marker,
                        markersize=4,
                        capsize=2,
                        label=label,
                    )
                else:
                    mean, _ = mean_sd([r.final[metric] for r in curve])
                    counts.append(len(curve))
                    dashed = label if "non-private" in label else f"{label}, non-private"
                    ax.axhline(mean, color=color, linestyle="--", linewidth=1, label=dashed)
            ax.set_xscale("log")
            finite = sorted({r.epsilon for r in members if math.isfinite(r.epsilon)})
            ax.set_xticks(finite, [fmt(e) for e in finite])
            ax.minorticks_off()
            ax.set_xlabel("epsilon (per silo)")
            ax.set_ylabel(METRIC_LABELS[metric])
            ax.set_title(f"h = {fmt(h)}", fontsize=10)
            ax.grid(alpha=0.3)
        _legend(fig, axes)
        fairness_text = f", {FAIRNESS_NAMES.get(str(fairness), fairness)}" if fairness else ""
        fig.suptitle(
            f"{_dataset_title(group[0].config)}{fairness_text}: {METRIC_LABELS[metric]} vs epsilon\n"
            f"{_seeds_text(counts)}",
            fontsize=11,
        )
        figures.append((f"privacy-{slug(dataset, fairness, metric)}", fig))
    return figures
