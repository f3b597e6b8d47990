"""Comparing methods by their (test error, fairness violation) points: Pareto fronts, lower envelopes, the reduction in
violation at matched test error, and the means over seeds the points are made of.

Pure functions over points and run records (no file is read, nothing drawn). `benchmarks/results*.py` build
docs/RESULTS.md's tables on them; they are here, not in one study's script, because every comparison of a trade-off
curve against another (SteFFLe against its baselines, separate sensitive parties against silos) uses the same rule.
Run folders are read by `server.plots.runs`.

The reference curve is called SteFFLe's, as in the paper whose rule this is (:func:`matched_error_reduction`); any
method's points can play that part.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from silofl.server.plots.grouping import PANEL_KEYS
from silofl.server.plots.labels import fmt
from silofl.server.plots.runs import RunRecord, mean_sd, varied_keys

Point = tuple[float, float]  # (test error, fairness violation), each the mean over seeds


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The points no other point beats in both test error and violation, sorted by error (violations decreasing).

    A point is kept iff its violation is strictly below that of every point with a smaller (or equal) error; among
    points with the same error only the lowest violation can be kept.
    """
    front: list[Point] = []
    for error, violation in sorted(points):  # by error, then violation: the first of equal errors is the lowest
        if not front or violation < front[-1][1]:
            front.append((error, violation))
    return front


def lower_envelope(points: Sequence[Point], error: float) -> float | None:
    """SteFFLe's violation at test error `error`: its Pareto front, linearly interpolated between front points and
    flat after the last one (the lowest violation reached at an error <= `error`); None outside the error range of
    `points` (below the smallest error or above the largest: no extrapolation)."""
    if not points:
        return None
    lo, hi = min(e for e, _ in points), max(e for e, _ in points)
    if not lo <= error <= hi:
        return None
    front = pareto_front(points)
    if error >= front[-1][0]:
        return front[-1][1]
    for (e0, v0), (e1, v1) in itertools.pairwise(front):
        if e0 <= error <= e1:
            return v0 if e1 == e0 else v0 + (v1 - v0) * (error - e0) / (e1 - e0)
    raise AssertionError("unreachable: error lies in [front[0], front[-1]]")  # pragma: no cover


@dataclass(frozen=True)
class MatchedPoint:
    """One baseline point matched to SteFFLe's curve at the same test error."""

    error: float
    baseline_violation: float
    steffle_violation: float

    @property
    def reduction(self) -> float:
        return 1.0 - self.steffle_violation / self.baseline_violation


@dataclass(frozen=True)
class Reduction:
    """The reduction in fairness violation at matched test error of SteFFLe against one baseline (one panel)."""

    matched: tuple[MatchedPoint, ...]
    total: int  # baseline points
    below: int  # baseline points with a test error below SteFFLe's smallest: not matched
    above: int  # baseline points with a test error above SteFFLe's largest: not matched
    zero: int  # matched in error but with zero violation: no relative reduction defined

    @property
    def mean(self) -> float | None:
        """Mean of 1 - v_SteFFLe(e) / v_baseline over the matched points; None when none matched."""
        if not self.matched:
            return None
        return sum(p.reduction for p in self.matched) / len(self.matched)

    def text(self, reference: str = "SteFFLe") -> str:
        """`48.2% (2/3)`: the mean reduction and matched / baseline points; `n/a (0/1: ...)` when none matched
        (`reference`: whose curve the points were matched to)."""
        count = f"{len(self.matched)}/{self.total}"
        if self.total == 0:
            return "no runs"
        if self.mean is not None:
            return f"{100 * self.mean:.1f}% ({count})"
        reasons = [
            f"{n} {what}"
            for n, what in (
                (
                    self.below,
                    f"below {reference}' error range"
                    if reference.endswith("s")
                    else f"below {reference}'s error range",
                ),
                (
                    self.above,
                    f"above {reference}' error range"
                    if reference.endswith("s")
                    else f"above {reference}'s error range",
                ),
                (self.zero, "with zero violation"),
            )
            if n
        ]
        return f"n/a ({count}: {', '.join(reasons) or f'no {reference} point'})"


