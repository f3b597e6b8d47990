"""server/analysis.py: Pareto fronts, lower envelopes and the reduction at matched test error against hand-computed
numbers, and the means over seeds a point is made of."""

from __future__ import annotations

from pathlib import Path

import pytest

from silofl.server.analysis import (
    lower_envelope,
    matched_error_reduction,
    mean_or_none,
    mean_points,
    pareto_front,
)
from silofl.server.plots.runs import RunRecord

# SteFFLe's points (test error, violation): the front is (0.15, 0.20), (0.16, 0.10), (0.18, 0.04); (0.17, 0.12) and
# (0.20, 0.06) are dominated; the error range is [0.15, 0.20].
STEFFLE = [(0.15, 0.20), (0.16, 0.10), (0.17, 0.12), (0.18, 0.04), (0.20, 0.06)]


def test_pareto_front_drops_dominated_points():
    assert pareto_front(STEFFLE) == [(0.15, 0.20), (0.16, 0.10), (0.18, 0.04)]
    assert pareto_front([(0.1, 0.3), (0.1, 0.2), (0.2, 0.2)]) == [(0.1, 0.2)]  # ties: the lower, once


def test_lower_envelope_interpolates_the_front_and_stays_flat_after_it():
    assert lower_envelope(STEFFLE, 0.15) == pytest.approx(0.20)
    assert lower_envelope(STEFFLE, 0.155) == pytest.approx(0.15)  # halfway between 0.20 and 0.10
    assert lower_envelope(STEFFLE, 0.17) == pytest.approx(0.07)  # front, not the dominated 0.12
    assert lower_envelope(STEFFLE, 0.19) == pytest.approx(0.04)  # after the front: its lowest violation
    assert lower_envelope(STEFFLE, 0.149) is None  # below the range: no extrapolation
    assert lower_envelope(STEFFLE, 0.201) is None
    assert lower_envelope([], 0.1) is None


def test_matched_error_reduction_hand_computed():
    # baseline points: 0.14 is below SteFFLe's range, 0.21 above; 0.16 has zero violation
    baseline = [(0.155, 0.25), (0.17, 0.14), (0.19, 0.05), (0.14, 0.30), (0.21, 0.01), (0.16, 0.0)]
    red = matched_error_reduction(STEFFLE, baseline)
    # 1 - 0.15/0.25 = 0.4; 1 - 0.07/0.14 = 0.5; 1 - 0.04/0.05 = 0.2; mean 1.1 / 3
    assert [p.reduction for p in red.matched] == pytest.approx([0.4, 0.5, 0.2])
    assert red.mean == pytest.approx(1.1 / 3)
    assert (len(red.matched), red.total, red.below, red.above, red.zero) == (3, 6, 1, 1, 1)
    assert red.text() == "36.7% (3/6)"


def test_matched_error_reduction_negative_when_steffle_is_worse_and_na_without_overlap():
    red = matched_error_reduction([(0.1, 0.2), (0.2, 0.1)], [(0.15, 0.10)])
    assert red.mean == pytest.approx(1 - 0.15 / 0.10)  # SteFFLe 0.15 at error 0.15: 50% more violation
    none = matched_error_reduction([(0.1, 0.2), (0.2, 0.1)], [(0.05, 0.3), (0.3, 0.3)])
    assert none.mean is None
    assert none.text() == "n/a (0/2: 1 below SteFFLe's error range, 1 above SteFFLe's error range)"


def test_mean_or_none_skips_missing_values():
    assert mean_or_none([0.2, None, 0.4]) == pytest.approx(0.3)
    assert mean_or_none([None, None]) is None
    assert mean_or_none([]) is None


def _record(method: str, lam: float, seed: int, error: float, violation: float) -> RunRecord:
    config = {"algorithm": method, "lambda": lam, "seed": seed, "out-dir": f"runs/{method}-{lam}-{seed}"}
    return RunRecord(Path(config["out-dir"]), method, config, {"error": error, "dp_violation": violation})


def test_mean_points_average_the_seeds_of_each_configuration():
    records = [
        _record("steffle", 0.0, 0, 0.10, 0.30),
        _record("steffle", 0.0, 1, 0.20, 0.10),  # same configuration, another seed: one point
        _record("steffle", 1.0, 0, 0.30, 0.05),
        _record("fedavg", 0.0, 0, 0.12, 0.40),
    ]
    points = mean_points(records, "dp_violation")
    assert sorted(points) == ["fedavg", "steffle"]
    first, second = points["steffle"]  # sorted by label: lambda 0, then lambda 1
    assert (first.label, first.seeds, second.label, second.seeds) == ("lambda 0", 2, "lambda 1", 1)
    assert first.xy == pytest.approx((0.15, 0.20))
    assert first.error[1] == pytest.approx(0.0707, abs=1e-4)  # sample sd of 0.10 and 0.20
    assert second.xy == pytest.approx((0.30, 0.05))
    assert [(p.label, p.seeds, p.xy) for p in points["fedavg"]] == [("-", 1, (0.12, 0.40))]
