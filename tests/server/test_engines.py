"""Integration: both baselines through the real ServerApp and ClientApp, on the in-process engine and on Ray."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job

REQUIRED = {
    "final": {"accuracy", "error", "loss", "dp_violation", "eo_violation"},
    "privacy": {"epsilon_target", "epsilon_spent", "delta", "per_silo", "accountant"},
    "timing": {"total_seconds", "seconds_per_round"},
}


def _config(algorithm: str, tmp_path, **extra) -> RunConfig:
    values = {
        "algorithm": algorithm,
        "dataset": "synthetic",
        "num-silos": 3,
        "rounds": 30,
        "batch-size": 64,
        "lr": 0.5,
        "out-dir": str(tmp_path / algorithm),
    } | extra
    return RunConfig.parse(values)


def _model(result: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in result["model"].items()}


def test_fedavg_inprocess_learns_and_writes_result(tmp_path) -> None:
    config = _config("fedavg", tmp_path, rounds=5, **{"lr": 0.1})
    result = run_job(config, progress=False)
    written = json.loads((tmp_path / "fedavg" / "result.json").read_text())
    assert written["final"] == result["final"]
    for block, keys in REQUIRED.items():
        assert keys <= set(written[block])
    assert written["final"]["accuracy"] > 0.8
    assert RunConfig.parse(written["config"]) == config  # the result is enough to rerun
    assert len(written["rounds"]) == 5 and written["privacy"]["epsilon_spent"] == "inf"


def test_dp_fedsgd_inprocess_spends_at_most_its_budget(tmp_path) -> None:
    config = _config("dp-fedsgd", tmp_path, epsilon=1.0)
    result = run_job(config, progress=False)
    privacy = result["privacy"]
    assert 0.5 < privacy["epsilon_spent"] <= 1.0
    assert sorted(privacy["per_silo"]) == ["0", "1", "2"]
    assert all(s["noise_multiplier"] > 0 for s in privacy["per_silo"].values())
    assert privacy["delta"] == pytest.approx(1 / 4500**2)  # 1/n^2 with n the federation's training records
    assert result["final"]["accuracy"] > 0.75
    spent = [r["epsilon_spent"] for r in result["rounds"]]
    assert spent == sorted(spent)  # the ledger never goes backwards


@pytest.mark.slow
def test_same_seed_same_result_and_other_seed_differs(tmp_path) -> None:
    a = run_job(_config("dp-fedsgd", tmp_path / "a", epsilon=2.0, rounds=5), progress=False)
    b = run_job(_config("dp-fedsgd", tmp_path / "b", epsilon=2.0, rounds=5), progress=False)
    c = run_job(_config("dp-fedsgd", tmp_path / "c", epsilon=2.0, rounds=5, seed=1), progress=False)
    assert a["model"] == b["model"]
    assert a["model"] != c["model"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("fedavg", {"lr": 0.1}),
        ("dp-fedsgd", {"epsilon": 1.0}),
        ("steffle", {"epsilon": 1.0, "lambda": 1.0}),
        ("steffle", {"epsilon": 1.0, "topology": "central-sensitive"}),  # 3 feature parties and a census
    ],
)
def test_ray_simulation_gives_the_inprocess_result(tmp_path, algorithm: str, extra: dict) -> None:
    import os

    config = _config(algorithm, tmp_path, rounds=3, **extra)
    pythonpath = os.environ.get("PYTHONPATH")
    ray = run_job(config, engine="ray", progress=False)
    assert os.environ.get("PYTHONPATH") == pythonpath  # Flower's Ray backend sets it; run_job puts it back
    local = run_job(config, engine="inprocess", progress=False)
    assert ray["engine"] == "ray" and local["engine"] == "inprocess"
    for name, value in _model(local).items():
        np.testing.assert_array_equal(_model(ray)[name], value)
    assert ray["final"] == local["final"]
    assert ray["server_state"] == local["server_state"]
    eps = ray["privacy"]["epsilon_spent"]
    assert eps == "inf" if algorithm == "fedavg" else (0 < eps <= 1.0 and not math.isinf(eps))


def test_silos_with_their_own_data_folders(tmp_path) -> None:
    """Deployment-style silos: each loads the folder `silofl data split` wrote for it (node config `data-path`)."""
    from silofl.server.cli import main

    assert main(["data", "split", "synthetic", "--silos", "3", "--out", str(tmp_path / "split")]) == 0
    folders = sorted(p for p in (tmp_path / "split").iterdir() if p.is_dir())  # beside them: preprocessing.json
    assert [f.name for f in folders] == ["silo_0", "silo_1", "silo_2"]
    config = _config("fedavg", tmp_path, rounds=3, lr=0.1)
    seeded = [{"data-path": str(f), "deterministic-noise": True} for f in folders]
    own = run_job(config, progress=False, node_configs=seeded)
    simulated = run_job(config, progress=False)
    assert own["federation"]["silos"] == simulated["federation"]["silos"]
    assert own["final"] == simulated["final"]  # same records and seeds, whichever way the silo got its data
    # by default a deployed silo draws from OS entropy: the server's seed does not determine its randomness
    entropy = run_job(config, progress=False, node_configs=[{"data-path": str(f)} for f in folders])
    assert entropy["model"] != own["model"]
