"""`silofl plot KIND RUN_DIR...`: the papers' figures from run folders (matplotlib, Agg; PNG and SVG).

Reads every `result.json` under the given folders (a sweep's out dir, or single run folders), keeps completed runs,
and draws one figure per dataset (and fairness notion, or partition), each a grid of panels:

- ``fairness`` (SteFFLe paper's figures): x = test error, y = the fairness violation of the runs' `fairness` notion
  (demographic parity, equalized odds, equal opportunity); one curve per method, its points traced by lambda (or the
  method's own trade-off key, e.g. Tran's `dual-lr`), each point the mean over seeds with error bars (standard
  deviation) in both axes. Panels: rows by heterogeneity h, columns by epsilon.
- ``privacy``: x = epsilon, y = test error (or `--metric`), one curve per method and trade-off value; non-private
  runs are horizontal dashed lines. Panels by heterogeneity.
- ``mu2`` (DP-mu2-FL's Tables 1 and 2): grouped bars of test accuracy by rho (groups) and number of silos M (bars),
  one panel per trust model, the value printed on each bar.
- ``fedsc`` (FedSC): bars of the linear-probe accuracy (`final.accuracy`) per method, error bars over seeds.

A run's method is the name its sweep gave it (`run.json`), else a label from its config (`steffle` with one silo is
`dp-fermi`, or `fermi` without noise). Runs that do not depend on a panel's key appear in every panel of that key:
a non-private run (epsilon = inf) in every epsilon column, a one-silo run in every heterogeneity row.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when the CLI starts
    from matplotlib.figure import Figure

FIGURE_KINDS = ("fairness", "privacy", "mu2", "fedsc")
#: Keys that trace a method's fairness/utility trade-off (the points of one curve), in order of preference.
TRACE_KEYS = ("lambda", "dual-lr")
#: Config keys that never distinguish runs (where they ran, how long the server waits).
_IGNORED_KEYS = frozenset({"out-dir", "data-dir", "round-timeout"})
#: Keys that place a run in a figure or panel (or average it, the seed): they never split a method into curves.
_PANEL_KEYS = frozenset({"dataset", "fairness", "heterogeneity", "epsilon", "seed"})
METRIC_LABELS = {
    "error": "test error",
    "accuracy": "test accuracy",
    "loss": "test loss",
    "dp_violation": "demographic parity violation",
    "eo_violation": "equalized odds violation",
    "eopp_violation": "equal opportunity violation",
    "knn_accuracy": "kNN accuracy",
}
FAIRNESS_NAMES = {"dp": "demographic parity", "eo": "equalized odds", "eopp": "equal opportunity"}
FAIRNESS_METRIC = {"dp": "dp_violation", "eo": "eo_violation", "eopp": "eopp_violation"}
DATASET_NAMES = {
    "adult": "Adult",
    "credit": "Credit Card",
    "parkinsons": "Parkinsons",
    "synthetic": "synthetic",
    "mnist": "MNIST",
    "fashion-mnist": "Fashion-MNIST",
    "digits": "digits",
    "cifar10": "CIFAR-10",
}


class PlotError(ValueError):
    """Nothing to plot, or a bad option; the message says what was found and what is needed."""


@dataclass(frozen=True)
class RunRecord:
    """One completed run, as read from its folder."""

    folder: Path
    method: str
    config: dict[str, Any]
    final: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.config.get(key)

    @property
    def epsilon(self) -> float:
        return _float(self.config.get("epsilon", math.inf))

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon) or _float(self.config.get("rho", 0.0)) > 0


def _float(value: Any) -> float:
    if isinstance(value, str):
        return math.inf if value.strip().lower() in {"inf", "infinity"} else float(value)
    return float(value)


def _spec(config: Mapping[str, Any]):
    """The registry entry of a run's algorithm, or None (an algorithm this process does not know)."""
    from protocols import algorithms

    try:
        return algorithms.get(str(config.get("algorithm", "")))
    except KeyError:
        return None


def default_method(config: Mapping[str, Any]) -> str:
    """A plot label for a run without a sweep's method name: its algorithm entry's label (the papers' names for
    SteFFLe: DP-FERMI / FERMI with one silo), else the algorithm's name."""
    spec = _spec(config)
    return spec.display_label(config) if spec is not None else str(config.get("algorithm", "?"))


