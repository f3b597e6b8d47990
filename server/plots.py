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
- ``fedsc`` (FedSC): bars of the linear-probe accuracy (`final.accuracy`), one bar per method and configuration
  (every config key but the seed: a non-private run is never averaged with a private one), error bars over seeds.
- ``run``: the per-round curves of single runs (`result.json`'s `rounds`: test accuracy, kNN accuracy, test loss,
  fairness violations, epsilon spent, whichever were recorded), one panel per metric, several runs overlaid.

A run's method is the name its sweep gave it (`run.json`), else a label from its config (`steffle` with one silo is
`dp-fermi`, or `fermi` without noise). Runs that do not depend on a panel's key appear in every panel of that key:
a non-private run (epsilon = inf) in every epsilon column, a one-silo run in every heterogeneity row. Labels name the
method and only what differs between the curves or bars (`distinguishing_labels`): "non-private" / "eps 6" when the
privacy levels differ, then the keys a method varies; a key a run does not have is left out, never shown as None.
Legends are placed below the panels and sized to fit the figure (labels wrapped, columns measured), and figures are
saved with ``bbox_inches="tight"``. `silofl plot` puts a `--where` slice in the file names (or writes the `--out`
file given), so a sliced figure never replaces the unsliced one, and says which files it replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when the CLI starts
    from matplotlib.figure import Figure

FIGURE_KINDS = ("fairness", "privacy", "mu2", "fedsc")
#: What `silofl plot` draws: the figures of `FIGURE_KINDS` (over many runs) and `run` (per-round curves).
PLOT_KINDS = (*FIGURE_KINDS, "run")
#: Keys that trace a method's fairness/utility trade-off (the points of one curve), in order of preference.
TRACE_KEYS = ("lambda", "dual-lr")
#: Config keys that never distinguish runs (where they ran, how long the server waits).
_IGNORED_KEYS = frozenset({"out-dir", "data-dir", "round-timeout"})
#: Keys that place a run in a figure or panel (or average it, the seed): they never split a method into curves.
_PANEL_KEYS = frozenset({"dataset", "fairness", "heterogeneity", "epsilon", "seed"})
#: Keys that make a run's privacy level: labels show them as one part ("non-private", "eps 6", "rho 4").
_PRIVACY_KEYS = frozenset({"epsilon", "rho", "delta", "accountant"})
METRIC_LABELS = {
    "error": "test error",
    "accuracy": "test accuracy",
    "loss": "test loss",
    "dp_violation": "demographic parity violation",
    "eo_violation": "equalized odds violation",
    "eopp_violation": "equal opportunity violation",
    "knn_accuracy": "kNN accuracy",
}
#: The per-round metrics of `silofl plot run` (keys of result.json's `rounds` entries), one panel each, in this order.
ROUND_METRICS = {
    "accuracy": "test accuracy",
    "knn_accuracy": "kNN accuracy",
    "loss": "test loss",
    "dp_violation": "demographic parity violation",
    "eo_violation": "equalized odds violation",
    "eopp_violation": "equal opportunity violation",
    "epsilon_spent": "epsilon spent (cumulative)",
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
    #: result.json's per-round entries (read with `load_runs(..., with_rounds=True)`, for `silofl plot run`).
    rounds: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)
    #: False for a run that stopped before its last round (kept by `load_runs(..., keep_incomplete=True)`).
    completed: bool = True

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
    for name, info in spec.config_model.model_fields.items():
        if info.default is PydanticUndefined:
            continue
        value = info.default
        out[info.alias or name] = "inf" if isinstance(value, float) and math.isinf(value) else value
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


