"""Run configuration: valid configs parse; bad ones fail naming the key and what it accepts."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from silofl.protocols.config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]


def test_valid_config_with_kebab_keys() -> None:
    cfg = RunConfig.parse({"algorithm": "dp-fedsgd", "num-silos": 4, "epochs": 2, "epsilon": 1.5, "batch-size": 32})
    assert cfg.num_silos == 4 and cfg.batch_size == 32 and cfg.epsilon == 1.5 and cfg.private


def test_epsilon_inf_string_means_no_noise() -> None:
    cfg = RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 3, "epsilon": "inf"})
    assert math.isinf(cfg.epsilon) and not cfg.private


def test_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "batchsize": 3})
    text = str(err.value)
    assert "unknown key 'batchsize'" in text and "batch-size" in text


def test_missing_algorithm_lists_choices() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({"rounds": 2})
    assert "missing key 'algorithm'" in str(err.value) and "fedavg, dp-fedsgd" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("lr", -1.0, "> 0.0"),
        ("heterogeneity", 1.5, "<= 1.0"),
        ("partition", "random", "'dirichlet'"),
        ("num-silos", 0, ">= 1"),
        ("delta", 1.0, "< 1.0"),
    ],
)
def test_out_of_range_value_names_key_and_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 2, key: value})
    assert f"key '{key}'" in str(err.value) and allowed in str(err.value)


def test_rounds_and_epochs_are_exclusive_and_one_is_needed() -> None:
    with pytest.raises(ConfigError, match="either 'rounds' or 'epochs'"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "epochs": 1})
    with pytest.raises(ConfigError, match="give 'rounds'"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 0, "epochs": 0})
    # one given alone replaces the algorithm's default length, the other follows from it
    assert RunConfig.parse({"algorithm": "fedavg", "rounds": 2}).epochs == 0
    assert RunConfig.parse({"algorithm": "fedavg", "epochs": 2}).rounds == 0
    assert RunConfig.parse({"algorithm": "fedavg"}).epochs == 40  # no length given: the algorithm's default


def test_epsilon_on_a_non_private_algorithm_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'epsilon' is an option of .*not of fedavg"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "epsilon": 1.0})
    # the value every private algorithm defaults to (no privacy) stays accepted, as old run configs carry it
    assert RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "epsilon": "inf"}).algorithm == "fedavg"


def test_file_dataset_needs_target_and_sensitive() -> None:
    with pytest.raises(ConfigError, match="also give 'target' and 'sensitive'"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "dataset": "my.csv"})


def test_builtin_tabular_datasets_take_sensitive_and_features_but_not_target() -> None:
    """`--dataset credit --sensitive EDUCATION` picks another attribute of a built-in table (the loaders support it);
    the target of a built-in is fixed, and the image datasets have no attribute to pick."""
    cfg = RunConfig.parse({"algorithm": "steffle", "rounds": 2, "dataset": "credit", "sensitive": "EDUCATION"})
    assert cfg.sensitive == "EDUCATION"
    with pytest.raises(ConfigError, match="'target' is fixed for the built-in dataset 'adult'"):
        RunConfig.parse({"algorithm": "steffle", "rounds": 2, "dataset": "adult", "target": "sex"})
    with pytest.raises(ConfigError, match="the image dataset 'mnist' has no sensitive attribute"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "dataset": "mnist", "features": "x"})
    with pytest.raises(ConfigError, match=r"'missing' applies to a \.csv/\.parquet 'dataset'"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 2, "dataset": "adult", "missing": "drop"})


def test_roundtrip_through_flower_run_config() -> None:
    cfg = RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 3})
    flat = cfg.to_run_config()
    assert flat["epsilon"] == "inf" and all(isinstance(v, str | int | float | bool) for v in flat.values())
    assert RunConfig.parse(flat) == cfg


def test_pyproject_run_config_is_the_one_the_registry_derives_and_runs() -> None:
    from silofl.protocols.config import flower_run_config

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert table == flower_run_config()  # regenerate: every key of every algorithm = "", see the comment there
    config = RunConfig.parse(table)  # "" = the algorithm's default: `flwr run .` with no override is a valid run
    assert config.algorithm == table["algorithm"]
    for algorithm in ("fedavg", "steffle", "mu2fl", "fedsc"):  # every other algorithm's keys are "" too
        assert RunConfig.parse({**table, "algorithm": algorithm}).algorithm == algorithm


def test_builtin_dataset_names_match_the_loaders() -> None:
    from silofl.client.data.loaders import BUILTIN_DATASETS as LOADERS
    from silofl.protocols.config import BUILTIN_DATASETS

    assert tuple(LOADERS) == BUILTIN_DATASETS