def in_plot(run: RunRecord, kind: str) -> bool:
    """Whether `run`'s algorithm appears in figures of `kind` (its registry entry's `plots`)."""
    spec = _spec(run.config)
    return spec is not None and kind in spec.plots


def config_defaults(algorithm: str) -> dict[str, Any]:
    """Every run-config key of `algorithm` (kebab-case, as in result.json) with its default, in result.json's form.

    A run folder written before a key existed ran with that key's default (new keys are added with the old behaviour
    as default), so filling it in keeps old and new run folders of the same configuration on one curve."""
    from pydantic_core import PydanticUndefined

    spec = _spec({"algorithm": algorithm})
    if spec is None:
        return {}
    out: dict[str, Any] = {"algorithm": spec.name}  # (required, so without a default)
    for name, field in spec.config_model.model_fields.items():
        if field.default is PydanticUndefined:
            continue
        value = field.default
        out[field.alias or name] = "inf" if isinstance(value, float) and math.isinf(value) else value
    return out


def normalized_config(stored: Mapping[str, Any], defaults: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A result.json `config` as this version writes it: the algorithm's keys only (older versions stored every key
    of every algorithm), with the defaults of keys added since. `defaults` caches `config_defaults` per algorithm."""
    algorithm = str(stored.get("algorithm", ""))
    cache = defaults if defaults is not None else {}
    if algorithm not in cache:
        cache[algorithm] = config_defaults(algorithm)
    own = cache[algorithm]
    if not own:  # an algorithm this process does not know: as stored
        return dict(stored)
    return {**own, **{k: v for k, v in stored.items() if k in own}}


def load_runs(paths: Iterable[str | Path]) -> tuple[list[RunRecord], int]:
    """The completed runs under `paths` (run folders or folders of run folders) and the number of incomplete ones."""
    records, incomplete, seen = [], 0, set()
    defaults: dict[str, dict[str, Any]] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise PlotError(f"{root} does not exist")
        files = [root] if root.is_file() else ([root / "result.json"] if (root / "result.json").is_file() else [])
        files = files or sorted(root.rglob("result.json"))
        for path in files:
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                result = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise PlotError(f"{path}: not a readable result.json ({exc})") from None
            if not (result.get("status") or {}).get("completed", True):
                incomplete += 1
                continue
            config = normalized_config(result.get("config") or {}, defaults)
            meta_path = path.parent / "run.json"
            method = None
            if meta_path.is_file():
                try:
                    method = json.loads(meta_path.read_text()).get("method")
                except (OSError, json.JSONDecodeError):
                    method = None
            records.append(
                RunRecord(path.parent, str(method or default_method(config)), config, dict(result.get("final") or {}))
            )
    return records, incomplete


def varied_keys(runs: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Per method, the config keys whose value differs between its runs (in the config's key order)."""
    by_method: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_method[run.method].append(run)
    out = {}
    for method, group in by_method.items():
        keys = list(dict.fromkeys(k for run in group for k in run.config))
        out[method] = [
            k for k in keys if k not in _IGNORED_KEYS and len({json.dumps(r.config.get(k)) for r in group}) > 1
        ]
    return out


def filter_runs(runs: Sequence[RunRecord], where: Mapping[str, str]) -> list[RunRecord]:
    """The runs in the slice `where` (`key=value`), as `silofl sweep --where`: a condition on a key some method varies
    applies to those methods only (FedAvg, which has no lambda, stays with `lambda=1`); a key no method varies is
    compared with every run's config."""
    from server.sweep import matches

    varied = varied_keys(runs)
    varied_anywhere = {k for keys in varied.values() for k in keys}
    return [
        run
        for run in runs
        if all(
            matches(run.config.get(k), v)
            for k, v in where.items()
            if k in varied[run.method] or k not in varied_anywhere
        )
    ]


# -- statistics and layout helpers ------------------------------------------------------------------------------------


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def _fmt(value: Any) -> str:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return "inf" if math.isinf(value) else f"{value:g}"
    return str(value)


def _sort_key(value: Any) -> tuple[int, float, str]:
    try:
        return (0, _float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _slug(*parts: Any) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9.+]+", "", _fmt(p)) or "x" for p in parts)


def _curve_label(run: RunRecord, split: Sequence[str]) -> str:
    extra = ", ".join(f"{k} {_fmt(run.get(k))}" for k in split)
    return f"{run.method} ({extra})" if extra else run.method