def load_runs(
    paths: Iterable[str | Path], *, with_rounds: bool = False, keep_incomplete: bool = False
) -> tuple[list[RunRecord], int]:
    """The completed runs under `paths` (run folders or folders of run folders) and the number of incomplete ones;
    `with_rounds` also reads each run's per-round entries, `keep_incomplete` keeps (and counts) incomplete runs."""
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
            completed = bool((result.get("status") or {}).get("completed", True))
            if not completed:
                incomplete += 1
                if not keep_incomplete:
                    continue
            config = normalized_config(result.get("config") or {}, defaults)
            meta_path = path.parent / "run.json"
            method = None
            if meta_path.is_file():
                try:
                    method = json.loads(meta_path.read_text()).get("method")
                except (OSError, json.JSONDecodeError):
                    method = None
            rounds = tuple(r for r in result.get("rounds") or () if isinstance(r, dict)) if with_rounds else ()
            records.append(
                RunRecord(
                    path.parent,
                    str(method or default_method(config)),
                    config,
                    dict(result.get("final") or {}),
                    rounds,
                    completed,
                )
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


def _curve_label(run: RunRecord, split: Sequence[str], mixed_privacy: bool = False) -> str:
    """`method (key value, ...)` for the keys in `split` the run has (a key it lacks is left out, never "None");
    `mixed_privacy` (its method has private and non-private runs) adds "non-private" to the non-private ones."""
    extra = [f"{k} {_fmt(run.get(k))}" for k in split if run.get(k) is not None]
    if mixed_privacy and not run.private and "non-private" not in run.method:
        extra.append("non-private")
    return _compose(run.method, extra)


def _compose(method: str, parts: Sequence[str]) -> str:
    return f"{method} ({', '.join(parts)})" if parts else method


def _mixed_privacy(runs: Iterable[RunRecord]) -> set[str]:
    """The methods with both private and non-private runs among `runs`."""
    levels: dict[str, set[bool]] = defaultdict(set)
    for run in runs:
        levels[run.method].add(run.private)
    return {method for method, seen in levels.items() if len(seen) > 1}


def privacy_text(config: Mapping[str, Any]) -> str:
    """A run's privacy level in words: "rho 4" (DP-mu2-FL), "eps 6", or "non-private" (no epsilon, or inf)."""
    rho = config.get("rho")
    if rho is not None and _float(rho) > 0:
        return f"rho {_fmt(_float(rho))}"
    epsilon = config.get("epsilon")
    epsilon = math.inf if epsilon is None else _float(epsilon)
    return f"eps {_fmt(epsilon)}" if math.isfinite(epsilon) else "non-private"


def _privacy_order(config: Mapping[str, Any]) -> tuple[int, float]:
    """Sort key: non-private first, then by epsilon (rho) from the least private."""
    text = privacy_text(config)
    return (0, 0.0) if text == "non-private" else (1, -float(text.split()[1]))


def distinguishing_labels(
    methods: Sequence[str], configs: Sequence[Mapping[str, Any]], *, skip: Iterable[str] = ()
) -> list[str]:
    """Readable labels for groups of runs (one method name and config each), naming only what differs between them:

    the method; the privacy level ("non-private", "eps 6", "rho 4") when the groups' levels differ; then, per method,
    the keys whose value differs between that method's groups (`key value`; a group without the key shows nothing
    for it, never "None"). Groups that would still share a label get the keys that tell them apart (`no key` for a
    group without it). Keys in `skip`, and those that never distinguish runs (out-dir, ...), are not shown."""
    skipped = frozenset(skip) | _IGNORED_KEYS
    n = len(configs)
    parts: list[list[str]] = [[] for _ in range(n)]
    privacy = [privacy_text(c) for c in configs]
    if len(set(privacy)) > 1:
        for i in range(n):
            if privacy[i] not in methods[i]:  # (a name of the papers' may say it: "steffle (non-private)")
                parts[i].append(privacy[i])
    by_method: dict[str, list[int]] = defaultdict(list)
    for i, method in enumerate(methods):
        by_method[method].append(i)
    for indices in by_method.values():
        for key in _ordered_keys(configs[i] for i in indices):
            if key in skipped or key in _PRIVACY_KEYS:
                continue
            present = [i for i in indices if configs[i].get(key) is not None]
            if len({json.dumps(configs[i][key]) for i in present}) > 1:
                for i in present:
                    parts[i].append(f"{key} {_fmt(configs[i][key])}")
    labels = [_compose(methods[i], parts[i]) for i in range(n)]
    for indices in _group(range(n), lambda i: labels[i]).values():
        if len(indices) < 2:
            continue
        for key in _ordered_keys(configs[i] for i in indices):
            if key in skipped or len({json.dumps(configs[i].get(key)) for i in indices}) < 2:
                continue
            for i in indices:
                value = configs[i].get(key)
                parts[i].append(f"{key} {_fmt(value)}" if value is not None else f"no {key}")
        for i in indices:
            labels[i] = _compose(methods[i], parts[i])
    return labels


def _ordered_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for config in configs for k in config))


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


