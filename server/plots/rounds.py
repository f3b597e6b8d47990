"""`silofl plot run`: the per-round curves of single runs (result.json's `rounds`: test accuracy, kNN accuracy, test
loss, fairness violations, epsilon spent, whichever were recorded), one panel per metric, the runs overlaid."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from silofl.server.plots.labels import ROUND_METRICS, _dataset_title, run_labels
from silofl.server.plots.layout import _Colors, _legend, _new_figure
from silofl.server.plots.runs import PlotError, RunRecord, in_plot

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def round_values(rounds: Iterable[Mapping[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """The rounds (x) and values (y) of `metric` in result.json's `rounds` entries that recorded it as a finite
    number (an evaluation metric only in evaluated rounds; epsilon spent "inf" in a non-private run: none)."""
    xs, ys = [], []
    for index, entry in enumerate(rounds, start=1):
        value = entry.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(int(entry.get("round", index)))
            ys.append(float(value))
    return xs, ys


def run_figures(runs: Sequence[RunRecord], *, metrics: Sequence[str] | None = None) -> list[tuple[str, Figure]]:
    """`silofl plot run`: the per-round curves of `runs` (loaded `with_rounds`), one panel per metric of
    `ROUND_METRICS` (or `metrics`) that some run recorded, one line per run in each panel it has values for, the
    runs labelled by what differs between them (`run_labels`). One figure, stem `rounds`."""
    wanted = list(metrics or ROUND_METRICS)
    for metric in wanted:
        if metric not in ROUND_METRICS:
            raise PlotError(f"--metric {metric!r}: choose among {', '.join(ROUND_METRICS)}")
    values = {m: [round_values(run.rounds, m) for run in runs] for m in wanted}
    panels = [m for m in wanted if any(xs for xs, _ in values[m])]
    if not panels:
        return []
    labels = run_labels(runs)
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = _new_figure(rows, cols, width=4.2, height=3.0)
    colors = _Colors(labels)
    probe = all(in_plot(run, "fedsc") for run in runs)  # FedSC's accuracy is its linear probe's
    for index, metric in enumerate(panels):
        ax = axes[index // cols][index % cols]
        for label, (xs, ys) in zip(labels, values[metric], strict=True):
            if not xs:
                continue
            color, marker = colors.style[label]
            ax.plot(xs, ys, color=color, marker=marker if len(xs) <= 40 else None, markersize=3, label=label)
        name = "linear-probe accuracy" if metric == "accuracy" and probe else ROUND_METRICS[metric]
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    for index in range(len(panels), rows * cols):
        axes[index // cols][index % cols].remove()
    _legend(fig, axes)
    datasets = ", ".join(dict.fromkeys(_dataset_title(run.config) for run in runs))
    what = runs[0].folder.name if len(runs) == 1 else f"{len(runs)} runs"
    fig.suptitle(f"{datasets}: per-round metrics\n{what}", fontsize=11)
    return [("rounds", fig)]
