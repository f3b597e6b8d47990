"""benchmarks/results_tran_gap.py: the Tran-gap factors on Adult (each row under the headline rule, epsilon read per
row as the factor says), the authors' code's noise by silofl's accountant, and `--only tran-gap`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import results, results_steffle, results_topologies
from benchmarks import results_tran_gap as gap
from silofl.server import plots
from silofl.server.run_result import RunResult


def _record(tmp_path: Path, method: str, eps: float, lam: float, error: float, violation: float, seed: int = 0):
    from silofl.server.plots.runs import RunRecord

    config = {"algorithm": "steffle", "num-silos": 3, "heterogeneity": 0.0, "epsilon": eps, "lambda": lam, "seed": seed}
    return RunRecord(tmp_path, method, config, {"error": error, "dp_violation": violation})


def test_factor_rows_read_each_side_at_the_epsilon_the_factor_names(tmp_path: Path) -> None:
    records = [
        _record(tmp_path, "steffle", 1.0, 0.0, 0.15, 0.20),
        _record(tmp_path, "steffle", 1.0, 1.0, 0.18, 0.10),
        _record(tmp_path, "tran", 1.0, 0.0, 0.16, 0.10),
        # SteFFLe without noise: a better front (0.15, 0.20) - (0.16, 0.02)
        _record(tmp_path, "steffle-nonprivate", math.inf, 0.0, 0.15, 0.20),
        _record(tmp_path, "steffle-nonprivate", math.inf, 1.0, 0.16, 0.02),
        # both methods at their own epsilon (7.5) for the table of epsilon 1
        _record(tmp_path, "steffle-x-e1", 7.5, 1.0, 0.16, 0.05),
        _record(tmp_path, "tran-x-e1", 7.5, 0.0, 0.16, 0.10),
    ]
    rows, own = gap.factor_rows(
        records,
        1.0,
        [
            gap.Factor("main"),
            gap.Factor("no noise", steffle=("steffle-nonprivate",), steffle_eps="inf"),
            gap.Factor("own {own}", steffle=("steffle-x",), tran=("tran-x",), steffle_eps="own", tran_eps="own"),
            gap.Factor("absent", steffle=("steffle-absent",)),
        ],
    )
    main, bounded, mine, absent = rows
    # main: e* = 0.16 (Tran's only point); SteFFLe's front at 0.16: 0.20 - 0.10 / 3
    assert main.reduction == pytest.approx(1 - (0.20 - 0.10 / 3) / 0.10)
    assert bounded.reduction == pytest.approx(1 - 0.02 / 0.10)
    assert mine.reduction == pytest.approx(0.5) and mine.label == "own 7.5" and own == [7.5, 7.5]
    assert absent.value is None and "no runs" in absent.line()


def test_noise_readings_the_closed_form_and_the_authors_code_by_the_accountant() -> None:
    """The closed form as its proof reads it gives less noise than silofl's calibration (an epsilon above the
    nominal one, by silofl's accountant); the authors' code's noise (Theorem 3.3 for the mean, added to the SUM: a
    multiplier std_theta / L) is worth a far larger epsilon (Adult's q, T, delta, a binary attribute at 1/3)."""
    per_silo = {str(i): {"n_train": 11305, "sampling_rate": 256 / 11305, "noise_multiplier": 14.86} for i in range(3)}
    result = {
        "config": {"epsilon": 1.0, "clip": 1.0, "w-radius": 2.0},
        "federation": {"rounds": 1767},
        "final": {},
        "privacy": {"delta": 8.7e-10, "per_silo": per_silo},
        "server_state": {"prior": [0.3237, 0.6763]},
    }
    got = gap.noise_readings(RunResult.from_json(result))
    q = 256 / 11305
    assert got["silofl"] == 14.86
    assert got["closed_form"] == pytest.approx(2 * q * math.sqrt(2 * 1767 * math.log(1 / 8.7e-10)), rel=1e-3)
    assert got["closed_form"] < got["silofl"] and 1.0 < got["closed_form_epsilon"] < 2.0
    expected = math.sqrt(16 * 4 * math.log(1 / 8.7e-10) * 1767 / (11305**2 * 0.3237))
    assert got["std_theta"] == pytest.approx(expected) and got["authors"] == pytest.approx(expected)
    assert 0.2 < got["authors"] < 0.3 and got["authors_epsilon"] > 100  # about 500 for a nominal 1
    assert gap.noise_readings(RunResult.from_json({**result, "config": {"epsilon": "inf"}})) is None


def test_only_tran_gap_replaces_its_section_and_nothing_else(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    before = f"# silofl results\n\n{results_steffle.STEFFLE_HEADING}\n\nkept\n\n"
    after = f"{results_topologies.TOPOLOGY_HEADING}\n\ntopologies\n"
    doc.write_text(before + f"{gap.FACTORS_HEADING}\n\nSTALE\n\n" + after)
    argv = ["--only", "tran-gap", "--sweeps", str(tmp_path / "sweeps"), "--out", str(doc), "--allow-missing"]
    assert results.main(argv) == 0
    text = doc.read_text()
    assert text.startswith(before) and text.endswith(after) and "STALE" not in text
    assert text.count(gap.FACTORS_HEADING) == 1 and "Not generated yet" in text
    assert "silofl sweep benchmarks/sweeps/steffle_adult_tran_gap.toml" in text


def test_factor_section_from_run_folders(tmp_path: Path) -> None:
    """Run folders of both sweeps give one table per grid epsilon, with the main row first."""
    from silofl.protocols.config import RunConfig

    def write(sweep: str, method: str, algorithm: str, values: dict, final: dict) -> None:
        folder = tmp_path / "sweeps" / sweep / f"{method}_{len(list((tmp_path / 'sweeps').glob('*/*')))}"
        config = RunConfig.parse(
            {"algorithm": algorithm, "dataset": "adult", "heterogeneity": 0.0, "fairness": "dp", **values}
        ).to_json()
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"method": method, "config": config}))
        result = {"config": config, "final": final, "status": {"completed": True}, "timing": {"total_seconds": 1}}
        (folder / "result.json").write_text(json.dumps(result))

    write("steffle_adult_dp", "steffle", "steffle", {"epsilon": 1.0, "lambda": 0}, {"error": 0.15, "dp_violation": 0.2})
    write("steffle_adult_dp", "steffle", "steffle", {"epsilon": 1.0, "lambda": 1}, {"error": 0.18, "dp_violation": 0.1})
    write("steffle_adult_dp", "tran", "tran", {"epsilon": 1.0, "dual-lr": 0.01}, {"error": 0.16, "dp_violation": 0.1})
    write("steffle_adult_tran_gap", "tran-wide", "tran", {"epsilon": 1.0}, {"error": 0.17, "dp_violation": 0.09})
    adult, _ = plots.load_runs([tmp_path / "sweeps" / "steffle_adult_dp"])
    lines = gap.factor_section(adult, tmp_path / "sweeps", tmp_path)
    text = "\n".join(lines)
    assert lines[0] == gap.FACTORS_HEADING and "**Epsilon 1**" in text and "**Epsilon 3**" not in text
    main = next(line for line in lines if line.startswith("| main sweeps"))
    assert "| 0.1600 |" in main and "-" in main  # e* = Tran's best error 0.16
    assert any(line.startswith("| SteFFLe's W radius 1") and "no runs" in line for line in lines)
