"""A ninth algorithm from outside silofl: a toy noisy FedAvg, defined and registered in this file only.

It is what a plugin author writes (issue 17: adding an algorithm is a local act): an option group, a silo round, a
server builder and one registry entry, with no silofl module edited. Each silo runs FedAvg's local SGD and adds
Gaussian noise of std `noise-std` to its model before sending it (a toy: no privacy is claimed); the server averages.

silofl finds it the way it finds any plugin: the module is named in ``SILOFL_ALGORITHMS``, which every process that
looks an algorithm up reads (Ray's workers too, which import this file afresh). Importing this module registers the
toy only when that variable names it, so that collecting the test suite leaves the registry as it is for the other
tests; the fixture registers it here and removes it afterwards.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from flwr.app import Context, Message
from pydantic import Field
from torch import nn

from silofl.client import randomness
from silofl.client.algorithms.fedavg import local_sgd
from silofl.client.data.tabular import SiloData
from silofl.client.rounds import RoundResult, with_records
from silofl.protocols import algorithms
from silofl.protocols import messages as msg
from silofl.protocols.algorithms.base import Algorithm, local_epochs_rounds
from silofl.protocols.models import get_parameters
from silofl.protocols.options import SILO, LocalEpochsOptions, OptionGroup, SgdOptions, TabularModelOptions
from silofl.strategies.base import StrategyInputs
from silofl.strategies.fedavg import FedAvg

NAME = "noisy-fedavg-toy"
NOISE_STREAM = 41  # this algorithm's own randomness stream


class ToyNoiseOptions(OptionGroup):
    """The toy's own option."""

    heading = "toy noise"
    noise_std: float = Field(default=0.01, ge=0.0, description="std of the noise a silo adds", json_schema_extra=SILO)


@with_records()
def toy_round(
    model: nn.Module, silo: SiloData, instr: msg.TrainInstruction, context: Context, message: Message
) -> RoundResult:
    """FedAvg's local epochs, then Gaussian noise of std `noise-std` on every parameter."""
    common = {"seed": instr.seed, "silo_id": silo.silo_id, "server_round": instr.server_round}
    rng = randomness.numpy_rng(context, stream=randomness.SHUFFLE, **common)
    n = local_sgd(
        model, silo.train.nonsensitive, epochs=instr.local_epochs, batch_size=instr.batch_size, lr=instr.lr, rng=rng
    )
    noise = randomness.numpy_rng(context, stream=NOISE_STREAM, **common)
    update = {
        k: (v + instr.noise_std * noise.standard_normal(v.shape)).astype(np.float32)
        for k, v in get_parameters(model).items()
    }
    report = msg.TrainReport(
        silo_id=silo.silo_id,
        server_round=instr.server_round,
        num_examples=n,
        epsilon_spent=float("inf"),
        noise_multiplier=0.0,
        sampling_rate=1.0,
    )
    return {msg.UPDATE: update}, report


def build_toy(inputs: StrategyInputs) -> FedAvg:
    return FedAvg(inputs.federation, inputs.tabular_spec(), **inputs.common)


def register_toy() -> Algorithm:
    return algorithms.register(
        Algorithm(
            name=NAME,
            summary="toy: FedAvg whose silos add Gaussian noise to their models",
            options=(TabularModelOptions, SgdOptions, LocalEpochsOptions, ToyNoiseOptions),
            defaults={"epochs": 3.0, "lr": 0.1},
            strategy=f"{__name__}:build_toy",
            silo={msg.TRAIN: f"{__name__}:toy_round"},
            rounds=local_epochs_rounds,
        ),
        replace=True,
    )


if __name__ in os.environ.get(algorithms.PLUGINS_ENV, "").split(","):  # a fresh process that looks the toy up
    register_toy()


@pytest.fixture
def toy(monkeypatch) -> Algorithm:
    tests_dir = os.path.dirname(os.path.abspath(__file__))  # so that Ray's workers can import this module
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(algorithms.PLUGINS_ENV, __name__)
    spec = register_toy()
    yield spec
    algorithms.unregister(NAME)


def _model(result: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in result["model"].items()}


def test_the_toy_runs_through_the_silofl_command_with_its_own_options(toy, tmp_path, capsys) -> None:
    from silofl.server.cli import main

    with pytest.raises(SystemExit):
        main(["run", NAME, "--help"])
    help_text = capsys.readouterr().out
    assert "--noise-std" in help_text and "--local-epochs" in help_text
    assert "--lambda" not in help_text and "--epsilon" not in help_text

    out = tmp_path / "toy"
    assert main(["run", NAME, "--rounds", "3", "--noise-std", "0.05", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["config"]["algorithm"] == NAME and result["config"]["noise-std"] == 0.05
    assert len(result["rounds"]) == 3 and result["final"]["accuracy"] > 0.6


def test_the_toy_without_noise_is_fedavg_and_its_noise_reaches_the_model(toy) -> None:
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    common = {"rounds": 2, "lr": 0.1, "batch-size": 64, "seed": 5}
    fedavg = run_job(RunConfig.parse({"algorithm": "fedavg", **common}), progress=False)
    silent = run_job(RunConfig.parse({"algorithm": NAME, "noise-std": 0.0, **common}), progress=False)
    noisy = run_job(RunConfig.parse({"algorithm": NAME, "noise-std": 0.5, **common}), progress=False)
    for name, value in _model(fedavg).items():
        np.testing.assert_array_equal(_model(silent)[name], value)
        assert np.abs(_model(noisy)[name] - value).max() > 0.05


@pytest.mark.slow
def test_the_toy_runs_in_a_ray_simulation_with_the_in_process_numbers(toy) -> None:
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    config = RunConfig.parse({"algorithm": NAME, "rounds": 2, "num-silos": 2, "seed": 3})
    inprocess = run_job(config, progress=False)
    ray = run_job(config, engine="ray", progress=False)
    assert ray["engine"] == "ray"
    for name, value in _model(inprocess).items():
        np.testing.assert_array_equal(_model(ray)[name], value)