def _group(runs: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for run in runs:
        out[key(run)].append(run)
    return out


class _Colors:
    """One colour (and marker) per curve label, the same in every panel of a figure."""

    MARKERS = "osD^vP*Xh<>p"

    def __init__(self, labels: Iterable[str], *, ordered: bool = False) -> None:
        from matplotlib import colormaps

        unique = list(dict.fromkeys(labels)) if ordered else sorted(set(labels))
        cmap = colormaps["tab10"] if len(unique) <= 10 else colormaps["tab20"]
        self.style = {label: (cmap(i % cmap.N), self.MARKERS[i % len(self.MARKERS)]) for i, label in enumerate(unique)}


def _new_figure(rows: int, cols: int, *, width: float = 4.2, height: float = 3.4) -> tuple[Figure, list[list[Any]]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols + 0.6, height * rows + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [list(row) for row in axes]


#: Legend labels are wrapped at this many characters.
LEGEND_WRAP = 40


def _legend(fig: Figure, axes: Sequence[Sequence[Any]], *, fontsize: float = 9) -> Any:
    """One legend for the figure (each label once, in the order drawn), below the panels, fitted to the figure:
    labels wrapped at `LEGEND_WRAP` characters, as many columns as the figure's width holds (measured, not guessed),
    and the figure made wider (a single column wider than it) or taller (a tall legend) when needed, so no label is
    clipped. Returns the legend (None without labels)."""
    handles, labels = {}, []
    for row in axes:
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                if label not in handles and not label.startswith("_"):
                    handles[label] = handle
                    labels.append(label)
    if not labels:
        return None
    wrapped = [textwrap.fill(label, LEGEND_WRAP, break_on_hyphens=False) for label in labels]
    renderer = fig.canvas.get_renderer()
    room = 0.96 * fig.bbox.width
    ncols = len(wrapped)
    while True:
        legend = fig.legend(
            [handles[label] for label in labels], wrapped, loc="outside lower center", ncols=ncols, fontsize=fontsize
        )
        box = legend.get_window_extent(renderer)
        if box.width <= room or ncols == 1:
            break
        legend.remove()
        ncols = max(1, min(ncols - 1, int(ncols * room / box.width)))
    if box.width > room:
        fig.set_figwidth(box.width / fig.dpi / 0.96 + 0.2)
    extra = box.height / fig.dpi - 0.5  # _new_figure leaves room for a legend of about two rows
    if extra > 0:
        fig.set_figheight(fig.get_figheight() + extra)
    return legend


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
        mixed = _mixed_privacy(group)
        label_of = {
            id(r): _curve_label(r, _split(varied[r.method], _PANEL_KEYS, trace), r.method in mixed) for r in group
        }
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
        mixed = _mixed_privacy(group)  # their non-private runs: a dashed line of their own, labelled non-private
        label_of = {id(r): _curve_label(r, _split(varied[r.method], _PANEL_KEYS, ()), r.method in mixed) for r in group}
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
                    dashed = label if "non-private" in label else f"{label}, non-private"
                    ax.axhline(mean, color=color, linestyle="--", linewidth=1, label=dashed)
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
#: Config keys that never make two runs' configurations different (seeds are averaged, the rest is bookkeeping).
_NOT_CONFIGURATION = frozenset({"seed"}) | _IGNORED_KEYS | _EVALUATION_ONLY_KEYS


def _value_order(value: Any) -> tuple[int, float, str]:
    """Sort key of one config value: numbers numerically, then text, then a missing value (None)."""
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _config_order(item: tuple[tuple, Any]) -> tuple:
    """Sort key of a (configuration values, runs) pair: numbers numerically, anything else as text, never mixed."""
    return tuple(_value_order(v) for v in item[0])


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
    runs = [r for r in runs if in_plot(r, "fedsc") and _has(r, metric)]
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
            "\n".join(f"{k} {_fmt(v)}" for k, v in zip(x_keys, target, strict=True) if v is not None)
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


def run_labels(runs: Sequence[RunRecord]) -> list[str]:
    """One label per run: its method and what differs from the other runs (`distinguishing_labels`, the seed
    included); runs with the same configuration are told apart by their folder names; an incomplete run says so."""
    labels = distinguishing_labels([r.method for r in runs], [r.config for r in runs])
    for indices in _group(range(len(runs)), lambda i: labels[i]).values():
        if len(indices) > 1:
            for i in indices:
                labels[i] = f"{labels[i]}: {runs[i].folder.name}"
    return [label if run.completed else f"{label} (incomplete)" for label, run in zip(labels, runs, strict=True)]


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


def build_figures(
    kind: str,
    runs: Sequence[RunRecord],
    *,
    metric: str | None = None,
    trace: Sequence[str] = TRACE_KEYS,
    note: str = "",
) -> list[tuple[str, Figure]]:
    """The figures of `kind` for `runs`: (file stem, Figure) pairs; `note` (e.g. the `--where` slice) is added to
    each title. For `run`, `metric` is a comma-separated list of `ROUND_METRICS` (default: all recorded)."""
    if kind == "fairness":
        figures = fairness_figures(runs, trace=trace)
    elif kind == "privacy":
        figures = privacy_figures(runs, metric=metric or "error")
    elif kind == "mu2":
        figures = mu2_figures(runs, metric=metric or "accuracy")
    elif kind == "fedsc":
        figures = fedsc_figures(runs, metric=metric or "accuracy")
    elif kind == "run":
        figures = run_figures(runs, metrics=[m.strip() for m in (metric or "").split(",") if m.strip()] or None)
    else:
        raise PlotError(f"unknown figure kind {kind!r}; choose one of {', '.join(PLOT_KINDS)}")
    if note:
        for _, fig in figures:
            title = f"{fig.get_suptitle()}; {note}"
            wrap = max(40, int(fig.get_figwidth() * 12))  # about 12 characters per inch at 11 points
            fig.suptitle("\n".join(textwrap.fill(line, wrap) for line in title.split("\n")), fontsize=11)
    return figures


def _unique_stems(figures: Sequence[tuple[str, Figure]]) -> list[tuple[str, Figure]]:
    """`figures` with a repeated stem numbered (-2, -3, ...), so one call never writes two figures to one file."""
    seen: dict[str, int] = {}
    out = []
    for stem, fig in figures:
        seen[stem] = seen.get(stem, 0) + 1
        out.append((stem if seen[stem] == 1 else f"{stem}-{seen[stem]}", fig))
    return out


def _write(fig: Figure, path: Path) -> None:
    """Save with the bounding box of everything drawn (legend, long tick labels, title): nothing clipped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight", pad_inches=0.1)


def save_figures(
    figures: Sequence[tuple[str, Figure]], out: Path, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Write each figure as out/<stem>.<format> (repeated stems numbered); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, fig in _unique_stems(figures):
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            _write(fig, path)
            paths.append(path)
    return paths


def _image_suffix(path: Path) -> str | None:
    """The image format `path` names by its suffix (`fig.png`), or None (a folder)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = path.suffix.lower().lstrip(".")
    return suffix if suffix in FigureCanvasBase.get_supported_filetypes() else None


def save_to(figures: Sequence[tuple[str, Figure]], out: Path, formats: Sequence[str]) -> list[Path]:
    """`silofl plot`'s output: `out` is a folder (each figure as <stem>.<format>, `save_figures`), or an image file
    (`fig.png`: the one figure there, in that format; several figures as fig-<stem>.png)."""
    fmt = _image_suffix(out)
    if fmt is None:
        return save_figures(figures, out, formats)
    figures = _unique_stems(figures)
    paths = []
    for stem, fig in figures:
        path = out if len(figures) == 1 else out.with_name(f"{out.stem}-{stem}{out.suffix}")
        _write(fig, path)
        paths.append(path)
    return paths


def _slice_suffix(where: Mapping[str, str]) -> str:
    """The file-name part of a `--where` slice: `__lambda=1_dual-lr=0.01`."""
    text = "_".join(f"{k}={v}" for k, v in where.items())
    return "__" + (re.sub(r"[^A-Za-z0-9.+=_-]+", "", text) or "slice")


def _runs_stem(runs: Sequence[RunRecord]) -> str:
    """`silofl plot run`'s default file stem: `rounds` for one run, else `rounds-<run folders>` (shortened with a
    hash when long), so plotting other runs into the same folder does not replace the figure."""
    if len(runs) == 1:
        return "rounds"
    names = "+".join(re.sub(r"[^A-Za-z0-9.+=_-]+", "", r.folder.name) or "run" for r in runs)
    if len(names) <= 80:
        return f"rounds-{names}"
    digest = hashlib.sha1(names.encode()).hexdigest()[:8]
    return f"rounds-{names[:40].rstrip('+')}-and-{len(runs) - 1}-more-{digest}"


# -- command line -----------------------------------------------------------------------------------------------------


def add_plot_parser(subparsers: Any) -> None:
    """`silofl plot KIND RUN_DIR... [--out DIR|FILE] [--where KEY=VALUE] [--metric M] [--trace KEYS] [--formats ...]`;
    KIND `run` draws the per-round curves of the given runs."""
    import argparse

    p = subparsers.add_parser(
        "plot",
        help="draw the papers' figures, or a run's per-round curves, from run folders (PNG and SVG)",
        description="Draw figures from the result.json files under RUN_DIR (a sweep's out dir or run folders); "
        "`silofl plot run RUN_DIR [RUN_DIR ...] [--out FILE]` draws their per-round curves (one panel per metric, "
        "the runs overlaid).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "kind",
        choices=PLOT_KINDS,
        help="fairness, privacy (utility vs epsilon), mu2 (tables), fedsc, run (per-round curves of runs)",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or folders holding run folders")
    p.add_argument(
        "--out",
        default="",
        help="output folder, or an image file (fig.png: that file only) (default: RUN_DIR/plots for the first "
        "RUN_DIR; a --where slice is added to the file names)",
    )
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep runs with this config value (methods that do not vary KEY are kept whole)",
    )
    p.add_argument(
        "--metric",
        default="",
        help="y metric: "
        + ", ".join(METRIC_LABELS)
        + " (default per kind); for `run`, a comma-separated list of "
        + ", ".join(ROUND_METRICS)
        + " (default: every one recorded)",
    )
    p.add_argument("--trace", default=",".join(TRACE_KEYS), help="keys that trace a curve (fairness figures)")
    p.add_argument("--formats", default="png,svg", help="comma-separated image formats (for an --out folder)")
    p.set_defaults(func=plot_command)


def plot_command(args: Any) -> int:
    from server.sweep import SweepError, canonical_key, parse_where

    per_run = args.kind == "run"
    try:
        where = {canonical_key(k): v for k, v in parse_where(args.where).items()}
        runs, incomplete = load_runs(args.runs, with_rounds=per_run, keep_incomplete=per_run)
        runs = filter_runs(runs, where) if where else runs
        if not runs:
            raise PlotError(
                f"no {'' if per_run else 'completed '}runs under {', '.join(args.runs)}"
                + (f" matching {' '.join(args.where)}" if where else "")
                + (f" ({incomplete} incomplete)" if incomplete and not per_run else "")
            )
        trace = tuple(canonical_key(k.strip()) for k in args.trace.split(",") if k.strip())
        note = ", ".join(f"{k} = {v}" for k, v in where.items())
        figures = build_figures(args.kind, runs, metric=args.metric or None, trace=trace, note=note)
        if not figures:
            what = "has per-round metrics" if per_run else f"fits a {args.kind} figure"
            raise PlotError(f"none of the {len(runs)} runs {what} (see `silofl plot --help`)")
        if per_run:
            figures = [(_runs_stem(runs), fig) for _, fig in figures]
        if where:  # a slice never replaces the unsliced figure
            figures = [(stem + _slice_suffix(where), fig) for stem, fig in figures]
        first = Path(args.runs[0])
        out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "plots"
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        folder = out if _image_suffix(out) is None else out.parent
        existing = set(folder.iterdir()) if folder.is_dir() else set()
        paths = save_to(figures, out, formats)
    except (PlotError, SweepError) as exc:
        print(f"silofl plot: {exc}", file=sys.stderr)
        return 2
    skipped = f"; {incomplete} incomplete run(s) skipped" if incomplete and not per_run else ""
    print(f"{len(runs)} runs{skipped}; wrote:")
    for path in paths:
        print(f"  {path}" + ("  (replaced the file there before)" if path in existing else ""))
    return 0
