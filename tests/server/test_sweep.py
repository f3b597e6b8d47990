"""`silofl sweep`: grid expansion and validation up front, one folder per run, resumability, failures recorded.

The smoke sweep (benchmarks/sweeps/smoke.toml: 3 real runs on the synthetic dataset) runs here, on 2 worker
processes, as CI's check that the sweep machinery works end to end.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from silofl.server.cli import main
from silofl.server.sweep import (
    SweepError,
    format_value,
    load_spec,
    load_sweep,
    run_state,
    run_sweep,
    select,
)

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "benchmarks" / "sweeps"


def _write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -- expansion (no runs) ----------------------------------------------------------------------------------------------


def test_methods_fix_keys_and_own_grids_take_precedence(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        [base]
        dataset = "synthetic"
        rounds = 5
        lr = 0.3

        [grid]
        epsilon = [1, 3]
        seed = [0, 1]

        [[methods]]
        name = "steffle"
        algorithm = "steffle"
        [methods.grid]
        lambda = [0, 2]

        [[methods]]
        name = "fedavg"
        algorithm = "fedavg"
        epsilon = "inf"
        lr = 0.1
        """,
    )
    sweep = load_sweep(path, out=tmp_path / "out")
    names = [run.name for run in sweep.runs]
    # steffle: lambda x epsilon x seed (its own grid's keys first); fedavg fixes epsilon, so only the seeds remain
    assert len(names) == 2 * 2 * 2 + 2
    assert "steffle__lambda=2_epsilon=3_seed=1" in names
    assert names[-2:] == ["fedavg__seed=0", "fedavg__seed=1"]
    by_name = {run.name: run for run in sweep.runs}
    fedavg = by_name["fedavg__seed=1"].config
    assert fedavg.algorithm == "fedavg" and fedavg.lr == 0.1 and fedavg.seed == 1
    steffle = by_name["steffle__lambda=2_epsilon=3_seed=1"].config
    assert (steffle.lam, steffle.epsilon, steffle.lr, steffle.rounds) == (2.0, 3.0, 0.3, 5)
    assert steffle.out_dir == str(tmp_path / "out" / "steffle__lambda=2_epsilon=3_seed=1")
    # deterministic: the same file gives the same folders
    assert [run.name for run in load_sweep(path, out=tmp_path / "out").runs] == names