def matched_error_reduction(steffle: Sequence[Point], baseline: Sequence[Point]) -> Reduction:
    """Reduction in fairness violation of SteFFLe against a baseline at matched test error.

    The SteFFLe paper (Section 5, "Average results") says only this about how its numbers were computed:

        "we calculated the performance gain with respect to fairness violation (for fixed accuracy level) that our
        model yields over all the datasets. We obtained reductions in demographic parity violations of around
        75.47% and 52.93% compared with Tran et al. [2021] and Ling et al. [2024]. [...] We also obtained an
        average reduction in equalized odds violation of 95.42% compared to Ling et al. [2024]."

    and in the introduction: "the equalized odds fairness violation of our algorithm was 95% lower than the
    previous state-of-the-art [Ling et al., 2024] for the same fixed accuracy level". So: a relative reduction of
    the violation, at a fixed accuracy (equivalently test error), averaged. It does not say how the accuracy levels
    are matched; this function uses the standard choice:

    - `steffle` and `baseline` are points (test error, violation), each the mean over seeds of one configuration
      (one lambda for SteFFLe, one dual step for Tran et al., the single point of FedAvg, ...);
    - SteFFLe's trade-off curve is its lower envelope (:func:`lower_envelope`): the Pareto front of its points,
      linearly interpolated between front points and flat after the last one;
    - every baseline point whose test error e lies inside SteFFLe's error range [min, max] is matched: its
      reduction is 1 - v_SteFFLe(e) / v_baseline (negative when SteFFLe's violation is higher); points outside the
      range are not matched (no extrapolation) and are counted in `below` / `above`; a point with zero violation
      has no relative reduction and is counted in `zero`;
    - the result is the mean over the matched points (:attr:`Reduction.mean`), with the number of matched points.
    """
    matched, below, above, zero = [], 0, 0, 0
    lo = min((e for e, _ in steffle), default=math.inf)
    hi = max((e for e, _ in steffle), default=-math.inf)
    for error, violation in baseline:
        if error < lo:
            below += 1
            continue
        if error > hi:
            above += 1
            continue
        if violation <= 0.0:
            zero += 1
            continue
        value = lower_envelope(steffle, error)
        assert value is not None  # inside the range
        matched.append(MatchedPoint(error, violation, value))
    return Reduction(tuple(matched), len(baseline), below, above, zero)


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None; None when there are none (a panel without a matched point)."""
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def lowest_within_budget(
    by_value: Mapping[float, tuple[float, ...]], budget: float, reference: float = 0.0
) -> tuple[float, tuple[float, ...]]:
    """A fixed error budget: among the points of one curve by their trade-off value (lambda -> (mean test error,
    ..., the violation to minimise)), the value and point of the lowest last entry among those whose error is at most
    the `reference` value's (lambda 0: no fairness term) plus `budget`; the reference itself always qualifies, a tie
    goes to the smaller value."""
    ceiling = by_value[reference][0] + budget
    within = {value: point for value, point in by_value.items() if point[0] <= ceiling}
    return min(within.items(), key=lambda kv: (kv[1][-1], kv[0]))


# -- means over seeds --------------------------------------------------------------------------------------------------


@dataclass
class MeanPoint:
    """One configuration (all config keys but the seed): its label and the mean ± sd over seeds."""

    method: str
    label: str
    seeds: int
    error: tuple[float, float]
    violation: tuple[float, float]

    @property
    def xy(self) -> Point:
        return (self.error[0], self.violation[0])


_SEED_FREE = frozenset({"seed", "out-dir", "data-dir", "round-timeout"})


def mean_points(records: Sequence[RunRecord], metric: str) -> dict[str, list[MeanPoint]]:
    """Per method, one point per configuration (the runs that differ only in the seed): mean ± sd of the test error
    and of `metric` over the seeds; labelled by the keys the method varies apart from the panel keys (lambda, ...)."""
    varied = varied_keys(records)
    groups: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for record in records:
        key = json.dumps({k: v for k, v in record.config.items() if k not in _SEED_FREE}, sort_keys=True)
        groups[(record.method, key)].append(record)
    out: dict[str, list[MeanPoint]] = defaultdict(list)
    for (method, _), runs in groups.items():
        keys = [k for k in varied[method] if k not in PANEL_KEYS]
        label = ", ".join(f"{k} {fmt(runs[0].get(k))}" for k in keys) or "-"
        out[method].append(
            MeanPoint(
                method,
                label,
                len(runs),
                mean_sd([r.final["error"] for r in runs]),
                mean_sd([r.final[metric] for r in runs]),
            )
        )
    for points in out.values():
        points.sort(key=lambda p: (p.label, p.error[0]))
    return dict(out)
