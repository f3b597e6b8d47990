"""The algorithm registry (protocols/algorithms): every registered algorithm runs from the `silofl` command as a user
runs it, its `--help` lists its own options only, and the core never asks an algorithm's name."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from silofl.protocols import algorithms
from silofl.protocols.config import ConfigError, RunConfig
from silofl.server.cli import main

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ["fedavg", "dp-fedsgd", "steffle", "tran", "mu2fl", "noisy-sgd", "fedsc", "fedavg-sc", "fedfdp"]


def test_the_registry_holds_the_builtin_algorithms_with_their_aliases() -> None:
    assert algorithms.names()[: len(BUILTIN)] == BUILTIN
    assert algorithms.get("fedavg+sc").name == "fedavg-sc"
    assert algorithms.get("DP-FedSGD").name == "dp-fedsgd"
    with pytest.raises(KeyError, match="did you mean 'steffle'"):
        algorithms.get("stefle")


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN)
def test_every_algorithm_runs_from_the_silofl_command_with_the_progress_bar(name, tmp_path) -> None:
    """Nothing but a small round budget: the algorithm's own defaults (dataset included) make a sensible run."""
    out = tmp_path / name
    assert main(["run", name, "--rounds", "3", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    spec = algorithms.get(name)
    assert result["config"]["algorithm"] == name
    assert result["config"]["dataset"] == spec.config_model.model_fields["dataset"].default
    assert result["federation"]["rounds"] == 3 and result["status"]["completed"]
    assert 0.0 <= result["final"]["accuracy"] <= 1.0
    assert RunConfig.parse(result["config"]).to_json() == result["config"]  # the result reruns the job


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp-fedsgd", "steffle", "tran", "mu2fl", "noisy-sgd", "fedsc", "fedfdp"])
def test_every_private_algorithm_spends_at_most_its_epsilon_from_the_command(name, tmp_path) -> None:
    out = tmp_path / name
    assert main(["run", name, "--rounds", "3", "--epsilon", "4", "--out", str(out), "--no-progress"]) == 0
    privacy = json.loads((out / "result.json").read_text())["privacy"]
    assert privacy["epsilon_target"] == 4.0
    assert 0.0 < privacy["epsilon_spent"] <= 4.0 + 1e-9


def _flags(name: str, capsys) -> set[str]:
    with pytest.raises(SystemExit):
        main(["run", name, "--help"])
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", capsys.readouterr().out))


#: For each algorithm, options it must offer and options of others it must not.
OWN_AND_FOREIGN = {
    "fedavg": ({"--local-epochs", "--lr", "--model"}, {"--epsilon", "--lambda", "--clip", "--rho", "--views"}),
    "dp-fedsgd": ({"--epsilon", "--clip", "--lr-decay"}, {"--lambda", "--local-epochs", "--rho", "--views"}),
    "steffle": ({"--lambda", "--w-radius", "--fairness", "--counts-share"}, {"--dual-lr", "--rho", "--views"}),
    "tran": ({"--lambda", "--dual-lr", "--fairness"}, {"--w-radius", "--w-lr", "--rho"}),
    "mu2fl": ({"--rho", "--trust", "--domain-diameter"}, {"--lr", "--clip", "--lambda", "--hidden", "--views"}),
    "fedsc": ({"--views", "--calr-sampling-rate", "--server-optimizer"}, {"--lambda", "--clip", "--rho"}),
    "fedavg-sc": ({"--local-steps", "--server-optimizer"}, {"--epsilon", "--views", "--calr-sampling-rate"}),
    "fedfdp": (
        {"--epsilon", "--clip", "--lambda", "--lr"},
        {"--w-radius", "--dual-lr", "--fairness", "--rho", "--views"},
    ),
}


@pytest.mark.parametrize("name", sorted(OWN_AND_FOREIGN))
def test_run_help_lists_the_algorithms_options_only(name, capsys) -> None:
    flags = _flags(name, capsys)
    own, foreign = OWN_AND_FOREIGN[name]
    assert own <= flags
    assert not foreign & flags
    assert {"--dataset", "--silos", "--rounds", "--epochs", "--seed", "--out", "--engine"} <= flags


def test_every_option_of_an_algorithm_is_a_flag_of_its_command(capsys) -> None:
    for spec in algorithms.specs():
        flags = _flags(spec.name, capsys)
        keys = {info.alias or n.replace("_", "-") for n, info in spec.config_model.model_fields.items()}
        missing = {k for k in keys - {"algorithm", "resume"} if f"--{k}" not in flags}
        assert not missing, f"{spec.name}: no flag for {sorted(missing)}"


def test_a_key_of_another_algorithm_is_refused_with_its_owners_unless_it_asks_for_nothing() -> None:
    with pytest.raises(ConfigError, match="'lambda' is an option of steffle, tran, fedfdp, not of fedavg"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 3, "lambda": 2})
    # epsilon = inf asks nothing of a non-private algorithm (the `flwr run` line for fedavg in docs/USAGE.md gives it)
    assert RunConfig.parse({"algorithm": "fedavg", "rounds": 3, "epsilon": "inf"}).private is False
    with pytest.raises(ConfigError, match="'epsilon' is an option of"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 3, "epsilon": 1})
    stored = {"algorithm": "fedavg", "rounds": 3, "lambda": 2, "views": 2}  # an older result.json: every key
    assert "lambda" not in RunConfig.parse(stored, other_algorithms="ignore").to_json()


