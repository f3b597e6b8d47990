"""Same seed, same numbers: every algorithm reproduces the fixture recorded before the algorithm-registry refactor.

What it protects: the refactor of the algorithm registry (issue 17) moves per-algorithm code and defaults around; it
must not change the numbers any algorithm computes for the same seed and the same explicit configuration. Each case
of `data/golden_runs.json` holds an explicit run configuration (every key whose value matters to that algorithm's
numbers, pinned at the value the pre-refactor code used, so a change of per-algorithm defaults cannot hide behind it)
and what that run produced on the in-process engine: `final` metrics, the epsilon spent, the number of rounds and the
final model (every array for the small models; for FedSC / FedAvg+SC, whose model is only written to `model.npz` in
the out-dir, the sha256 of each array's float32 bytes and its sum). In the environment that recorded the fixture
(its `environment`: Python's and the numerical packages' versions) everything is compared exactly (bit for bit),
except a value the case lists under `tolerance` (an absolute tolerance, keyed by `final.<metric>`, `epsilon_spent`
or `model`); in another environment, within the measured drift of :data:`DRIFT`.

Regenerate the fixture (only when a change of the numbers is intended, and say why in the commit)::

    python -m tests.system.test_same_numbers --record

from the project root: it reruns every case of :data:`CASES` with the code of the work tree and rewrites
`tests/data/golden_runs.json` (about 10 s; `--record CASE ...` reruns only those cases). The fixture was recorded
with the code of commit 47fa1a6, before the refactor, in the environment the README's install command gave on
2026-11-24 (the refactored code reproduces it bit for bit there). Two recordings gave byte-identical fixtures, so
nothing has a tolerance in the recording environment (see :data:`TOLERANCE`). Recorded again on 2026-11-27, with the
same packages, on another processor generation (AMD EPYC family 26, which the old key "AMD EPYC" could not tell from
the recording machine's): every number within :data:`DRIFT` of the first recording (the largest change: epsilon in
the 10th digit, mu2fl's loss in the 7th), the environment key now naming the processor's family and model.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Not marked `slow`: the whole module takes about 20 s on 2 cores (a few rounds of each algorithm on small data).
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "golden_runs.json"
#: Algorithms whose result holds no model arrays (they are in out-dir/model.npz): fingerprinted instead.
SSL = frozenset({"fedsc", "fedavg-sc"})

# Keys every case pins (the data, the split, the run's length, the seed, when it evaluates: eval-every 1 is what the
# old default 0 resolved to for 4 rounds). A case holds only keys its algorithm reads: no epsilon for mu2fl and
# noisy-sgd (rho sets their noise; epsilon must stay inf beside it), no lr or hidden for them, no sharing keys for
# FedAvg+SC.
_DATA = {"num-silos": 3, "partition": "iid", "max-train-records": 0}
_RUN = {"rounds": 4, "epochs": 0.0, "seed": 3, "eval-every": 1}
_PRIVATE = {"delta": 0.0, "accountant": "best"}
_SGD = {"model": "logreg", "hidden": 64, "batch-size": 256, "lr": 0.5}
_DECAY = {"lr-decay": 1.0, "lr-decay-epochs": 0.0}
# w-noise: the default before 2026-11-25 (now "auto", per-group), pinned in the fixture's configs too.
_STEFFLE = {"fairness": "dp", "lambda": 1.0, "w-radius": 2.0, "w-lr": 0.1, "w-noise": "isotropic", "counts-share": 0.1}
_TRAN = {"fairness": "dp", "lambda": 1.0, "dual-lr": 0.01, "counts-share": 0.1}
_SINGLE_PASS = {"dataset": "digits", "model": "logreg", "batch-size": 16, "rho": 4.0, "domain-diameter": 0.1}
_SC = {
    "dataset": "digits",
    **_DATA,
    "max-train-records": 60,
    **_RUN,
    "rounds": 2,
    "model": "cnn",
    "batch-size": 16,
    "lr": 0.5,
    "local-epochs": 1,
    "local-steps": 1,
    "projection-dim": 128,
    "width": 1,
    "momentum": 0.9,
    "weight-decay": 5e-4,
    "grad-clip": 3.0,
    "mu": 4.0,
    "participation": 1.0,
    "server-optimizer": "avg",
    "server-lr": 1e-3,
    "eval-data": "central",
    "device": "cpu",
    "probe-epochs": 2,
    "knn-k": 200,
    "knn-tau": 0.1,
}
#: FedSC's correlation sharing (DP-CalR): keys FedAvg+SC, which shares nothing, does not read.
_SHARING = {
    "views": 2,
    "alpha-start": 1.0,
    "alpha-end": 0.2,
    "share-start": 1,
    "share-every": 1,
    "calr-relation": "replace_one",
    "calr-sampling-rate": 1.0,
}

#: The explicit configuration of every case (kebab-case keys as `RunConfig.parse` accepts them).
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg", "dataset": "synthetic", **_DATA, **_RUN, **_SGD, "local-epochs": 1},
    "dp-fedsgd": {
        "algorithm": "dp-fedsgd",
        "dataset": "synthetic",
        **_DATA,
        **_RUN,
        **_SGD,
        **_DECAY,
        "clip": 1.0,
        "epsilon": 2.0,
        **_PRIVATE,
    },
    "steffle": {
        "algorithm": "steffle",
        "dataset": "synthetic",
        **_DATA,
        **_RUN,
        **_SGD,
        **_DECAY,
        "clip": 1.0,
        **_STEFFLE,
        "epsilon": 2.0,
        **_PRIVATE,
    },
    "steffle-eo-mlp": {
        "algorithm": "steffle",
        "dataset": "synthetic",
        **_DATA,
        **_RUN,
        **_SGD,
        "model": "mlp",
        **_DECAY,
        "clip": 1.0,
        **_STEFFLE,
        "fairness": "eo",
        "epsilon": 2.0,
        **_PRIVATE,
    },
    "tran": {
        "algorithm": "tran",
        "dataset": "synthetic",
        **_DATA,
        **_RUN,
        **_SGD,
        **_DECAY,
        "clip": 1.0,
        **_TRAN,
        "epsilon": 2.0,
        **_PRIVATE,
    },
    "mu2fl": {"algorithm": "mu2fl", **_DATA, **_RUN, **_SINGLE_PASS, "trust": "untrusted", **_PRIVATE},
    "mu2fl-trusted": {"algorithm": "mu2fl", **_DATA, **_RUN, **_SINGLE_PASS, "trust": "trusted", **_PRIVATE},
    "noisy-sgd": {"algorithm": "noisy-sgd", **_DATA, **_RUN, **_SINGLE_PASS, "trust": "untrusted", **_PRIVATE},
    "fedsc": {"algorithm": "fedsc", **_SC, **_SHARING, "epsilon": 6.0, **_PRIVATE},
    "fedavg-sc": {"algorithm": "fedavg-sc", **_SC},
}

#: Absolute tolerances of values that are not bit-identical from one run to the next, by case: keys
#: `final.<metric>`, `epsilon_spent`, `model`. Empty: every number is compared exactly.
TOLERANCE: dict[str, dict[str, float]] = {}

#: The packages whose versions decide the last bits: the fixture records them, and the numbers are compared bit for
#: bit only in the environment that recorded them. Measured (2026-11-24): the same code (47fa1a6) under two installs of
#: the README's command differed by <= 5e-10 relative in epsilon (scipy's root finding in dp-accounting), <= 7e-8
#: relative in mu2fl's losses, <= 5e-19 in the logistic models, and by up to 1.4e-3 in FedAvg+SC's probe accuracy and
#: 3e-4 in its CNN weights' sums (a few float32 ulps amplified by 2 rounds of SGD and a probe).
ENVIRONMENT_PACKAGES = ("torch", "numpy", "scipy", "dp-accounting", "flwr")
#: Tolerances in another environment: relative for epsilon and the small models' metrics, absolute for the small
#: models' arrays, and for FedSC / FedAvg+SC absolute on metrics and relative on each array's sum.
DRIFT = {"epsilon_rel": 1e-8, "metric_rel": 1e-6, "model_abs": 1e-9, "ssl_metric_abs": 5e-3, "ssl_sum_rel": 1e-3}


def environment() -> dict[str, str]:
    """Python's and the deciding packages' versions, and the CPU: the same packages give other float rounding on
    another processor (numpy's and torch's kernels pick their vector instructions at run time; seen 2026-11-25: the
    fixture of an earlier machine, same versions, differed in the 9th digit of epsilon on an AMD EPYC)."""
    from importlib.metadata import version

    return {
        "python": sys.version.split()[0],
        **{name: version(name) for name in ENVIRONMENT_PACKAGES},
        "cpu": _cpu(),
    }


def _cpu() -> str:
    """The processor (Linux: /proc/cpuinfo's model name with its family and model numbers), else what `platform`
    knows of it. The name alone is not enough: virtual machines report "AMD EPYC" for every generation, and two of
    them (family 25 and 26, seen 2026-11-27) round the same code's epsilon differently in the 10th digit."""
    import platform

    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():
                break  # the first processor is enough
        if "model name" in fields:
            return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fingerprint(array: np.ndarray) -> dict[str, Any]:
    """sha256 of the array's float32 bytes (C order), its sum (float64) and its shape."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    return {
        "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
        "sum": float(a.sum(dtype=np.float64)),
        "shape": list(a.shape),
    }


def run_case(config: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run one case on the in-process engine; what the fixture records of it (`out_dir`: for FedSC's model.npz)."""
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    ssl = config["algorithm"] in SSL
    values = {**config, "out-dir": str(out_dir)} if ssl else config
    result = run_job(RunConfig.parse(values), engine="inprocess", progress=False)
    observed: dict[str, Any] = {
        "final": result["final"],
        "epsilon_spent": result["privacy"]["epsilon_spent"],
        "rounds": result["federation"]["rounds"],
    }
    if ssl:
        with np.load(out_dir / "model.npz") as npz:
            observed["model_fingerprint"] = {name: _fingerprint(npz[name]) for name in sorted(npz.files)}
    else:
        observed["model"] = result["model"]
    return observed


def record(path: Path = FIXTURE, names: list[str] | None = None) -> dict[str, Any]:
    """Run the cases (all, or only `names`, keeping the others' entries) and write the fixture; returns it."""
    unknown = sorted(set(names or ()) - set(CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {sorted(CASES)}")
    old = json.loads(path.read_text())["cases"] if names and path.is_file() else {}
    cases = {}
    for name, config in CASES.items():
        if names and name not in names:
            if name in old:
                cases[name] = old[name]
            continue
        with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as tmp:
            cases[name] = {"config": config, "expected": run_case(config, Path(tmp))}
        if name in TOLERANCE:
            cases[name]["tolerance"] = TOLERANCE[name]
    fixture = {
        "about": "tests/system/test_same_numbers.py: explicit configurations and their numbers on the in-process "
        "engine; regenerate with `python -m tests.system.test_same_numbers --record`",
        "environment": environment(),
        "cases": cases,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fixture, indent=1) + "\n")
    return fixture


def _load_cases() -> dict[str, dict[str, Any]]:
    return json.loads(FIXTURE.read_text())["cases"] if FIXTURE.is_file() else {}


def _recorded_here() -> bool:
    """Whether this environment is the one that recorded the fixture (then every number must match bit for bit)."""
    return json.loads(FIXTURE.read_text()).get("environment") == environment()


def _drift_tolerance(case: dict[str, Any]) -> dict[str, float]:
    """Absolute tolerances for a case compared in another environment (see :data:`DRIFT`)."""
    expected = case["expected"]
    ssl = "model_fingerprint" in expected
    eps = _number(expected["epsilon_spent"])
    tol = {"epsilon_spent": DRIFT["epsilon_rel"] * abs(eps) if eps is not None and math.isfinite(eps) else 0.0}
    for key, value in expected["final"].items():
        number = _number(value)
        if number is not None and math.isfinite(number):
            tol[f"final.{key}"] = DRIFT["ssl_metric_abs"] if ssl else DRIFT["metric_rel"] * max(abs(number), 1e-12)
    if not ssl:
        tol["model"] = DRIFT["model_abs"]
    return tol


def _number(value: Any) -> float | None:
    """`value` as a float if it is a number (result.json writes infinity as the string "inf"), else None."""
    if isinstance(value, str):
        return math.inf if value == "inf" else None
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    return None


def _same(actual: Any, expected: Any, tol: float | None) -> bool:
    """Exactly the same value (numbers: the same float; NaN matches NaN), or within `tol` when it is given."""
    got, want = _number(actual), _number(expected)
    if got is None or want is None:
        return actual == expected
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return got == want or (tol is not None and abs(got - want) <= tol)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_load_cases()))
def test_same_numbers(name: str, tmp_path: Path) -> None:
    case = _load_cases()[name]
    exact = _recorded_here()
    expected = case["expected"]
    tolerance = case.get("tolerance", {}) if exact else {**_drift_tolerance(case), **case.get("tolerance", {})}
    observed = run_case(case["config"], tmp_path)

    assert observed["rounds"] == expected["rounds"]
    assert _same(observed["epsilon_spent"], expected["epsilon_spent"], tolerance.get("epsilon_spent")), (
        f"epsilon spent: {observed['epsilon_spent']!r} != {expected['epsilon_spent']!r}"
    )
    assert sorted(observed["final"]) == sorted(expected["final"])
    for key, want in expected["final"].items():
        got = observed["final"][key]
        assert _same(got, want, tolerance.get(f"final.{key}")), f"final {key}: {got!r} != {want!r}"
    if "model_fingerprint" in expected and exact:
        assert observed["model_fingerprint"] == expected["model_fingerprint"]
    elif "model_fingerprint" in expected:  # another environment: the same arrays, each sum close
        got, want = observed["model_fingerprint"], expected["model_fingerprint"]
        assert sorted(got) == sorted(want)
        for array, print_ in want.items():
            assert got[array]["shape"] == print_["shape"], array
            bound = DRIFT["ssl_sum_rel"] * max(abs(print_["sum"]), 1.0)
            assert abs(got[array]["sum"] - print_["sum"]) <= bound, f"model {array}: sum {got[array]['sum']!r}"
    else:
        assert sorted(observed["model"]) == sorted(expected["model"])
        tol = tolerance.get("model")
        for array, want in expected["model"].items():
            got, want = np.asarray(observed["model"][array]), np.asarray(want)
            assert got.shape == want.shape, f"model {array}: shape {got.shape} != {want.shape}"
            same = np.array_equal(got, want) if tol is None else np.allclose(got, want, rtol=0.0, atol=tol)
            assert same, f"model {array}: max |diff| {np.abs(got - want).max()!r}"


