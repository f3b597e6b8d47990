"""Which runs go into which figure, panel and curve: figures by (dataset, fairness notion), panels by heterogeneity
and epsilon (a one-silo or non-private run in every panel of the key it does not depend on), curves by label, the
points of a curve traced by a trade-off key (`TRACE_KEYS`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from silofl.server.plots.runs import RunRecord
from silofl.server.run_result import as_float

#: Keys that trace a method's fairness/utility trade-off (the points of one curve), in order of preference.
TRACE_KEYS = ("lambda", "dual-lr")
#: Keys that place a run in a figure or panel (or average it, the seed): they never split a method into curves.
PANEL_KEYS = frozenset({"dataset", "fairness", "heterogeneity", "epsilon", "seed"})


def _group(runs: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """`runs` (or any items) by `key`, each group in the order given."""
    out: dict[Any, list[Any]] = defaultdict(list)
    for run in runs:
        out[key(run)].append(run)
    return out


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


def _curves(members: Sequence[RunRecord], label_of: Mapping[int, str]) -> list[tuple[str, list[RunRecord]]]:
    """`members` grouped by curve label, sorted by label."""
    return sorted(_group(members, lambda r: label_of[id(r)]).items())


def _split(varied: Sequence[str], panel_keys: Iterable[str], trace: Sequence[str]) -> list[str]:
    """The keys that split a method into several curves: what it varies, except panels, seeds and its trace key."""
    key = _trace_key(varied, trace)
    return [k for k in varied if k not in panel_keys and k != key]


def _trace_key(varied: Sequence[str], trace: Sequence[str]) -> str | None:
    """The first key of `trace` that a method varies (its curve's points), or None (a curve of one point)."""
    return next((k for k in trace if k in varied), None)


def in_panel(run: RunRecord, h: float, eps: float | None) -> bool:
    """A one-silo run belongs to every heterogeneity row, a non-private run to every epsilon column."""
    if int(run.get("num-silos")) > 1 and as_float(run.get("heterogeneity")) != h:
        return False
    return eps is None or not math.isfinite(run.epsilon) or run.epsilon == eps


def sort_key(value: Any) -> tuple[int, float, str]:
    """Sort key of a trace value: numbers (and "inf") numerically, then anything else as text."""
    try:
        return (0, as_float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))
