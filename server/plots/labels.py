"""The words on the figures: metric, fairness-notion and dataset names, values as text, and the labels of curves
and bars, which name the method and only what differs between them (`distinguishing_labels`)."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from silofl.server.plots.grouping import _group
from silofl.server.plots.runs import _IGNORED_KEYS, PlotError, RunRecord
from silofl.server.run_result import as_float

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


def _check_metric(metric: str) -> None:
    """Refuse a `--metric` without a label (not one the figures know)."""
    if metric not in METRIC_LABELS:
        raise PlotError(f"--metric {metric!r}: choose one of {', '.join(METRIC_LABELS)}")


def fmt(value: Any) -> str:
    """A config value as text: numbers short (`0.1`, `1e-05`, `inf`), anything else as it is."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        return "inf" if math.isinf(value) else f"{value:g}"
    return str(value)


def slug(*parts: Any) -> str:
    """`parts` as a file-name stem: each reduced to letters, digits, '.' and '+', joined by '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9.+]+", "", fmt(p)) or "x" for p in parts)


def _curve_label(run: RunRecord, split: Sequence[str], mixed_privacy: bool = False) -> str:
    """`method (key value, ...)` for the keys in `split` the run has (a key it lacks is left out, never "None");
    `mixed_privacy` (its method has private and non-private runs) adds "non-private" to the non-private ones."""
    extra = [f"{k} {fmt(run.get(k))}" for k in split if run.get(k) is not None]
    if mixed_privacy and not run.private and "non-private" not in run.method:
        extra.append("non-private")
    return _compose(run.method, extra)


def _compose(method: str, parts: Sequence[str]) -> str:
    """`method (part, part, ...)`, or the method alone without parts."""
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
    if rho is not None and as_float(rho) > 0:
        return f"rho {fmt(as_float(rho))}"
    epsilon = config.get("epsilon")
    epsilon = math.inf if epsilon is None else as_float(epsilon)
    return f"eps {fmt(epsilon)}" if math.isfinite(epsilon) else "non-private"


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
                    parts[i].append(f"{key} {fmt(configs[i][key])}")
    labels = [_compose(methods[i], parts[i]) for i in range(n)]
    for indices in _group(range(n), lambda i: labels[i]).values():
        if len(indices) < 2:
            continue
        for key in _ordered_keys(configs[i] for i in indices):
            if key in skipped or len({json.dumps(configs[i].get(key)) for i in indices}) < 2:
                continue
            for i in indices:
                value = configs[i].get(key)
                parts[i].append(f"{key} {fmt(value)}" if value is not None else f"no {key}")
        for i in indices:
            labels[i] = _compose(methods[i], parts[i])
    return labels


def _ordered_keys(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of `configs`, once each, in the order first seen."""
    return list(dict.fromkeys(k for config in configs for k in config))


def run_labels(runs: Sequence[RunRecord]) -> list[str]:
    """One label per run: its method and what differs from the other runs (`distinguishing_labels`, the seed
    included); runs with the same configuration are told apart by their folder names; an incomplete run says so."""
    labels = distinguishing_labels([r.method for r in runs], [r.config for r in runs])
    for indices in _group(range(len(runs)), lambda i: labels[i]).values():
        if len(indices) > 1:
            for i in indices:
                labels[i] = f"{labels[i]}: {runs[i].folder.name}"
    return [label if run.completed else f"{label} (incomplete)" for label, run in zip(labels, runs, strict=True)]


def _seeds_text(counts: Iterable[int]) -> str:
    """What a figure's points average, for its title: "mean ± sd over 3 seeds" (`counts`: runs per point)."""
    counts = sorted(set(counts))
    if not counts:
        return ""
    if counts == [1]:
        return "one seed (no error bars)"
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"mean ± sd over {n} seeds"


def _dataset_title(config: Mapping[str, Any]) -> str:
    """The dataset's name as the papers write it (a CSV path: its file name)."""
    name = str(config.get("dataset", "?"))
    return DATASET_NAMES.get(name, Path(name).name)
