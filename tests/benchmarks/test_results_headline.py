"""benchmarks/results_headline.py: the headline rule (best error all methods reach), its seed intervals, and the
`--only steffle` regeneration that writes the headline and the Tran-gap sections."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import results, results_steffle, results_topologies
from benchmarks import results_headline as headline

# SteFFLe's front: (0.15, 0.20), (0.16, 0.10), (0.18, 0.04); (0.17, 0.12) and (0.20, 0.06) are dominated.
STEFFLE = [(0.15, 0.20), (0.16, 0.10), (0.17, 0.12), (0.18, 0.04), (0.20, 0.06)]


def test_violation_at_interpolates_the_front_is_flat_after_it_and_none_below_it():
    assert headline.violation_at(STEFFLE, 0.17) == pytest.approx(0.07)
    assert headline.violation_at(STEFFLE, 0.16) == pytest.approx(0.10)
    assert headline.violation_at(STEFFLE, 0.25) == pytest.approx(0.04)  # beyond every point: the lowest reached
    assert headline.violation_at(STEFFLE, 0.14) is None  # no point reaches that error
    assert headline.violation_at([], 0.2) is None


def test_headline_matches_every_method_at_the_best_error_all_reach():
    points = {"steffle": STEFFLE, "tran": [(0.17, 0.10), (0.19, 0.08)], "fedfdp": [(0.16, 0.30)]}
    assert headline.best_common_error(points) == pytest.approx(0.17)
    value = headline.headline(points)
    assert value.set_by == "tran" and value.error == pytest.approx(0.17)
    assert value.violations == pytest.approx({"steffle": 0.07, "tran": 0.10, "fedfdp": 0.30})
    assert value.reduction("tran") == pytest.approx(0.3)
    assert value.reduction("fedfdp") == pytest.approx(1 - 0.07 / 0.30)
    assert value.difference("tran", scale=0.2) == pytest.approx(0.15)
    # SteFFLe worse: a negative reduction; a method with no point: no headline
    worse = headline.headline({"steffle": STEFFLE, "tran": [(0.18, 0.02)]})
    assert worse.reduction("tran") == pytest.approx(1 - 0.04 / 0.02)
    assert headline.headline({"steffle": STEFFLE, "tran": []}) is None


def test_t_interval_is_students_95_percent_interval_of_the_mean():
    lo, hi = headline.t_interval([1.0, 2.0, 3.0])
    assert (lo + hi) / 2 == pytest.approx(2.0)
    assert hi - lo == pytest.approx(2 * 4.303 / math.sqrt(3))
    assert headline.t_interval([1.0]) is None


# -- the section from run folders -------------------------------------------------------------------------------------

# (method, algorithm, key, value) -> (error, violation) of seed 1; seed 0 and 2 are -/+ (0.01, 0.005) from it
RUNS = {
    ("steffle", "steffle", "lambda", 0.0): (0.15, 0.20),
    ("steffle", "steffle", "lambda", 1.0): (0.18, 0.04),
    ("tran", "tran", "dual-lr", 0.01): (0.17, 0.10),
    ("fedfdp", "fedfdp", "lambda", 0.5): (0.16, 0.30),
}


def _sweep(root: Path) -> Path:
    from silofl.protocols.config import RunConfig

    out = root / "sweeps" / "steffle_adult_dp"
    for (method, algorithm, key, value), (error, violation) in RUNS.items():
        for seed, sign in ((0, -1), (1, 0), (2, 1)):
            name = f"{method}__{key}={value}_seed={seed}"
            values = {
                "algorithm": algorithm,
                "dataset": "adult",
                "num-silos": 3,
                "heterogeneity": 0.0,
                "seed": seed,
                "fairness": "dp",
                "epsilon": 1.0,
                key: value,
                "out-dir": str(out / name),
            }
            config = RunConfig.parse(values).to_json()
            final = {"error": error + sign * 0.01, "dp_violation": violation + sign * 0.005, "accuracy": 1 - error}
            folder = out / name
            folder.mkdir(parents=True)
            (folder / "run.json").write_text(json.dumps({"method": method, "config": config}))
            result = {"config": config, "final": final, "timing": {"total_seconds": 1.0}, "status": {"completed": True}}
            (folder / "result.json").write_text(json.dumps(result))
    return out


def test_headline_section_from_run_folders(tmp_path: Path):
    _sweep(tmp_path)
    sweeps = results_steffle.load_steffle_sweeps(tmp_path / "sweeps", tmp_path / "none", tmp_path / "figures")
    lines = headline.headline_section(sweeps)
    row = next(line for line in lines if line.startswith("| Adult | dp | 0 | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # e* = 0.17 (Tran's only point); SteFFLe's front (0.15, 0.20) - (0.18, 0.04) at 0.17: 0.20 - 0.16 * 2/3
    steffle = 0.20 - 0.16 * 2 / 3
    assert cells[4] == "0.1700 (Tran et al.)"
    assert cells[5:8] == [f"{steffle:.4f}", "0.1000", "0.3000"]
    assert cells[8].startswith(f"{100 * (1 - steffle / 0.10):.1f}% (")
    assert cells[9].startswith(f"{100 * (1 - steffle / 0.30):.1f}% (")
    summary = next(line for line in lines if line.startswith("| demographic parity | FedFDP |"))
    assert "1 of 1 panels" in summary and "52.93%" in summary


def test_only_steffle_replaces_the_steffle_part_in_place(tmp_path: Path):
    _sweep(tmp_path)
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir(parents=True)
    before = "# silofl results\n\nheader\n\n"
    after = f"{results_topologies.TOPOLOGY_HEADING}\n\ntopologies\n\n## DP-mu2-FL\n\nmu2\n"
    stale = f"{results_steffle.STEFFLE_HEADING}\n\nSTALE\n\n### Adult, demographic parity\n\nSTALE\n\n"
    doc.write_text(before + stale + after)
    argv = ["--only", "steffle", "--sweeps", str(tmp_path / "sweeps"), "--sweep-files", str(tmp_path / "none")]
    argv.append("--allow-missing")  # one of the six sweeps has runs here
    for _ in range(2):
        assert results.main([*argv, "--out", str(doc)]) == 0
        text = doc.read_text()
        assert text.startswith(before) and text.endswith(after)
        assert text.count(results_steffle.STEFFLE_HEADING) == 1 and text.count(headline.HEADLINE_HEADING) == 1
    assert "STALE" not in text and "regenerated alone (`python benchmarks/results.py --only steffle`)" in text
    assert headline.GAP_HEADING in text and "steffle_adult_tran_gap.toml" in text  # the factor sweep's command
    assert "### The gap to Tran et al.: one factor at a time" in text


def test_gap_rows_and_their_conclusion_name_the_factor_that_moves_the_comparison():
    tran = [(0.17, 0.10)]
    main = headline.gap_row(
        "main",
        {"steffle": STEFFLE, "tran": tran},
        [
            {"steffle": [(0.16, 0.10), (0.18, 0.03)], "tran": tran},
            {"steffle": [(0.16, 0.10), (0.18, 0.05)], "tran": tran},
        ],
    )
    assert main.reduction == pytest.approx(0.3)  # SteFFLe 0.07 at e* = 0.17 against Tran's 0.10
    assert main.seeds == pytest.approx((0.35, 0.25))  # per seed: (0.10 - 0.065) / 0.10 and (0.10 - 0.075) / 0.10
    small = headline.gap_row("small", {"steffle": [(0.16, 0.10), (0.18, 0.05)], "tran": tran}, [])
    big = headline.gap_row("big", {"steffle": [(0.16, 0.20), (0.18, 0.18)], "tran": tran}, [])
    missing = headline.gap_row("missing", {"steffle": [], "tran": tran}, [])
    assert missing.value is None and "no runs" in missing.line()
    text = headline.gap_conclusion([main, small, big, missing])
    assert "'big'" in text and "beyond the seed spread" in text  # -90% against 30%: 120 points, sd 7 points
    assert "within twice the seed sd" in headline.gap_conclusion([main, small])  # 5 points against sd 7


def test_cross_noise_table_reads_each_method_at_its_own_epsilon(tmp_path: Path):
    from silofl.server.plots.runs import RunRecord

    def run(method: str, eps: float, lam: float, error: float, violation: float) -> RunRecord:
        config = {"algorithm": method, "num-silos": 3, "heterogeneity": 0.0, "epsilon": eps, "lambda": lam, "seed": 0}
        return RunRecord(tmp_path, method, config, {"error": error, "dp_violation": violation})

    records = [
        run("steffle", 1.0, 0.0, 0.15, 0.20),
        run("steffle", 1.0, 1.0, 0.18, 0.10),
        run("steffle", 3.0, 0.0, 0.15, 0.20),
        run("steffle", 3.0, 1.0, 0.16, 0.05),
        run("tran", 1.0, 0.0, 0.16, 0.10),
        run("tran", 3.0, 0.0, 0.17, 0.08),
    ]
    table = headline.cross_noise_table(records)
    # SteFFLe eps 1 at e* = 0.16: 0.20 - 0.10 / 3 on its front; against Tran eps 1 (0.10) and eps 3 (e* 0.17: 0.1667)
    assert table[(1.0, 1.0)] == pytest.approx(1 - (0.20 - 0.10 / 3) / 0.10)
    assert table[(1.0, 3.0)] == pytest.approx(1 - (0.20 - 0.10 * 2 / 3) / 0.08)
    assert table[(3.0, 1.0)] == pytest.approx(1 - 0.05 / 0.10)  # less noise for SteFFLe: its eps-3 front at 0.16
    assert table[(3.0, 3.0)] == pytest.approx(1 - 0.05 / 0.08)
    lines = headline.cross_noise_lines(records)
    assert any(line.startswith("| 3 | 50.0% | 37.5% |") for line in lines)


def test_the_verdict_says_where_the_papers_number_lies():
    text = headline._verdict("dp", "tran", 0.7547, 0.02, (-0.4, 0.5), 6, 10)
    assert "lies above it, so silofl disagrees" in text and "6 of 10 panels" in text
    assert "contains the paper's number" in headline._verdict("dp", "fedfdp", 0.5293, 0.45, (0.1, 0.8), 10, 10)
    assert "lies below it" in headline._verdict("eo", "fedfdp", 0.2, 0.6, (0.5, 0.7), 4, 4)
    assert "no panel" in headline._verdict("eo", "fedfdp", 0.9542, None, None, 0, 0)
