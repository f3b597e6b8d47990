"""`silofl plot fairness` (the SteFFLe paper's figures): the fairness violation against test error, one curve per
method whose points a trade-off key traces (lambda, or e.g. Tran's `dual-lr`), each point the mean over seeds with
error bars in both axes; one figure per (dataset, fairness notion), panel rows by heterogeneity, columns by epsilon."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from silofl.server.plots.grouping import (
    PANEL_KEYS,
    TRACE_KEYS,
    _by_dataset_and_notion,
    _curves,
    _group,
    _split,
    _trace_key,
    in_panel,
    sort_key,
)
from silofl.server.plots.labels import (
    FAIRNESS_METRIC,
    METRIC_LABELS,
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


def fairness_figures(runs: Sequence[RunRecord], *, trace: Sequence[str] = TRACE_KEYS) -> list[tuple[str, Figure]]:
    """Fairness violation against test error, one curve per method traced by lambda; one figure per (dataset,
    fairness), panels rows = heterogeneity, columns = epsilon."""
    from matplotlib.ticker import MaxNLocator

    runs = [r for r in runs if in_plot(r, "fairness") and has(r, "error")]
    varied = varied_keys(runs)
    figures = []
    for (dataset, fairness), group in sorted(_by_dataset_and_notion(runs).items()):
        metric = FAIRNESS_METRIC.get(str(fairness), "dp_violation")
        group = [r for r in group if has(r, metric)]
        if not group:
            continue
        hs = sorted({as_float(r.get("heterogeneity")) for r in group if int(r.get("num-silos")) > 1}) or [
            as_float(group[0].get("heterogeneity"))
        ]
        eps = sorted({r.epsilon for r in group if math.isfinite(r.epsilon)}) or [math.inf]
        fig, axes = _new_figure(len(hs), len(eps))
        mixed = _mixed_privacy(group)
        label_of = {
            id(r): _curve_label(r, _split(varied[r.method], PANEL_KEYS, trace), r.method in mixed) for r in group
        }
        colors = _Colors(label_of.values())
        counts = []
        for i, h in enumerate(hs):
            for j, e in enumerate(eps):
                ax = axes[i][j]
                members = [r for r in group if in_panel(r, h, e)]
                for label, curve in _curves(members, label_of):
                    key = _trace_key(varied[curve[0].method], trace)
                    points = sorted(
                        _group(curve, lambda r, k=key: r.get(k) if k else None).items(), key=lambda kv: sort_key(kv[0])
                    )
                    xs, ys = [], []
                    for _, point in points:
                        xs.append(mean_sd([r.final["error"] for r in point]))
                        ys.append(mean_sd([r.final[metric] for r in point]))
                        counts.append(len(point))
                    color, marker = colors.style[label]
                    ax.errorbar(
                        [x for x, _ in xs],
                        [y for y, _ in ys],
                        xerr=[s for _, s in xs],
                        yerr=[s for _, s in ys],
                        color=color,
                        marker=marker,
                        markersize=4,
                        capsize=2,
                        linewidth=1.2,
                        label=label,
                    )
                    if key and len(points) > 1:
                        for (value, _), (x, _), (y, _) in ((points[0], xs[0], ys[0]), (points[-1], xs[-1], ys[-1])):
                            ax.annotate(
                                f"{'λ' if key == 'lambda' else key} {fmt(value)}",
                                (x, y),
                                textcoords="offset points",
                                xytext=(3, 3),
                                fontsize=6,
                                color=color,
                            )
                ax.set_xlabel("test error")
                ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # a narrow range's 6-digit ticks overlapped
                ax.set_ylabel(METRIC_LABELS[metric])
                ax.set_title(f"epsilon = {fmt(e)}, h = {fmt(h)}", fontsize=10)
                ax.grid(alpha=0.3)
        _legend(fig, axes)
        traced = sorted({k for r in group if (k := _trace_key(varied[r.method], trace))})
        fig.suptitle(
            f"{_dataset_title(group[0].config)}: {METRIC_LABELS[metric]} vs test error\n{_seeds_text(counts)}"
            + (f"; points traced by {' / '.join(traced)}" if traced else ""),
            fontsize=11,
        )
        figures.append((f"fairness-{slug(dataset, fairness)}", fig))
    return figures
