"""Tests for protocols.fairness_metrics: hand-computed examples and a brute-force reference on raw records."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from silofl.protocols.fairness_metrics import FairnessReport, confusion_counts, fairness_from_counts


def _brute_force(s: np.ndarray, y: np.ndarray, yhat: np.ndarray, k: int, l_: int) -> dict[str, float]:
    """The definitions of steffle.md / SteFFLe eqs. (11)-(12) evaluated literally on raw records."""

    def gap(event: np.ndarray, condition: np.ndarray) -> float:
        best = 0.0
        for s1, s2 in itertools.combinations(range(k), 2):
            m1, m2 = condition & (s == s1), condition & (s == s2)
            if m1.sum() and m2.sum():
                best = max(best, abs(event[m1].mean() - event[m2].mean()))
        return best

    everyone = np.ones_like(s, dtype=bool)
    dp = max(gap(yhat == u, everyone) for u in range(l_))
    pos = [gap(yhat == u, y == u) for u in range(l_)]
    neg = [gap(yhat == u, y != u) for u in range(l_)]
    return {
        "dp_violation": dp,
        "eo_violation": max(max(pos), max(neg)),
        "eopp_violation": pos[1] if l_ == 2 else max(pos),
        "accuracy": float((y == yhat).mean()),
    }


def test_binary_hand_example_dp_only() -> None:
    # group 0: P[yhat=1] = 5/10, TPR = 4/6, FPR = 1/4; group 1: P[yhat=1] = 2/8, TPR = 2/3, FPR = 0/5
    counts = np.array([[[3, 1], [2, 4]], [[5, 0], [1, 2]]])
    report = fairness_from_counts(counts)
    assert report.n == 18
    assert report.accuracy == pytest.approx(14 / 18)
    assert report.error == pytest.approx(4 / 18)
    assert report.dp_violation == pytest.approx(0.25)
    assert report.eo_violation == pytest.approx(0.25)  # FPR gap |1/4 - 0|
    assert report.eopp_violation == pytest.approx(0.0, abs=1e-12)  # equal TPRs 4/6 = 2/3


def test_binary_hand_example_eo_without_dp() -> None:
    # both groups predict positive half the time (DP = 0) but group 1 is a coin flip: TPR 1 vs 0.5, FPR 0 vs 0.5
    counts = np.array([[[4, 0], [0, 4]], [[2, 2], [2, 2]]])
    report = fairness_from_counts(counts)
    assert report == FairnessReport(
        accuracy=0.75, error=0.25, dp_violation=0.0, eo_violation=0.5, eopp_violation=0.5, n=16
    )


def test_eopp_uses_positive_label_only_for_binary() -> None:
    # TPR equal (1/2 each) but TNR differs (1 vs 0): EOPP 0, EO 1
    counts = np.array([[[3, 0], [1, 1]], [[0, 3], [1, 1]]])
    report = fairness_from_counts(counts)
    assert report.eopp_violation == 0.0
    assert report.eo_violation == pytest.approx(1.0)


def test_three_groups_three_labels_hand_example_with_empty_group() -> None:
    counts = np.zeros((3, 3, 3), dtype=np.int64)
    counts[0] = [[2, 1, 1], [0, 2, 0], [1, 0, 1]]  # predicted shares 3/8, 3/8, 2/8; recalls 1/2, 1, 1/2
    counts[1] = [[1, 0, 1], [1, 1, 0], [0, 0, 2]]  # predicted shares 2/6, 1/6, 3/6; recalls 1/2, 1/2, 1
    # group 2 has no records: left out of every max rather than counted as rate 0 (which would give DP = 0.5)
    report = fairness_from_counts(counts)
    assert report.n == 14
    assert report.accuracy == pytest.approx(9 / 14)
    assert report.dp_violation == pytest.approx(0.25)  # label 2: 2/8 vs 3/6
    assert report.eopp_violation == pytest.approx(0.5)  # recall gaps 0, 1/2, 1/2
    assert report.eo_violation == pytest.approx(0.5)  # y != y' gaps are 0, 1/6, 1/12


def test_three_groups_y_not_equal_gap_dominates() -> None:
    # every group has perfect recall on label 0, so only the y != 0 conditional differs
    counts = np.zeros((3, 3, 3), dtype=np.int64)
    counts[0] = [[2, 0, 0], [0, 2, 0], [0, 0, 2]]
    counts[1] = [[2, 0, 0], [2, 0, 0], [0, 0, 2]]  # label 1 always predicted 0
    counts[2] = [[2, 0, 0], [0, 2, 0], [0, 1, 1]]
    report = fairness_from_counts(counts)
    # y' = 0, y != 0: P[yhat=0] = 0, 2/4, 0 -> 0.5; y' = 1, y = 1: recall 1, 0, 1 -> 1.0
    assert report.eo_violation == pytest.approx(1.0)
    assert report.eopp_violation == pytest.approx(1.0)
    # DP: label 0 shares 2/6, 4/6, 2/6 -> 1/3; label 1 shares 2/6, 0, 3/6 -> 1/2
    assert report.dp_violation == pytest.approx(0.5)


def test_independent_predictor_has_zero_dp() -> None:
    # 30% predicted positive in every group (3/10, 6/20, 9/30), however those predictions fall on the true labels
    counts = np.array([[[5, 2], [2, 1]], [[4, 4], [10, 2]], [[20, 0], [1, 9]]])
    report = fairness_from_counts(counts)
    assert report.dp_violation == pytest.approx(0.0, abs=1e-15)
    assert report.eo_violation > 0.5  # yet far from equalized odds: TPR 1/3 vs 1/6 vs 9/10


def test_constant_predictor_is_fair_everywhere() -> None:
    rng = np.random.default_rng(1)
    s, y = rng.integers(0, 4, 200), rng.integers(0, 3, 200)
    report = fairness_from_counts(confusion_counts(s, y, np.full(200, 2), 4, 3))
    assert (report.dp_violation, report.eo_violation, report.eopp_violation) == (0.0, 0.0, 0.0)
    assert report.accuracy == pytest.approx(np.mean(y == 2))


@pytest.mark.parametrize(("k", "l_", "seed"), [(2, 2, 0), (3, 2, 1), (2, 3, 2), (3, 3, 3), (4, 5, 4)])
def test_matches_brute_force_on_raw_records(k: int, l_: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 300
    s = rng.integers(0, k, n)
    y = rng.integers(0, l_, n)
    # predictions depend on s and y so that every violation is non-trivial
    yhat = np.where(rng.random(n) < 0.3 + 0.15 * s, y, rng.integers(0, l_, n))
    report = fairness_from_counts(confusion_counts(s, y, yhat, k, l_))
    expected = _brute_force(s, y, yhat, k, l_)
    assert report.n == n
    for field, value in expected.items():
        assert getattr(report, field) == pytest.approx(value, abs=1e-12), field
    assert report.dp_violation > 0 and report.eo_violation > 0


def test_confusion_counts_matches_manual_count() -> None:
    rng = np.random.default_rng(7)
    s, y, yhat = rng.integers(0, 3, 100), rng.integers(0, 3, 100), rng.integers(0, 3, 100)
    counts = confusion_counts(s, y, yhat, 3, 3)
    manual = np.zeros((3, 3, 3), dtype=np.int64)
    for a, b, c in zip(s, y, yhat, strict=True):
        manual[a, b, c] += 1
    assert counts.dtype == np.int64 and counts.shape == (3, 3, 3)
    np.testing.assert_array_equal(counts, manual)


def test_confusion_counts_small_explicit() -> None:
    counts = confusion_counts(np.array([0, 1, 1, 1]), np.array([1, 0, 0, 1]), np.array([1, 0, 1, 1]), 3, 2)
    expected = np.zeros((3, 2, 2), dtype=np.int64)
    expected[0, 1, 1] = 1
    expected[1, 0, 0] = 1
    expected[1, 0, 1] = 1
    expected[1, 1, 1] = 1
    np.testing.assert_array_equal(counts, expected)


def test_silo_counts_add_up_to_pooled_metrics() -> None:
    rng = np.random.default_rng(3)
    s, y, yhat = rng.integers(0, 2, 90), rng.integers(0, 2, 90), rng.integers(0, 2, 90)
    parts = [confusion_counts(s[i::3], y[i::3], yhat[i::3], 2, 2) for i in range(3)]
    assert fairness_from_counts(sum(parts)) == fairness_from_counts(confusion_counts(s, y, yhat, 2, 2))


def test_all_empty_is_zero() -> None:
    report = fairness_from_counts(np.zeros((2, 2, 2), dtype=np.int64))
    assert report == FairnessReport(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    assert confusion_counts(np.array([], dtype=int), np.array([], dtype=int), np.array([], dtype=int), 2, 2).sum() == 0


def test_single_non_empty_group_has_no_gap() -> None:
    counts = np.zeros((2, 2, 2), dtype=np.int64)
    counts[1] = [[3, 1], [2, 4]]
    report = fairness_from_counts(counts)
    assert (report.dp_violation, report.eo_violation, report.eopp_violation) == (0.0, 0.0, 0.0)
    assert report.accuracy == pytest.approx(0.7)


def test_integral_float_counts_are_accepted() -> None:
    counts = np.array([[[4, 0], [0, 4]], [[2, 2], [2, 2]]])
    assert fairness_from_counts(counts.astype(np.float64)) == fairness_from_counts(counts)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (np.zeros((2, 2)), "must be 3-D"),
        (np.zeros((2, 2, 3)), "square in its last two axes"),
        (np.array([[[1, -1], [0, 2]]]), "non-negative"),
        (np.array([[[1.5, 0.0], [0.0, 2.0]]]), "non-integral"),
        (np.array([[[np.nan, 0.0], [0.0, 2.0]]]), "non-finite"),
        (np.array([[["a", "b"], ["c", "d"]]]), "dtype"),
        (np.zeros((0, 2, 2)), "at least one group"),
    ],
)
def test_bad_counts_are_rejected(counts: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fairness_from_counts(counts)


def test_bad_records_are_rejected() -> None:
    ok = np.array([0, 1])
    with pytest.raises(ValueError, match=r"groups must lie in \[0, 1\], got values in \[0, 2\]"):
        confusion_counts(np.array([0, 2]), ok, ok, 2, 2)
    with pytest.raises(ValueError, match="labels has 3 entries but groups has 2"):
        confusion_counts(ok, np.array([0, 1, 1]), ok, 2, 2)
    with pytest.raises(ValueError, match="predictions must hold integer indices"):
        confusion_counts(ok, ok, np.array([0.0, 1.0]), 2, 2)
    with pytest.raises(ValueError, match="predictions must lie in"):
        confusion_counts(ok, ok, np.array([-1, 1]), 2, 2)
    with pytest.raises(ValueError, match="labels must be a 1-D array"):
        confusion_counts(ok, np.array([[0, 1]]), ok, 2, 2)
    with pytest.raises(ValueError, match="num_labels must be an integer >= 1"):
        confusion_counts(ok, ok, ok, 2, 0)


def test_group_report_supports_rates_and_min_support_violations() -> None:
    from silofl.protocols.fairness_metrics import group_report

    counts = np.zeros((3, 2, 2), dtype=np.int64)
    counts[0] = [[60, 20], [10, 30]]  # 120 records, predicted positive 50/120, TPR 30/40, FPR 20/80
    counts[1] = [[70, 10], [5, 15]]  # 100 records, predicted positive 25/100
    counts[2] = [[1, 0], [0, 9]]  # 10 records, predicted positive 9/10: decides every violation over all groups
    report = group_report(counts, min_support=100, group_names=["a", "b", "c"])
    assert report["min_support"] == 100 and report["groups_kept"] == ["a", "b"]
    every = fairness_from_counts(counts)
    assert (report["dp_violation"], report["eo_violation"], report["eopp_violation"]) == (
        every.dp_violation,
        every.eo_violation,
        every.eopp_violation,
    )
    assert report["dp_violation"] == pytest.approx(0.9 - 0.25)
    assert report["dp_violation_min_support"] == pytest.approx(50 / 120 - 0.25)
    kept = fairness_from_counts(counts[:2])
    assert report["eo_violation_min_support"] == kept.eo_violation
    assert report["eopp_violation_min_support"] == kept.eopp_violation
    a, b, c = report["groups"]
    assert (a["name"], a["support"], a["label_support"]) == ("a", 120, [80, 40])
    assert a["prediction_rate"] == pytest.approx([70 / 120, 50 / 120])
    assert a["prediction_rate_se"][1] == pytest.approx(np.sqrt((50 / 120) * (70 / 120) / 120))
    assert a["hit_rate"] == pytest.approx([60 / 80, 30 / 40])  # per label u: P[yhat=u | y=u]; [1] is the TPR
    assert a["false_rate"] == pytest.approx([10 / 40, 20 / 80])  # per label u: P[yhat=u | y!=u]; [1] is the FPR
    assert a["counts"] == [[60, 20], [10, 30]]
    assert (b["support"], c["support"]) == (100, 10)


def test_group_report_empty_groups_and_thresholds() -> None:
    from silofl.protocols.fairness_metrics import MIN_SUPPORT, group_report

    counts = np.zeros((3, 2, 2), dtype=np.int64)
    counts[0] = [[5, 5], [0, 10]]
    counts[1] = [[10, 0], [2, 8]]  # group 2 has no records: undefined rates are None, it is never kept
    report = group_report(counts, min_support=0)
    assert report["groups_kept"] == ["0", "1"]  # support >= 0 keeps only groups with records (an empty one has none)
    assert report["groups"][2]["prediction_rate"] == [None, None] and report["groups"][2]["hit_rate"] == [None, None]
    assert report["dp_violation_min_support"] == report["dp_violation"]
    none_kept = group_report(counts)  # default MIN_SUPPORT: no group has 100 records
    assert MIN_SUPPORT == 100 and none_kept["groups_kept"] == []
    assert none_kept["dp_violation_min_support"] == 0.0 and none_kept["dp_violation"] > 0
    with pytest.raises(ValueError, match="min_support"):
        group_report(counts, min_support=-1)
    with pytest.raises(ValueError, match="group_names"):
        group_report(counts, group_names=["x"])


@pytest.mark.slow
@pytest.mark.parametrize(("group_weight", "w_noise"), [("prior", "isotropic"), ("balanced", "per-group")])
def test_result_json_reports_each_groups_support_and_the_min_support_violations(
    group_weight: str, w_noise: str
) -> None:
    """A SteFFLe run's result.json: `fairness_groups` from the summed test counts of the last evaluation (the same
    violations as `final`, supports adding up to the test records); `final` keeps its keys."""
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    config = RunConfig.parse(
        {
            "algorithm": "steffle",
            "dataset": "synthetic",
            "rounds": 3,
            "epsilon": 4.0,
            "group-weight": group_weight,
            "w-noise": w_noise,
        }
    )
    result = run_job(config, engine="inprocess", progress=False)
    assert set(result["final"]) == {"accuracy", "error", "loss", "dp_violation", "eo_violation", "eopp_violation"}
    groups = result["fairness_groups"]
    for key in ("dp_violation", "eo_violation", "eopp_violation"):
        assert groups[key] == result["final"][key]
        assert 0.0 <= groups[f"{key}_min_support"] <= 1.0
    assert [g["name"] for g in groups["groups"]] == result["federation"]["group_names"]
    assert sum(g["support"] for g in groups["groups"]) == sum(s["n_test"] for s in result["federation"]["silos"])
    assert groups["min_support"] == 100 and groups["label_names"] == result["federation"]["label_names"]
    assert 0.0 < result["privacy"]["epsilon_spent"] <= 4.0 + 1e-9


def test_min_support_option_sets_the_threshold_of_the_report(tmp_path: Path) -> None:
    """`--min-support N` through the real entry point: the report keeps exactly the groups with >= N test records."""
    import json

    from silofl.server.cli import main

    out = tmp_path / "run"
    assert main(["run", "fedavg", "--rounds", "2", "--min-support", "700", "--out", str(out)]) == 0
    groups = json.loads((out / "result.json").read_text())["fairness_groups"]
    assert groups["min_support"] == 700
    assert groups["groups_kept"] == [g["name"] for g in groups["groups"] if g["support"] >= 700]
    assert 0 < len(groups["groups_kept"]) < len(groups["groups"])  # the synthetic test split straddles 700