def _by_dataset_and_notion(runs: Sequence[RunRecord]) -> dict[tuple[Any, Any], list[RunRecord]]:
    """Runs by (dataset, fairness notion). A run of an algorithm without a fairness notion (FedAvg, DP-FedSGD: its
    config has no `fairness`) belongs to every notion's figure of its dataset; its evaluation reports every
    violation."""
    groups = _group([r for r in runs if r.get("fairness") is not None], lambda r: (r.get("dataset"), r.get("fairness")))
    for run in (r for r in runs if r.get("fairness") is None):
        notions = [key for key in groups if key[0] == run.get("dataset")] or [(run.get("dataset"), "dp")]
        for key in notions:
            groups.setdefault(key, []).append(run)
    return groups


def _group(runs: Iterable[RunRecord], key: Callable[[RunRecord], Any]) -> dict[Any, list[RunRecord]]:
    out: dict[Any, list[RunRecord]] = defaultdict(list)
    for run in runs:
        out[key(run)].append(run)
    return out


class _Colors:
    """One colour (and marker) per curve label, the same in every panel of a figure."""

    MARKERS = "osD^vP*Xh<>p"

    def __init__(self, labels: Iterable[str]) -> None:
        from matplotlib import colormaps

        unique = sorted(set(labels))
        cmap = colormaps["tab10"] if len(unique) <= 10 else colormaps["tab20"]
        self.style = {label: (cmap(i % cmap.N), self.MARKERS[i % len(self.MARKERS)]) for i, label in enumerate(unique)}


