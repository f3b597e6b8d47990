"""`--device auto|cpu|cuda` for the algorithms that train a torch model (`protocols.devices`), tested on a machine
without a GPU: `auto` resolves to the CPU and changes no number, `cuda` is refused at the command line before
anything runs and by a silo that has no GPU, the device reaches the silos' instructions, and the Ray engine's GPU
share follows from the device (a pure function). benchmarks/README.md records a GPU run (benchmarks/device_compare.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from silofl.protocols import algorithms
from silofl.protocols import messages as msg
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.devices import device_problem, ray_client_resources, resolve_device
from silofl.server.cli import main
from tests import malicious_server as ms

TORCH_TABULAR = ("fedavg", "dp-fedsgd", "steffle", "tran", "fedfdp")
SMALL = {"rounds": 2, "num-silos": 2, "max-train-records": 100, "batch-size": 40, "eval-every": 1}


@pytest.mark.parametrize("name", TORCH_TABULAR)
def test_every_tabular_torch_algorithm_has_the_option_and_sends_it_to_the_silos(name: str) -> None:
    config = RunConfig.parse({"algorithm": name, "rounds": 1, "device": "auto"})
    assert config.device == "auto"
    assert RunConfig.parse({"algorithm": name, "rounds": 1}).device == "cpu"  # the default: today's numbers
    assert "device" in algorithms.get(name).instruction_model.model_fields


@pytest.mark.parametrize("name", ["mu2fl", "noisy-sgd"])
def test_the_numpy_algorithms_have_no_device_option(name: str) -> None:
    with pytest.raises(ConfigError, match=r"'device' is an option of .*not of"):
        RunConfig.parse({"algorithm": name, "rounds": 1, "device": "cuda", "dataset": "digits"})


def test_auto_resolves_to_the_cpu_without_a_gpu_and_to_cuda_with_one(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert device_problem("cuda", 0) is not None and device_problem("cuda", 1) is None
    assert device_problem("auto", 0) is None and device_problem("cpu", 0) is None


def test_cuda_without_a_gpu_is_refused_at_the_command_line_before_anything_runs(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    from silofl.protocols import devices

    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    loaded = []
    monkeypatch.setattr("silofl.client.data.preflight.preflight", lambda *a, **k: loaded.append(1) or [])
    out = tmp_path / "run"
    assert main(["run", "dp-fedsgd", "--device", "cuda", "--rounds", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: torch sees no CUDA GPU on this machine" in err and "--device auto" in err
    assert not loaded and not out.exists()  # before the data was loaded, before any silo


def test_a_silo_without_a_gpu_refuses_a_cuda_instruction() -> None:
    """A deployed silo (or a Ray cluster's node) that the command line could not check refuses the first message."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    node = ms.SimulatedNode(ms.make_silo(200, n_test=50))
    node.info = node.setup()
    params = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels)
    content = ms.train("dp-fedsgd", params, server_round=1, total_rounds=2, batch_size=50, device="cuda", epsilon=1.0)
    reason = ms.error_reason(node.send(msg.TRAIN, content, 1))
    assert "device 'cuda' was asked for but torch sees no CUDA device here" in reason


def test_auto_reaches_every_instruction_and_gives_the_cpus_numbers(tmp_path: Path) -> None:
    """On this machine (no GPU) a silo resolves auto to the CPU: the same numbers, bit for bit, as device cpu. The
    train and evaluate instructions carry the run's device (each silo resolves auto on its own hardware)."""
    from silofl.client.app import app as client_app
    from silofl.server.engines import run_job
    from silofl.server.orchestrator import run_federation
    from tests.recording_grid import RecordingGrid

    if torch.cuda.is_available():
        pytest.skip("auto resolves to cuda on this machine")
    base = {"algorithm": "steffle", "epsilon": 1.0, "lambda": 1.0, "model": "mlp", "hidden": 8, **SMALL}
    auto = RunConfig.parse({**base, "device": "auto"})
    grid = RecordingGrid(client_app, auto.num_nodes)
    with_auto = run_federation(grid, auto)
    devices = {
        (m.metadata.message_type, m.content[msg.CONFIG]["device"])
        for m, _ in grid.log
        if m.metadata.message_type in (msg.TRAIN, msg.EVALUATE)
    }
    assert devices == {(msg.TRAIN, "auto"), (msg.EVALUATE, "auto")}
    with_cpu = run_job(RunConfig.parse({**base, "device": "cpu"}), progress=False)
    assert with_auto["final"] == with_cpu["final"]
    for name, value in with_cpu["model"].items():
        assert np.array_equal(np.asarray(with_auto["model"][name]), np.asarray(value)), name


