"""benchmarks/load.py on a tiny federation (5 silos x 3 rounds): its numbers come from the run and are consistent.

The full benchmark (50 silos x 100 rounds, docs/LOAD.md) is on demand; these tests check that the measurement
machinery reads what it claims: per-round times from the run, memory from /proc, growth slopes, the process tree.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.benchmark_scripts import load_script

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT_ROOT / "benchmarks" / "load.py"


load = load_script("load.py", "silofl_load_benchmark")
MB = 1024 * 1024


@pytest.fixture(scope="module")
def small_run() -> dict:
    from silofl.server import progress

    original = progress.RunProgress
    result = load.measure(load.LoadSpec("dp-fedsgd", silos=5, rounds=3, dataset="synthetic", batch_size=64))
    assert progress.RunProgress is original, "measure must restore the ServerApp's progress bar"
    return result


@pytest.mark.slow
def test_round_times_come_from_the_run(small_run: dict) -> None:
    seconds = small_run["round_seconds"]
    assert small_run["status"]["completed"] is True
    assert small_run["rounds_completed"] == 3 and len(seconds) == 3
    assert all(s > 0 for s in seconds)
    t = small_run["time"]
    assert t["first"] == seconds[0]
    rest = seconds[1:]
    assert min(rest) <= t["mean"] <= max(rest)
    assert min(rest) <= t["p50"] <= t["p95"] <= t["max"] == max(rest)
    # the round loop's wall time holds every round (and the progress hooks): never less than their sum
    assert small_run["loop_seconds"] >= sum(seconds) - 1e-9
    assert small_run["wall_seconds"] > small_run["loop_seconds"]
    assert small_run["eval_rounds"][-1] == 3  # evaluation after the last round
    assert small_run["epsilon_spent"] <= 1.0 + 1e-9
    assert 0.5 < small_run["final_accuracy"] <= 1.0


def test_memory_is_sampled_after_setup_and_every_round(small_run: dict) -> None:
    samples = small_run["rss_samples"]
    assert [r for r, _ in samples] == [0, 1, 2, 3]
    m = small_run["memory"]
    assert m["setup_rss_mb"] > 50  # torch and the data are loaded by then
    assert m["last_rss_mb"] == samples[-1][1] / MB
    # the peak is the process's high-water mark: at least every sampled value
    assert m["peak_rss_mb"] >= max(b for _, b in samples) / MB
    assert m["peak_rss_mb"] >= m["getrusage_peak_rss_mb"] > 50
    assert "tree_peak_rss_mb" not in m  # the process tree is sampled for the Ray engine only


def test_growth_is_the_slope_from_round_10_on() -> None:
    # 1 MB per round, plus a 50 MB jump at round 5 (a cache filling up) that the leak check must ignore
    samples = [(r, 300 * MB + r * MB + (50 * MB if r >= 5 else 0)) for r in range(0, 31)]
    g = load.growth(samples)
    assert g["from_round"] == 10 and g["to_round"] == 30
    assert g["delta_mb"] == pytest.approx(20.0)
    assert g["slope_kb_per_round"] == pytest.approx(1024.0)
    flat = load.growth([(r, 400 * MB) for r in range(0, 31)])
    assert flat["delta_mb"] == 0 and flat["slope_kb_per_round"] == 0
    assert math.isnan(load.growth([(0, 1.0), (3, 2.0)])["delta_mb"])  # a run shorter than the window


def test_percentile_matches_numpy() -> None:
    values = list(np.random.default_rng(0).exponential(size=37))
    for q in (0, 50, 95, 100):
        assert load.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_tree_memory_counts_a_child_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; x = b'x' * (120 * 2**20); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in load.descendants(os.getpid())
        rss, pss, processes = load.tree_memory()
        assert processes >= 2
        assert load.rss_bytes(child.pid) > 100 * MB
        assert rss >= load.rss_bytes() + 100 * MB
        assert pss > 100 * MB
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_script_prints_tables_and_writes_the_doc(tmp_path: Path) -> None:
    out, raw = tmp_path / "LOAD.md", tmp_path / "load.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--silos",
            "3",
            "--rounds",
            "2",
            "--dataset",
            "synthetic",
            "--algorithms",
            "fedavg",
            "--ray",
            "",
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT_ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mean s/round" in done.stdout and "peak RSS MB" in done.stdout
    results = json.loads(raw.read_text())
    assert len(results) == 1 and results[0]["rounds_completed"] == 2
    doc = out.read_text()
    assert "--silos 3 --rounds 2" in doc
    assert "| fedavg | inprocess | 2 |" in doc
    mean = results[0]["time"]["mean"]
    assert f"- `fedavg` on inprocess: {mean:.3f} s per round" in doc
    peak = results[0]["memory"]["peak_rss_mb"]
    assert f"| {peak:.0f} |" in doc


def test_unknown_algorithm_is_named() -> None:
    with pytest.raises(SystemExit, match="--algorithms: fedprox not in"):
        load.main(["--algorithms", "fedprox", "--ray", ""])
    with pytest.raises(SystemExit, match="nothing to run"):
        load.main(["--algorithms", "", "--ray", ""])


def test_tracing_starts_after_the_given_round_and_sees_what_is_kept() -> None:
    sampler = load.Sampler(checkpoints=frozenset({2, 3}), trace_from=1)
    try:
        sampler.sample(0)
        sampler.sample(1)
        assert tracemalloc.is_tracing() and sampler.heap == []  # tracing starts after round 1's sample
        sampler.sample(2)
        kept = b"x" * (4 * MB)  # 4 MB allocated in "round 3" and still held
        sampler.sample(3)
    finally:
        tracemalloc.stop()
    assert [r for r, _ in sampler.heap] == [2, 3]
    assert sampler.heap[1][1] - sampler.heap[0][1] >= 4 * MB
    # at the last round the sampler names the lines holding the traced heap: the 4 MB object comes first
    where, size, _ = sampler.heap_holders[0]
    assert "test_load_benchmark.py" in where and size >= 4 * MB
    assert len(kept) == 4 * MB