def _new_figure(rows: int, cols: int, *, width: float = 4.2, height: float = 3.4) -> tuple[Figure, list[list[Any]]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols + 0.6, height * rows + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [list(row) for row in axes]


def _legend(fig: Figure, axes: Sequence[Sequence[Any]]) -> None:
    handles, labels = {}, []
    for row in axes:
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                if label not in handles:
                    handles[label] = handle
                    labels.append(label)
    if labels:
        width = fig.get_figwidth()
        ncols = max(1, min(len(labels), int(width // 2.4)))
        fig.legend([handles[label] for label in labels], labels, loc="outside lower center", ncols=ncols, fontsize=9)


def _seeds_text(counts: Iterable[int]) -> str:
    counts = sorted(set(counts))
    if not counts:
        return ""
    if counts == [1]:
        return "one seed (no error bars)"
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"mean ± sd over {n} seeds"


def _dataset_title(config: Mapping[str, Any]) -> str:
    name = str(config.get("dataset", "?"))
    return DATASET_NAMES.get(name, Path(name).name)


# -- figures ----------------------------------------------------------------------------------------------------------


def fairness_figures(runs: Sequence[RunRecord], *, trace: Sequence[str] = TRACE_KEYS) -> list[tuple[str, Figure]]:
    """Fairness violation against test error, one curve per method traced by lambda; one figure per (dataset,
    fairness), panels rows = heterogeneity, columns = epsilon."""
    from matplotlib.ticker import MaxNLocator

    runs = [r for r in runs if in_plot(r, "fairness") and _has(r, "error")]
    varied = varied_keys(runs)
    figures = []
    for (dataset, fairness), group in sorted(_by_dataset_and_notion(runs).items()):
        metric = FAIRNESS_METRIC.get(str(fairness), "dp_violation")
        group = [r for r in group if _has(r, metric)]
        if not group:
            continue
        hs = sorted({_float(r.get("heterogeneity")) for r in group if int(r.get("num-silos")) > 1}) or [
            _float(group[0].get("heterogeneity"))
        ]
        eps = sorted({r.epsilon for r in group if math.isfinite(r.epsilon)}) or [math.inf]
        fig, axes = _new_figure(len(hs), len(eps))
        label_of = {id(r): _curve_label(r, _split(varied[r.method], _PANEL_KEYS, trace)) for r in group}
        colors = _Colors(label_of.values())
        counts = []
        for i, h in enumerate(hs):
            for j, e in enumerate(eps):
                ax = axes[i][j]
                members = [r for r in group if _in_panel(r, h, e)]
                for label, curve in _curves(members, label_of):
                    key = _trace_key(varied[curve[0].method], trace)
                    points = sorted(
                        _group(curve, lambda r, k=key: r.get(k) if k else None).items(), key=lambda kv: _sort_key(kv[0])
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
                                f"{'λ' if key == 'lambda' else key} {_fmt(value)}",
                                (x, y),
                                textcoords="offset points",
                                xytext=(3, 3),
                                fontsize=6,
                                color=color,
                            )
                ax.set_xlabel("test error")
                ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # a narrow range's 6-digit ticks overlapped
                ax.set_ylabel(METRIC_LABELS[metric])
                ax.set_title(f"epsilon = {_fmt(e)}, h = {_fmt(h)}", fontsize=10)
                ax.grid(alpha=0.3)
        _legend(fig, axes)
        traced = sorted({k for r in group if (k := _trace_key(varied[r.method], trace))})
        fig.suptitle(
            f"{_dataset_title(group[0].config)}: {METRIC_LABELS[metric]} vs test error\n{_seeds_text(counts)}"
            + (f"; points traced by {' / '.join(traced)}" if traced else ""),
            fontsize=11,
        )
        figures.append((f"fairness-{_slug(dataset, fairness)}", fig))
    return figures


def privacy_figures(runs: Sequence[RunRecord], *, metric: str = "error") -> list[tuple[str, Figure]]:
    """Privacy-utility: `metric` against epsilon, one curve per method (and trade-off value); non-private runs as
    dashed horizontal lines; one figure per (dataset, fairness), panels by heterogeneity."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "privacy") and _has(r, metric)]
    varied = varied_keys(runs)
    figures = []
    for (dataset, fairness), group in sorted(_by_dataset_and_notion(runs).items()):
        if not any(math.isfinite(r.epsilon) for r in group):
            continue
        hs = sorted({_float(r.get("heterogeneity")) for r in group if int(r.get("num-silos")) > 1}) or [
            _float(group[0].get("heterogeneity"))
        ]
        fig, axes = _new_figure(1, len(hs))
        label_of = {id(r): _curve_label(r, _split(varied[r.method], _PANEL_KEYS, ())) for r in group}
        colors = _Colors(label_of.values())
        counts = []
        for j, h in enumerate(hs):
            ax = axes[0][j]
            members = [r for r in group if _in_panel(r, h, None)]
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
                    ax.axhline(mean, color=color, linestyle="--", linewidth=1, label=f"{label}, non-private")
            ax.set_xscale("log")
            finite = sorted({r.epsilon for r in members if math.isfinite(r.epsilon)})
            ax.set_xticks(finite, [_fmt(e) for e in finite])
            ax.minorticks_off()
            ax.set_xlabel("epsilon (per silo)")
            ax.set_ylabel(METRIC_LABELS[metric])
            ax.set_title(f"h = {_fmt(h)}", fontsize=10)
            ax.grid(alpha=0.3)
        _legend(fig, axes)
        fairness_text = f", {FAIRNESS_NAMES.get(str(fairness), fairness)}" if fairness else ""
        fig.suptitle(
            f"{_dataset_title(group[0].config)}{fairness_text}: {METRIC_LABELS[metric]} vs epsilon\n"
            f"{_seeds_text(counts)}",
            fontsize=11,
        )
        figures.append((f"privacy-{_slug(dataset, fairness, metric)}", fig))
    return figures


def mu2_figures(runs: Sequence[RunRecord], *, metric: str = "accuracy") -> list[tuple[str, Figure]]:
    """DP-mu2-FL's tables as grouped bars: groups = privacy level (rho, or epsilon), bars = (method, M), one panel per
    trust model; one figure per (dataset, partition)."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "mu2") and _has(r, metric)]
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
        figures.append((f"mu2-{_slug(dataset, partition)}", fig))
    return figures


#: Keys that change how often a run is evaluated, not what it trains: they never make a FedSC configuration.
_EVALUATION_ONLY_KEYS = frozenset({"eval-every"})


def _config_order(item: tuple[tuple, Any]) -> tuple:
    """Sort key of a (configuration values, runs) pair: numbers numerically, anything else as text, never mixed."""
    numeric = (int, float)
    return tuple(
        (0, float(v), "") if isinstance(v, numeric) and not isinstance(v, bool) else (1, 0.0, str(v)) for v in item[0]
    )


def fedsc_figures(runs: Sequence[RunRecord], *, metric: str = "accuracy") -> list[tuple[str, Figure]]:
    """FedSC: bars of the linear-probe accuracy (mean ± sd over seeds), one figure per dataset.

    The bars are grouped by configuration (the settings besides method and seed that differ between the runs, e.g.
    rounds and local epochs), one colour per method, so several configurations stay readable side by side."""
    _check_metric(metric)
    runs = [r for r in runs if in_plot(r, "fedsc") and _has(r, metric)]
    percent = metric in ("accuracy", "knn_accuracy")
    method_keys = {"algorithm", "epsilon", "delta", "seed", "dataset"} | _IGNORED_KEYS | _EVALUATION_ONLY_KEYS
    figures = []
    for dataset, group in sorted(_group(runs, lambda r: r.get("dataset")).items()):
        keys = [
            k
            for k in dict.fromkeys(k for r in group for k in r.config)
            if k not in method_keys and len({json.dumps(r.get(k)) for r in group}) > 1
        ]
        configs = sorted(_group(group, lambda r, keys=keys: tuple(r.get(k) for k in keys)).items(), key=_config_order)
        methods = sorted({r.method for r in group})
        width = 0.8 / len(methods)
        fig, axes = _new_figure(1, 1, width=max(4.5, 0.45 * len(methods) * len(configs) + 1.5), height=3.8)
        ax = axes[0][0]
        colors = _Colors(methods)
        counts, heights = [], []
        for m_index, method in enumerate(methods):
            xs, means, sds = [], [], []
            for c_index, (_, cell) in enumerate(configs):
                values = [r.final[metric] * (100 if percent else 1) for r in cell if r.method == method]
                if not values:
                    continue
                mean, sd = mean_sd(values)
                xs.append(c_index + (m_index - (len(methods) - 1) / 2) * width)
                means.append(mean)
                sds.append(sd if len(values) > 1 else math.nan)
                counts.append(len(values))
            heights += means
            error = sds if any(not math.isnan(sd) for sd in sds) else None
            container = ax.bar(xs, means, width, yerr=error, capsize=3, color=colors.style[method][0], label=method)
            ax.bar_label(container, fmt="%.1f" if percent else "%.3f", fontsize=7, padding=2)
        ticks = ["\n".join(f"{k} {_fmt(v)}" for k, v in zip(keys, config, strict=True)) for config, _ in configs]
        ax.set_xticks(range(len(configs)), ticks, fontsize=8)
        ax.set_xlabel("configuration" if keys else "")
        name = "linear-probe accuracy" if metric == "accuracy" else METRIC_LABELS[metric]
        ax.set_ylabel(name + (" (%)" if percent else ""))
        if percent and heights:
            ax.set_ylim(bottom=max(0.0, min(heights) - 10), top=min(100.0, max(heights) + 3))
        ax.grid(axis="y", alpha=0.3)
        fig.legend(loc="outside lower center", ncols=len(methods), fontsize=9)
        fig.suptitle(f"{_dataset_title(group[0].config)}: FedSC, {name}\n{_seeds_text(counts)}", fontsize=11)
        figures.append((f"fedsc-{_slug(dataset, metric)}", fig))
    return figures


def _level(run: RunRecord) -> tuple[int, float, str]:
    """The privacy level of a mu2 run: (order, value, label): rho, else epsilon, else non-private (last)."""
    rho = _float(run.get("rho") or 0.0)
    if rho > 0:
        return (0, rho, f"rho {_fmt(rho)}")
    if math.isfinite(run.epsilon):
        return (1, run.epsilon, f"eps {_fmt(run.epsilon)}")
    return (2, math.inf, "non-private")


def _has(run: RunRecord, metric: str) -> bool:
    value = run.final.get(metric)
    return isinstance(value, int | float) and math.isfinite(value)


def _check_metric(metric: str) -> None:
    if metric not in METRIC_LABELS:
        raise PlotError(f"--metric {metric!r}: choose one of {', '.join(METRIC_LABELS)}")


def _curves(members: Sequence[RunRecord], label_of: Mapping[int, str]) -> list[tuple[str, list[RunRecord]]]:
    """`members` grouped by curve label, sorted by label."""
    return sorted(_group(members, lambda r: label_of[id(r)]).items())


def _split(varied: Sequence[str], panel_keys: Iterable[str], trace: Sequence[str]) -> list[str]:
    """The keys that split a method into several curves: what it varies, except panels, seeds and its trace key."""
    key = _trace_key(varied, trace)
    return [k for k in varied if k not in panel_keys and k != key]


def _trace_key(varied: Sequence[str], trace: Sequence[str]) -> str | None:
    return next((k for k in trace if k in varied), None)


def _in_panel(run: RunRecord, h: float, eps: float | None) -> bool:
    """A one-silo run belongs to every heterogeneity row, a non-private run to every epsilon column."""
    if int(run.get("num-silos")) > 1 and _float(run.get("heterogeneity")) != h:
        return False
    return eps is None or not math.isfinite(run.epsilon) or run.epsilon == eps


def build_figures(
    kind: str,
    runs: Sequence[RunRecord],
    *,
    metric: str | None = None,
    trace: Sequence[str] = TRACE_KEYS,
    note: str = "",
) -> list[tuple[str, Figure]]:
    """The figures of `kind` for `runs`: (file stem, Figure) pairs; `note` (e.g. the `--where` slice) is added to
    each title."""
    if kind == "fairness":
        figures = fairness_figures(runs, trace=trace)
    elif kind == "privacy":
        figures = privacy_figures(runs, metric=metric or "error")
    elif kind == "mu2":
        figures = mu2_figures(runs, metric=metric or "accuracy")
    elif kind == "fedsc":
        figures = fedsc_figures(runs, metric=metric or "accuracy")
    else:
        raise PlotError(f"unknown figure kind {kind!r}; choose one of {', '.join(FIGURE_KINDS)}")
    if note:
        for _, fig in figures:
            fig.suptitle(f"{fig.get_suptitle()}; {note}", fontsize=11)
    return figures


def save_figures(
    figures: Sequence[tuple[str, Figure]], out: Path, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Write each figure as out/<stem>.<format>; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, fig in figures:
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            fig.savefig(path, dpi=150)
            paths.append(path)
    return paths


# -- command line -----------------------------------------------------------------------------------------------------


def add_plot_parser(subparsers: Any) -> None:
    """`silofl plot KIND RUN_DIR... [--out DIR] [--where KEY=VALUE] [--metric M] [--trace KEYS] [--formats ...]`."""
    import argparse

    p = subparsers.add_parser(
        "plot",
        help="draw the papers' figures from run folders (PNG and SVG)",
        description="Draw figures from the result.json files under RUN_DIR (a sweep's out dir or run folders).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("kind", choices=FIGURE_KINDS, help="fairness, privacy (utility vs epsilon), mu2 (tables), fedsc")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or folders holding run folders")
    p.add_argument("--out", default="", help="output folder (default: RUN_DIR/plots for the first RUN_DIR)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep runs with this config value (methods that do not vary KEY are kept whole)",
    )
    p.add_argument("--metric", default="", help="y metric: " + ", ".join(METRIC_LABELS) + " (default per kind)")
    p.add_argument("--trace", default=",".join(TRACE_KEYS), help="keys that trace a curve (fairness figures)")
    p.add_argument("--formats", default="png,svg", help="comma-separated image formats")
    p.set_defaults(func=plot_command)


def plot_command(args: Any) -> int:
    from server.sweep import SweepError, canonical_key, parse_where

    try:
        where = {canonical_key(k): v for k, v in parse_where(args.where).items()}
        runs, incomplete = load_runs(args.runs)
        runs = filter_runs(runs, where) if where else runs
        if not runs:
            raise PlotError(
                f"no completed runs under {', '.join(args.runs)}"
                + (f" matching {' '.join(args.where)}" if where else "")
                + (f" ({incomplete} incomplete)" if incomplete else "")
            )
        trace = tuple(canonical_key(k.strip()) for k in args.trace.split(",") if k.strip())
        note = ", ".join(f"{k} = {v}" for k, v in where.items())
        figures = build_figures(args.kind, runs, metric=args.metric or None, trace=trace, note=note)
        if not figures:
            raise PlotError(f"none of the {len(runs)} runs fits a {args.kind} figure (see `silofl plot --help`)")
        first = Path(args.runs[0])
        out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "plots"
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        paths = save_figures(figures, out, formats)
    except (PlotError, SweepError) as exc:
        print(f"silofl plot: {exc}", file=sys.stderr)
        return 2
    skipped = f"; {incomplete} incomplete run(s) skipped" if incomplete else ""
    print(f"{len(runs)} runs{skipped}; wrote:")
    for path in paths:
        print(f"  {path}")
    return 0