def test_drift_tolerances_hold_the_previous_environments_numbers() -> None:
    """The tolerances of another environment are not vacuous: they accept the numbers the same code gave in the
    environment that recorded the previous fixture (kept as data/golden_runs_other_env.json) and refuse a change of
    the kind a refactor could make (one more round's worth of change in a metric)."""
    here = _load_cases()
    other = json.loads((FIXTURE.parent / "golden_runs_other_env.json").read_text())["cases"]
    for name, case in here.items():
        tol = _drift_tolerance(case)
        for key, want in case["expected"]["final"].items():
            assert _same(other[name]["expected"]["final"][key], want, tol.get(f"final.{key}")), (name, key)
        assert _same(other[name]["expected"]["epsilon_spent"], case["expected"]["epsilon_spent"], tol["epsilon_spent"])
    accuracy = here["fedavg"]["expected"]["final"]["accuracy"]
    assert not _same(accuracy + 1e-3, accuracy, _drift_tolerance(here["fedavg"])["final.accuracy"])


def test_fixture_covers_every_case() -> None:
    """The fixture holds every case of CASES with the same explicit configuration (rerecord after changing CASES)."""
    cases = _load_cases()
    assert sorted(cases) == sorted(CASES)
    for name, config in CASES.items():
        assert cases[name]["config"] == config, f"{name}: CASES and the fixture disagree; rerun --record"


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        sys.exit("usage: python -m tests.system.test_same_numbers --record [CASE ...]")
    record(names=sys.argv[2:] or None)
    print(f"wrote {FIXTURE}")
