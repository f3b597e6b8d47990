"""benchmarks/steffle_round.py runs as documented (benchmarks/README.md) and prints its four parts with positive
times: the whole round in-process, one silo's ClientApp, the math alone, and one silo without and with its operator's
policy. Speed itself is not asserted here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_benchmark_prints_its_four_parts(data_dir: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/steffle_round.py",
            "--rounds",
            "4",
            "--repeats",
            "1",
            "--silo-rounds",
            "8",
            "--math-rounds",
            "25",
            "--policy-rounds",
            "8",
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "SILOFL_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "whole round, in-process engine" in out
    assert "one silo's ClientApp per round" in out
    assert "the math alone, 3 silos' calls" in out
    assert "without and with a policy" in out
    timed = "\n".join(line for line in out.splitlines() if "difference" not in line)  # a difference may be < 0
    times = [float(t) for t in re.findall(r":\s+([0-9.]+) ms", timed)]
    # ClientApp and math, SteFFLe and non-private; no policy and policy; the policy's work alone
    assert len(times) == 7 and all(t > 0 for t in times), out
    whole = re.search(r"SteFFLe \(eps 1, lambda 1\)\s+([0-9.]+)\s+([0-9.]+)", out)
    assert whole is not None and float(whole.group(1)) > 0, out