def test_grid_blocks_are_a_union_and_duplicates_run_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        [base]
        algorithm = "mu2fl"
        dataset = "digits"
        epochs = 1

        [[grid]]
        trust = ["untrusted", "trusted"]
        rho = [4, 8]
        [[grid]]
        trust = ["untrusted"]
        rho = [4]
        """,
    )
    sweep = load_sweep(path, out=tmp_path / "out")
    assert [run.name for run in sweep.runs] == [
        "mu2fl__trust=untrusted_rho=4",
        "mu2fl__trust=untrusted_rho=8",
        "mu2fl__trust=trusted_rho=4",
        "mu2fl__trust=trusted_rho=8",
    ]


def test_committed_sweeps_are_valid() -> None:
    """Every committed sweep file expands and validates (the SteFFLe files hold the sizes their headers estimate)."""
    files = sorted(SWEEPS.glob("*.toml"))
    assert {f.stem for f in files} >= {
        "smoke",
        "steffle_adult_dp",
        "steffle_credit_dp",
        "steffle_adult_eo",
        "steffle_credit_eo",
    }
    for path in files:
        sweep = load_sweep(path)
        assert sweep.runs, path
        assert sweep.out.parts[:2] == ("runs", "sweeps")
    adult_dp = load_sweep(SWEEPS / "steffle_adult_dp.toml")
    methods = {run.method for run in adult_dp.runs}
    assert methods == {"steffle", "dp-fermi", "fermi", "tran", "fedavg", "dp-fedsgd", "fedfdp"}
    assert len(adult_dp.runs) == 312
    assert f"{len(adult_dp.runs)} runs" in (SWEEPS / "steffle_adult_dp.toml").read_text()
    assert {run.config.num_silos for run in adult_dp.runs if run.method in ("dp-fermi", "fermi")} == {1}
    assert {format_value(run.config.epsilon) for run in adult_dp.runs if run.method == "steffle"} == {"1", "3", "9"}
    eo = load_sweep(SWEEPS / "steffle_credit_eo.toml")
    fair = [run for run in eo.runs if "fairness" in type(run.config).model_fields]  # fedavg has no notion
    assert fair and {run.config.fairness for run in fair} == {"eo"}
    assert {format_value(run.config.epsilon) for run in eo.runs if run.method == "steffle"} == {"1", "3"}


def test_where_selects_a_slice_and_keeps_methods_that_do_not_vary_the_key(tmp_path: Path) -> None:
    sweep = load_sweep(SWEEPS / "steffle_adult_dp.toml", out=tmp_path)
    chosen = select(sweep.runs, {"lambda": "1", "epsilon": "1.0", "seed": "0", "heterogeneity": "0"})
    # steffle, dp-fermi and fermi at lambda 1 (fermi is non-private: kept at every epsilon); tran at each dual step;
    # fedavg (varies neither lambda nor epsilon); dp-fedsgd at epsilon 1
    assert (
        sorted(run.method for run in chosen) == ["dp-fedsgd", "dp-fermi", "fedavg", "fermi", "steffle"] + ["tran"] * 3
    )
    with pytest.raises(SweepError, match="unknown key 'lamda'"):
        select(sweep.runs, {"lamda": "1"})


# -- bad sweeps fail before any run starts ----------------------------------------------------------------------------


def test_a_bad_entry_fails_up_front_naming_the_method_and_grid_point(tmp_path: Path, capsys) -> None:
    path = _write(
        tmp_path,
        """
        [base]
        rounds = 5

        [grid]
        seed = [0, 1]

        [[methods]]
        name = "steffle"
        algorithm = "steffle"
        [methods.grid]
        epsilon = [1, -3]
        """,
    )
    out = tmp_path / "out"
    with pytest.raises(SweepError) as info:
        load_sweep(path, out=out)
    text = str(info.value)
    assert "method 'steffle' epsilon=-3 seed=0" in text
    assert "key 'epsilon' = -3" in text
    code = main(["sweep", str(path), "--out", str(out)])
    assert code == 2
    assert "epsilon=-3" in capsys.readouterr().err
    assert not out.exists()  # nothing started


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[bas]\nrounds = 5\n", "unknown entry 'bas'"),
        ('[base]\nrounds = 5\nalgorithm = "fedavg"\n[grid]\nseed = []\n', "'seed' is an empty list"),
        ('[base]\nrounds = 5\nalgorithm = "fedavg"\nout-dir = "x"\n', "'out-dir' is set by the sweep"),
        ('[base]\nrounds = 5\nalgorithm = "fedavg"\n[grid]\nlamda = [1]\n', "unknown key 'lamda'"),
        (
            '[base]\nrounds = 5\n[[methods]]\nname = "a"\nalgorithm = "fedavg"\n[[methods]]\nname = "a"\n'
            'algorithm = "steffle"\n',
            "names must be unique; repeated: a",
        ),
        ('[[methods]]\nname = "x/y"\nalgorithm = "fedavg"\n', "use letters, digits"),
        ("[base\n", "not valid TOML"),
    ],
)
def test_malformed_sweep_files_are_explained(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(SweepError, match=None) as info:
        load_sweep(path, out=tmp_path / "out")
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_load_spec_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="does not exist"):
        load_spec(tmp_path / "nope.toml")


# -- real runs ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory):
    """benchmarks/sweeps/smoke.toml run once on 2 worker processes (the CI smoke sweep)."""
    out = tmp_path_factory.mktemp("smoke")
    sweep = load_sweep(SWEEPS / "smoke.toml", out=out)
    report = run_sweep(sweep, workers=2, progress=False)
    return sweep, report


@pytest.mark.slow
def test_smoke_sweep_completes_every_run_in_its_own_folder(smoke) -> None:
    sweep, report = smoke
    assert report.ok, report.failed
    assert len(report.completed) == len(sweep.runs) == 3 and report.skipped == 0
    for run in sweep.runs:
        result = json.loads((run.folder / "result.json").read_text())
        assert result["status"]["completed"]
        assert result["config"]["out-dir"] == str(run.folder)
        meta = json.loads((run.folder / "run.json").read_text())
        assert meta["method"] == run.method and meta["varied"] == run.varied
        assert 0.0 <= result["final"]["error"] <= 1.0
        assert run_state(run) == "finished"
    assert (sweep.out / "sweep.toml").read_text() == (SWEEPS / "smoke.toml").read_text()
    # the two SteFFLe runs differ only in lambda: the fairness term changed the model
    by_name = {run.name: json.loads((run.folder / "result.json").read_text()) for run in sweep.runs}
    assert by_name["steffle__lambda=0_seed=0"]["model"] != by_name["steffle__lambda=2_seed=0"]["model"]


@pytest.mark.slow
def test_a_second_sweep_skips_finished_runs_and_reruns_only_missing_ones(smoke) -> None:
    sweep, _ = smoke
    stamps = {run.name: (run.folder / "result.json").stat().st_mtime_ns for run in sweep.runs}
    again = run_sweep(load_sweep(SWEEPS / "smoke.toml", out=sweep.out), workers=2, progress=False)
    assert (again.skipped, again.completed, again.failed) == (3, [], {})
    assert {run.name: (run.folder / "result.json").stat().st_mtime_ns for run in sweep.runs} == stamps
    # a run that did not finish (no result, or status.completed false) is run again; the others are not touched
    target = sweep.runs[0]
    result_path = target.folder / "result.json"
    result = json.loads(result_path.read_text())
    result_path.write_text(json.dumps({**result, "status": {**result["status"], "completed": False}}))
    assert run_state(target) == "todo"
    third = run_sweep(load_sweep(SWEEPS / "smoke.toml", out=sweep.out), workers=1, progress=False)
    assert third.completed == [target.name] and third.skipped == 2
    assert json.loads(result_path.read_text())["status"]["completed"]
    assert all((run.folder / "result.json").stat().st_mtime_ns == stamps[run.name] for run in sweep.runs[1:])


@pytest.mark.slow
def test_a_changed_sweep_file_does_not_reuse_results_of_another_config(smoke, tmp_path: Path) -> None:
    sweep, _ = smoke
    changed = _write(tmp_path, (SWEEPS / "smoke.toml").read_text().replace("rounds = 30", "rounds = 31"))
    with pytest.raises(SweepError, match=r"rounds: 30 there, 31 now"):
        run_sweep(load_sweep(changed, out=sweep.out), workers=1, progress=False)


def test_a_failing_run_is_recorded_and_the_sweep_goes_on(tmp_path: Path, capsys, monkeypatch) -> None:
    """A run that fails while it runs (here its engine raises: whatever the data checks cannot foresee) leaves
    error.txt; the others run."""
    from silofl.server import engines

    real = engines.run_job

    def crashing(config, **kwargs):
        if "crashes" in config.out_dir:
            raise RuntimeError("silo 1 crashed in round 2")
        return real(config, **kwargs)

    monkeypatch.setattr(engines, "run_job", crashing)
    path = _write(
        tmp_path,
        """
        [base]
        rounds = 3
        eval-every = 3

        [[methods]]
        name = "good"
        algorithm = "fedavg"

        [[methods]]
        name = "crashes"
        algorithm = "fedavg"
        seed = 1
        """,
    )
    out = tmp_path / "out"
    code = main(["sweep", str(path), "--out", str(out), "--workers", "1", "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "1 completed, 0 skipped, 1 failed" in err
    assert json.loads((out / "good" / "result.json").read_text())["status"]["completed"]
    error = (out / "crashes" / "error.txt").read_text()
    assert "RuntimeError: silo 1 crashed in round 2" in error
    assert not (out / "crashes" / "result.json").exists()
    # a rerun retries only the failed run (and fails again, still non-zero)
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1", "--no-progress"]) == 1
    assert "0 completed, 1 skipped, 1 failed" in capsys.readouterr().err


_CHECKED = """
    [base]
    rounds = 2
    num-silos = 2
    max-train-records = 20
    batch-size = 64

    [grid]
    seed = [0, 1]

    [[methods]]
    name = "fedavg"
    algorithm = "fedavg"

    [[methods]]
    name = "small-batch"
    algorithm = "fedavg"
    batch-size = 8

    [[methods]]
    name = "missing-file"
    algorithm = "fedavg"
    dataset = "no-such-file.csv"
    target = "y"
    sensitive = "s"
    """


def test_a_run_that_fails_the_data_checks_stops_the_sweep_before_any_run_starts(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, _CHECKED)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "run 'missing-file seed=0' (folder missing-file__seed=0) fails the data checks, so no run was started" in err
    assert "--dataset no-such-file.csv: no such file" in err
    assert not list(out.glob("*/run.json"))  # not even the good runs, listed first, ran
    with pytest.raises(SweepError, match=r"run 'missing-file seed=0'.*no such file"):  # the Python API too
        run_sweep(load_sweep(path, out=out), workers=1, progress=False)
    assert main(["sweep", str(path), "--out", str(out), "--dry-run"]) == 2  # a dry run checks the data as well
    assert "fails the data checks" in capsys.readouterr().err


def test_the_data_checks_warn_once_per_distinct_message(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, _CHECKED)
    argv = ["sweep", str(path), "--out", str(tmp_path / "out"), "--methods", "fedavg,small-batch", "--dry-run"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "4 runs, all valid" in captured.out
    warnings = [line for line in captured.err.splitlines() if line.startswith("silofl: warning:")]
    # 20 records a silo: a batch of 64 takes them all (both fedavg runs, one message); a batch of 8 does not
    assert len(warnings) == 1, warnings
    assert "--batch-size 64 is more than the training records of silo 0 (20 records), silo 1" in warnings[0]
    assert warnings[0].endswith("(2 of 4 runs: fedavg seed=0, fedavg seed=1)")
    assert "checking the data of 4 run(s) (2 load(s))" in captured.err  # the two methods share each seed's load


@pytest.mark.slow
def test_dry_run_lists_every_run_with_its_state(smoke, capsys) -> None:
    sweep, _ = smoke
    assert main(["sweep", str(SWEEPS / "smoke.toml"), "--out", str(sweep.out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["finished"] * 3
    assert lines[-1].startswith("3 runs, all valid")


def test_every_sweep_file_of_the_benchmarks_expands_with_each_methods_own_keys() -> None:
    """The sweep files written before the algorithm registry (issue 17) still expand to the same runs: their shared
    tables hold keys some methods do not have (`fairness` for FedAvg), which those methods' runs leave out."""
    from silofl.protocols import algorithms
    from silofl.server.sweep import load_sweep

    expected = {
        "fedsc_fmnist": 9,
        "mu2_mnist": 39,
        "smoke": 3,
        "steffle_adult_dp": 312,
        "steffle_adult_eo": 216,
        "steffle_adult_sealed": 60,
        "steffle_adult_race": 246,
        "steffle_adult_tran_gap": 456,
        "steffle_credit_education": 168,
        "steffle_credit_dp": 312,
        "steffle_credit_silos": 165,
        "steffle_parkinsons_dp": 198,
        "steffle_parkinsons_eo": 198,
        "steffle_credit_eo": 216,
        "steffle_adult_heterogeneity": 180,
        "steffle_credit_heterogeneity": 180,
        "steffle_adult_record": 78,
        "steffle_credit_record": 78,
        "dp_fermi_adult": 120,
        "fedsc_fmnist_privacy": 36,
    }
    files = sorted((ROOT / "benchmarks" / "sweeps").glob("*.toml"))
    assert {f.stem for f in files} == set(expected)
    for path in files:
        sweep = load_sweep(path)
        assert len(sweep.runs) == expected[path.stem], path.name
        for run in sweep.runs:
            model = algorithms.get(run.config.algorithm).config_model
            own = {info.alias or name for name, info in model.model_fields.items()}
            assert set(run.config.to_json()) <= own, run.folder.name


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] not in "ZX"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from /proc (Linux)")
def test_kill_stops_the_workers_too(tmp_path: Path) -> None:
    """`kill` (SIGTERM) of `silofl sweep` stops its worker processes, as Ctrl-C does, and keeps no half run as
    finished: without that the workers outlived the sweep and kept writing run folders."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = tmp_path / "long.toml"
    spec.write_text(
        textwrap.dedent(
            """
            [base]
            dataset = "synthetic"
            num-silos = 2
            rounds = 100000
            [grid]
            seed = [0, 1, 2]
            [[methods]]
            name = "fedavg"
            algorithm = "fedavg"
            """
        )
    )
    command = [
        sys.executable,
        "-m",
        "silofl.server.cli",
        "sweep",
        str(spec),
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "2",
    ]
    parent = subprocess.Popen([*command, "--no-progress"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(workers) < 2:  # both workers started a run
            time.sleep(0.5)
            workers = [c for c in _children(parent.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
            if len(list((tmp_path / "out").glob("fedavg__*"))) < 2:
                workers = []
        assert len(workers) == 2, "the sweep's two workers did not start"
        parent.send_signal(signal.SIGTERM)
        _, stderr = parent.communicate(timeout=60)
        assert parent.returncode == 130 and "interrupted" in stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "a worker outlived the sweep"
        assert not list((tmp_path / "out").glob("*/result.json"))  # no run got to finish
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers:  # a failed run of this test leaves no orphan running 100,000 rounds
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