def test_rounds_or_epochs_given_alone_replaces_the_algorithms_default_length() -> None:
    assert RunConfig.parse({"algorithm": "steffle", "rounds": 7}).epochs == 0
    assert RunConfig.parse({"algorithm": "fedsc", "epochs": 2}).rounds == 0
    assert RunConfig.parse({"algorithm": "steffle", "epochs": ""}).epochs == 40  # "": the algorithm's default


def test_each_algorithm_has_its_own_defaults() -> None:
    steffle = RunConfig.parse({"algorithm": "steffle"})
    assert (steffle.epochs, steffle.lr, steffle.lr_decay, steffle.lr_decay_epochs) == (40, 0.25, 0.8, 10)
    mu2 = RunConfig.parse({"algorithm": "mu2fl"})
    assert (mu2.dataset, mu2.epochs, mu2.batch_size) == ("digits", 1, 1)  # one pass: epochs <= 1
    fedsc = RunConfig.parse({"algorithm": "fedsc"})
    assert (fedsc.dataset, fedsc.num_silos, fedsc.partition, fedsc.rounds) == ("digits", 10, "classes", 800)
    assert math.isinf(RunConfig.parse({"algorithm": "tran"}).epsilon)


def test_the_train_instruction_of_an_algorithm_holds_its_silo_options_only() -> None:
    steffle = algorithms.get("steffle").instruction_model.model_fields
    assert {"lam", "clip", "fairness", "counts_share", "batch_size", "lr"} <= set(steffle)
    assert not {"w_radius", "w_lr", "views", "rho", "dual_lr", "lr_decay"} & set(steffle)  # server-side or foreign
    fedsc = algorithms.get("fedsc").instruction_model.model_fields
    assert {"views", "calr_sampling_rate", "alpha", "planned_shares", "mu"} <= set(fedsc)
    assert not {"alpha_start", "server_lr", "knn_k", "lam"} & set(fedsc)


#: A comparison of an algorithm with a literal or a constant set of names: `algorithm == "x"`, `.algorithm in ("a",
#: "b")`, `algorithm not in SSL_ALGORITHMS`, `"steffle" != name`.
_NAMES = "|".join(BUILTIN)
_COMPARISON = re.compile(
    r"algorithm\b\s*(==|!=)\s*[\"']"  # algorithm == "x"
    r"|algorithm\b\s*(not in|in)\s*([(\[{]\s*[\"']|[A-Z_]+\b)"  # algorithm in ("a", "b") / in SSL_ALGORITHMS
    rf"|[\"']({_NAMES})[\"']\s*(==|!=)"  # "steffle" == name
)


def test_the_core_never_compares_algorithm_names() -> None:
    """Issue 17's measure: literal algorithm-name comparisons outside the registry and the algorithm modules."""
    found = []
    for folder in ("server", "client", "strategies", "protocols"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent.name == "algorithms" and path.parent.parent.name == "protocols":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if _COMPARISON.search(code):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert len(found) <= 3, "\n".join(found)
    assert not found, "\n".join(found)  # none today: keep it that way