@pytest.mark.parametrize(
    ("device", "nodes", "gpus", "share"),
    [
        ("cpu", 3, 0, 0.0),
        ("cpu", 3, 2, 0.0),  # cpu never takes a GPU
        ("auto", 3, 0, 0.0),  # auto without a GPU: cpu
        ("auto", 3, 1, 0.3333),  # auto with one: as cuda
        ("cuda", 3, 1, 0.3333),  # three nodes fit on one GPU at once (3 x 0.3333 <= 1)
        ("cuda", 8, 4, 0.5),
        ("cuda", 2, 4, 1.0),  # a node never spans GPUs
        ("cuda", 7, 2, 0.2857),  # rounded down: 7 x 0.2857 = 1.9999 <= 2
        ("cuda", 3, None, 1.0),  # a Ray cluster: one GPU per node, as many at a time as it has GPUs
        ("auto", 3, None, 0.0),
    ],
)
def test_the_ray_gpu_share_follows_the_device(device: str, nodes: int, gpus: int | None, share: float) -> None:
    resources = ray_client_resources(device, nodes, gpus)
    assert resources == {"num_cpus": 1, "num_gpus": share}
    if gpus is not None:
        assert nodes * resources["num_gpus"] <= gpus  # every node fits on the GPUs at once


def test_the_ray_share_refuses_cuda_without_a_gpu_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        ray_client_resources("cuda", 3, 0)
    with pytest.raises(ValueError, match="num_nodes"):
        ray_client_resources("cpu", 0, 0)
    with pytest.raises(ValueError, match="device"):
        ray_client_resources("tpu", 3, 1)


def test_the_ray_engine_asks_for_the_share_of_the_runs_device(monkeypatch) -> None:
    from silofl.protocols import devices
    from silofl.server.engines import client_resources

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(devices, "visible_gpus", lambda: 1)
    cuda = RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 1, "num-silos": 4, "device": "cuda"})
    assert client_resources(cuda) == {"num_cpus": 1, "num_gpus": 0.25}
    assert client_resources(cuda, "ray://head:10001") == {"num_cpus": 1, "num_gpus": 1.0}  # a cluster's GPUs
    cpu = RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 1, "num-silos": 4})
    assert client_resources(cpu) == {"num_cpus": 1, "num_gpus": 0.0}  # what the engine always asked for
    parties = RunConfig.parse(
        {"algorithm": "steffle", "rounds": 1, "num-silos": 3, "topology": "central-sensitive", "device": "auto"}
    )
    assert client_resources(parties) == {"num_cpus": 1, "num_gpus": 0.25}  # 3 feature + 1 sensitive party
    fedsc = RunConfig.parse({"algorithm": "fedsc", "rounds": 1, "num-silos": 2, "device": "cuda"})
    assert client_resources(fedsc)["num_gpus"] == 0.5


def test_the_device_comparison_benchmark_compares_only_numeric_metrics() -> None:
    from tests.benchmark_scripts import load_script

    compare = load_script("device_compare.py", "device_compare_under_test")
    cpu = {"accuracy": 0.8, "loss": 0.5, "knn_accuracy": None}
    cuda = {"accuracy": 0.8, "loss": 0.5000001, "knn_accuracy": None}
    assert compare.max_metric_gap(cpu, cuda) == pytest.approx(1e-7)
    assert np.isnan(compare.max_metric_gap({"loss": None}, {"loss": None}))
    for arguments in compare.CASES.values():  # every case is a command line `silofl run` accepts
        RunConfig.parse({"algorithm": arguments.split()[0], "rounds": 1})


@pytest.mark.slow
def test_the_device_comparison_benchmark_runs_a_case_on_the_cpu(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "device_compare.py"
    done = subprocess.run(
        [sys.executable, str(script), "--devices", "cpu", "--cases", "fedsc cnn", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| fedsc cnn | " in done.stdout
    import json

    run = json.loads((tmp_path / "summary.json").read_text())["runs"]["fedsc cnn"]["cpu"]
    assert "error" not in run and run["rounds"] == 5 and run["seconds_per_round"] > 0
