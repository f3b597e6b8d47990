"""`silofl plot fedsc` (FedSC): bars of the linear-probe accuracy, one bar per method and configuration (every
config key but the seed and bookkeeping: a non-private run is never averaged with a private one), error bars over
seeds, bars grouped along x by the other keys the methods vary; one figure per dataset."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from silofl.server.plots.grouping import _group
from silofl.server.plots.labels import (
    _PRIVACY_KEYS,
    METRIC_LABELS,
    _check_metric,
    _dataset_title,
    _ordered_keys,
    _privacy_order,
    _seeds_text,
    distinguishing_labels,
    fmt,
    slug,
)
from silofl.server.plots.layout import _Colors, _legend, _new_figure
from silofl.server.plots.runs import _IGNORED_KEYS, RunRecord, has, in_plot, mean_sd

if TYPE_CHECKING:
    from matplotlib.figure import Figure


#: Keys that change how often a run is evaluated, not what it trains: they never make a FedSC configuration.
_EVALUATION_ONLY_KEYS = frozenset({"eval-every"})
#: Config keys that never make two runs' configurations different (seeds are averaged, the rest is bookkeeping).
_NOT_CONFIGURATION = frozenset({"seed"}) | _IGNORED_KEYS | _EVALUATION_ONLY_KEYS


def _value_order(value: Any) -> tuple[int, float, str]:
    """Sort key of one config value: numbers numerically, then text, then a missing value (None)."""
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def configuration(run: RunRecord) -> dict[str, Any]:
    """A run's configuration for grouping: every config key except the seed and bookkeeping (out-dir, eval-every)."""
    return {k: v for k, v in run.config.items() if k not in _NOT_CONFIGURATION}


def _matches(values: Sequence[Any], target: Sequence[Any]) -> bool:
    """Whether a cell's x values (None: the cell has no such key) fit an x group's."""
    return all(v is None or v == t for v, t in zip(values, target, strict=True))


def fedsc_figures(runs: Sequence[RunRecord], *, metric: str = "accuracy") -> list[tuple[str, Figure]]:
    """FedSC: bars of the linear-probe accuracy (mean ± sd over seeds), one figure per dataset.

    One bar per method and configuration: runs are averaged only with runs of the same method and the same config
    but the seed (a non-private run never with a private one). Bars are coloured by method and privacy level (the
    legend: "fedsc (non-private)", "fedsc (eps 6)" where the levels differ, `distinguishing_labels`) and grouped
    along x by the other keys a method varies (e.g. rounds and local epochs; ticks `key value`). A run without such a
    key (FedAvg+SC has no alpha-start) stands in every x group that matches its other values, as a baseline."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "fedsc") and has(r, metric)]
    percent = metric in ("accuracy", "knn_accuracy")
    figures = []
    for dataset, group in sorted(_group(runs, lambda r: str(r.get("dataset"))).items()):
        cells = _group(group, lambda r: (r.method, json.dumps(configuration(r), sort_keys=True, default=str)))
        cell_config = {key: configuration(members[0]) for key, members in cells.items()}
        by_method = _group(cells, lambda key: key[0])
        x_keys = [
            k
            for k in _ordered_keys(cell_config.values())
            if k not in _PRIVACY_KEYS
            and k != "algorithm"
            and any(
                len({json.dumps(cell_config[c].get(k)) for c in keys if cell_config[c].get(k) is not None}) > 1
                for keys in by_method.values()
            )
        ]
        x_of = {c: tuple(cell_config[c].get(k) for k in x_keys) for c in cells}
        # x groups: the cells' full x values, then a cell lacking some key joins every group it fits (or its own)
        full = {v for v in x_of.values() if None not in v}
        for v in x_of.values():
            if None in v and not any(_matches(v, t) for t in full):
                full.add(v)
        xgroups = sorted(full, key=lambda v: tuple(_value_order(x) for x in v))
        # series: a method and what it varies besides the x keys (its privacy level)
        series_of = {
            c: (c[0], json.dumps({k: v for k, v in cell_config[c].items() if k not in x_keys}, sort_keys=True))
            for c in cells
        }
        series = sorted(set(series_of.values()), key=lambda s: (s[0], _privacy_order(json.loads(s[1])), s[1]))
        labels = distinguishing_labels([s[0] for s in series], [json.loads(s[1]) for s in series])
        label_of = dict(zip(series, labels, strict=True))
        width = 0.8 / len(series)
        fig, axes = _new_figure(1, 1, width=max(4.5, 0.45 * len(series) * len(xgroups) + 1.5), height=3.8)
        ax = axes[0][0]
        colors = _Colors(labels, ordered=True)
        counts, heights = [], []
        for s_index, s in enumerate(series):
            xs, means, sds = [], [], []
            own = [c for c in cells if series_of[c] == s]
            for g_index, target in enumerate(xgroups):
                fitting = [c for c in own if _matches(x_of[c], target)]
                if not fitting:
                    continue
                cell = min(fitting, key=lambda c: sum(v is None for v in x_of[c]))  # the most specific
                values = [r.final[metric] * (100 if percent else 1) for r in cells[cell]]
                mean, sd = mean_sd(values)
                xs.append(g_index + (s_index - (len(series) - 1) / 2) * width)
                means.append(mean)
                sds.append(sd if len(values) > 1 else math.nan)
                counts.append(len(values))
            if not xs:
                continue
            heights += means
            error = sds if any(not math.isnan(sd) for sd in sds) else None
            label = label_of[s]
            container = ax.bar(xs, means, width, yerr=error, capsize=3, color=colors.style[label][0], label=label)
            ax.bar_label(container, fmt="%.1f" if percent else "%.3f", fontsize=7, padding=2)
        ticks = [
            "\n".join(f"{k} {fmt(v)}" for k, v in zip(x_keys, target, strict=True) if v is not None)
            for target in xgroups
        ]
        ax.set_xticks(range(len(xgroups)), ticks, fontsize=8)
        ax.set_xlabel("configuration" if x_keys else "")
        name = "linear-probe accuracy" if metric == "accuracy" else METRIC_LABELS[metric]
        ax.set_ylabel(name + (" (%)" if percent else ""))
        if percent and heights:
            ax.set_ylim(bottom=max(0.0, min(heights) - 10), top=min(100.0, max(heights) + 3))
        ax.grid(axis="y", alpha=0.3)
        _legend(fig, axes)
        fig.suptitle(f"{_dataset_title(group[0].config)}: FedSC, {name}\n{_seeds_text(counts)}", fontsize=11)
        figures.append((f"fedsc-{slug(dataset, metric)}", fig))
    return figures
