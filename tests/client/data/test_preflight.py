"""The input checks before anything starts (client/data/preflight.py): what a new user's file does to `silofl run`
and `silofl data split` before a federation starts.

Most tests call `preflight(config)` on small files in tmp_path; the `*_cli_*` tests go through `silofl`'s entry
point (`server.cli.main`) and need the call in `run_command` (see the module docstring of client/data/preflight.py).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.client import silo_data
from silofl.client.data.loaders import load_dataset
from silofl.client.data.preflight import MIN_TRAIN_RECORDS, Node, check_nodes, preflight, uses_group_fairness
from silofl.client.data.tabular import DataError
from silofl.protocols import algorithms
from silofl.protocols.config import ConfigError, RunConfig

N = 400  # records of the test tables: 300 training (100 per silo of 3), 100 test


def table(n: int = N, seed: int = 0) -> pd.DataFrame:
    """A small loan table with a non-ASCII category, a numeric column, two groups and two labels."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(18, 80, n),
            "income": rng.normal(50_000, 20_000, n).round(2),
            "city": rng.choice(["Zürich", "Genève", "Basel"], n),
            "sex": rng.choice(["F", "M"], n),
            "approved": rng.choice(["no", "yes"], n),
        }
    )


def write(frame: pd.DataFrame, path: Path, **kwargs) -> str:
    frame.to_csv(path, index=False, **kwargs)
    return str(path)


def config(dataset: str, algorithm: str = "fedavg", **values) -> RunConfig:
    base = {"algorithm": algorithm, "rounds": 1, "dataset": dataset, "target": "approved", "sensitive": "sex"}
    return RunConfig.parse({**base, **values})


def lines_with(warnings: list[str], needle: str) -> list[str]:
    return [w for w in warnings if needle in w]


@pytest.fixture(autouse=True)
def _fresh_silo_cache():
    """Each test loads its own files (tmp_path names repeat across tests)."""
    silo_data._partitioned.cache_clear()
    silo_data._parties.cache_clear()
    yield
    silo_data._partitioned.cache_clear()
    silo_data._parties.cache_clear()


# -- how a CSV file is read --------------------------------------------------------------------------------------
def test_semicolon_csv_is_detected_said_once_and_read_as_the_comma_file(tmp_path: Path) -> None:
    frame = table()
    (tmp_path / "semi").mkdir()
    (tmp_path / "comma").mkdir()
    semi = write(frame, tmp_path / "semi" / "loans.csv", sep=";")
    comma = write(frame, tmp_path / "comma" / "loans.csv")
    warnings = preflight(config(semi))
    said = lines_with(warnings, "the detected separator")
    assert len(said) == 1 and "';'" in said[0] and "--csv-sep ';'" in said[0] and "\n" not in said[0]
    assert not lines_with(preflight(config(semi, csv_sep=";")), "the detected separator")  # given: nothing to say
    assert not lines_with(preflight(config(comma)), "the detected separator")  # the default: nothing to say
    read, expected = (load_dataset(p, target="approved", sensitive=["sex"]) for p in (semi, comma))
    assert read.info == expected.info
    np.testing.assert_array_equal(read.train.nonsensitive.features, expected.train.nonsensitive.features)
    # The wrong separator given explicitly: the header reads as one column, and the refusal says which flag fixes it.
    with pytest.raises(ConfigError, match="--target") as info:
        preflight(config(semi, csv_sep=","))
    assert "--csv-sep ';'" in str(info.value)


def test_latin1_csv_is_detected_and_its_letters_kept(tmp_path: Path) -> None:
    path = write(table(), tmp_path / "latin.csv", encoding="latin-1")
    warnings = preflight(config(path))
    said = lines_with(warnings, "the detected encoding")
    assert len(said) == 1 and "latin-1" in said[0] and "--csv-encoding latin-1" in said[0]
    assert not lines_with(preflight(config(path, csv_encoding="latin-1")), "the detected encoding")
    ds = load_dataset(path, target="approved", sensitive=["sex"])
    assert "city=Zürich" in ds.info.feature_names and "city=Genève" in ds.info.feature_names
    with pytest.raises(ConfigError, match="not valid utf-8") as info:  # a wrong encoding given: refused, not garbled
        preflight(config(path, csv_encoding="utf-8"))
    assert "--csv-encoding" in str(info.value) and "latin.csv" in str(info.value)


def test_csv_options_are_run_config_keys_for_csv_files_only(tmp_path: Path) -> None:
    """`csv-sep` and `csv-encoding` are run-config keys (silofl run flags, sweeps, flwr run --run-config); 'tab' and a
    typed '\\t' are a tab; nonsense is refused naming the key."""
    path = str(tmp_path / "t.csv")
    assert config(path, csv_sep="tab").csv_sep == "\t"
    assert config(path, **{"csv-sep": "\\t"}).to_run_config()["csv-sep"] == "\t"
    with pytest.raises(ConfigError, match="key 'csv-sep'"):
        config(path, csv_sep=";;")
    with pytest.raises(ConfigError, match="key 'csv-encoding'"):
        config(path, csv_encoding="klingon")
    with pytest.raises(ConfigError, match=r"'csv-sep' and 'csv-encoding' say how to read a \.csv 'dataset'"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": 1, "csv-sep": ";"})  # the built-in synthetic dataset


# -- columns -------------------------------------------------------------------------------------------------------
def test_one_text_value_in_a_numeric_column_warns_naming_the_column_and_the_value(tmp_path: Path) -> None:
    frame = table().astype({"age": object})
    frame.loc[7, "age"] = "unknown"
    path = write(frame, tmp_path / "typo.csv")
    ds = load_dataset(path, target="approved", sensitive=["sex"])
    assert sum(name.startswith("age=") for name in ds.info.feature_names) > 50  # the harm: one-hot, not one feature
    said = lines_with(preflight(config(path)), "'age'")
    assert len(said) == 1
    assert "'unknown' (1 record)" in said[0] and f"{N - 1} of its {N} values are numbers" in said[0]
    assert "--features" in said[0]
    clean = write(table(), tmp_path / "clean.csv")
    assert not lines_with(preflight(config(clean)), "read as text")


def test_missing_columns_are_refused_naming_the_option(tmp_path: Path) -> None:
    path = write(table(), tmp_path / "t.csv")
    for key, given, refused in [
        ("target", "label", "--target: 'label' is not a column"),
        ("sensitive", "gender", "--sensitive: 'gender' is not a column"),
        ("features", "age,salary", "--features: 'salary' is not a column"),
    ]:
        with pytest.raises(ConfigError, match=refused) as info:
            preflight(config(path, **{key: given}))
        assert "its columns: age, income, city, sex, approved" in str(info.value)


# -- groups --------------------------------------------------------------------------------------------------------
def test_one_sensitive_group_is_refused_for_a_fairness_regularizer_and_fine_for_fedavg(tmp_path: Path) -> None:
    path = write(table().assign(sex="F"), tmp_path / "women.csv")
    with pytest.raises(ConfigError, match="every record has the value 'F', a single group") as info:
        preflight(config(path, "steffle", epsilon=1))
    assert "--sensitive" in str(info.value) and "fedavg" in str(info.value)  # the fix, and who runs without one
    said = lines_with(preflight(config(path, "fedavg")), "single group")
    assert len(said) == 1 and "no fairness violation" in said[0]
    # The registry decides, not the name: every tabular algorithm is refused exactly when its entry has a
    # group-fairness regularizer.
    for name in ("fedavg", "dp-fedsgd", "fedfdp", "steffle", "tran"):
        refused = uses_group_fairness(algorithms.get(name))
        try:
            preflight(config(path, name))
        except ConfigError as exc:
            assert refused and "single group" in str(exc), (name, exc)
        else:
            assert not refused, name
    assert {s.name for s in algorithms.specs() if uses_group_fairness(s)} >= {"steffle", "tran"}


def test_a_group_or_label_seen_only_in_the_test_split_warns(tmp_path: Path) -> None:
    from silofl.client.data.generic import split_indices

    frame = table()
    test_row = int(split_indices(N, 0.25, seed=0)[1][0])  # a record the seed-0 split puts in the test split
    frame.loc[test_row, "sex"] = "X"
    frame.loc[test_row, "approved"] = "maybe"
    warnings = preflight(config(write(frame, tmp_path / "t.csv")))
    assert len(lines_with(warnings, "sensitive group(s) 'X' of --sensitive sex have no training record")) == 1
    assert len(lines_with(warnings, "label(s) 'maybe' have no training record")) == 1


# -- batch size and delta --------------------------------------------------------------------------------------------
def test_a_batch_larger_than_a_silo_warns_that_the_sampling_rate_is_capped(tmp_path: Path) -> None:
    path = write(table(), tmp_path / "t.csv")
    said = lines_with(preflight(config(path, "dp-fedsgd", epsilon=1, batch_size=100_000)), "--batch-size 100000")
    assert len(said) == 1
    assert "capped at 1" in said[0] and "amplification" in said[0] and "100 records" in said[0]
    assert not lines_with(preflight(config(path, "dp-fedsgd", epsilon=1, batch_size=64)), "--batch-size")


def test_a_single_pass_with_more_records_than_a_silo_holds_is_refused(tmp_path: Path) -> None:
    """DP-mu2-FL's silos refuse a first round whose rounds x batch exceed their records: refused before it starts."""
    path = write(table(), tmp_path / "t.csv")
    with pytest.raises(ConfigError, match="--batch-size 200 x 1 round needs 200 training records"):
        preflight(config(path, "mu2fl", rounds=0, epochs=1, batch_size=200))
    assert preflight(config(path, "mu2fl", rounds=0, epochs=1, batch_size=50)) == []


def test_delta_above_one_over_n_warns_naming_n(tmp_path: Path) -> None:
    path = write(table(), tmp_path / "t.csv")
    n_train = 300
    said = lines_with(preflight(config(path, "dp-fedsgd", epsilon=1, delta=0.01, batch_size=32)), "--delta")
    assert len(said) == 1 and f"n = {n_train} training records" in said[0] and "1/n" in said[0]
    assert not lines_with(preflight(config(path, "dp-fedsgd", epsilon=1, delta=1e-5, batch_size=32)), "--delta")
    assert not lines_with(preflight(config(path, "dp-fedsgd", epsilon=1, batch_size=32)), "--delta")  # 1/n^2


# -- too few records ---------------------------------------------------------------------------------------------------
def test_too_few_records_are_refused_naming_the_split_and_the_fix(tmp_path: Path) -> None:
    path = write(table(12), tmp_path / "twelve.csv")  # 9 training records for 3 silos
    with pytest.raises(ConfigError, match="the training split has 9 records, 3 per silo for --silos 3") as info:
        preflight(config(path))
    assert f"at least {MIN_TRAIN_RECORDS} training records" in str(info.value)
    path = write(table(100), tmp_path / "hundred.csv")  # 75 training, 25 test: 30 silos are too many for both
    with pytest.raises(ConfigError, match="use --silos 7 or fewer"):
        preflight(config(path, num_silos=30))
    with pytest.raises(ConfigError, match="--max-train-records 5 caps every silo below"):
        preflight(config(path, max_train_records=5))
    with pytest.raises(ConfigError, match=r"silo 2 \(3 records\)"):  # a skewed partition: the totals would do
        check_nodes([Node("silo 0", 40, 5), Node("silo 1", 40, 5), Node("silo 2", 3, 1)])


def test_a_header_only_file_is_refused_in_the_command_lines_words(tmp_path: Path) -> None:
    path = write(table().head(0), tmp_path / "empty.csv")
    with pytest.raises(ConfigError) as info:
        preflight(config(path))
    text = str(info.value)
    assert "--dataset" in text and "header row and no records" in text
    assert "training split" in text and "test split" in text and "test_fraction" not in text
    with pytest.raises(DataError) as info:  # a silo loading it says the same without the internal name
        load_dataset(path, target="approved", sensitive=["sex"])
    assert "no records" in str(info.value) and "test_fraction" not in str(info.value)


def test_a_missing_file_is_refused_naming_the_path_and_the_option(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "loans.csv")
    with pytest.raises(ConfigError, match=re.escape(f"--dataset {missing}: no such file")):
        preflight(config(missing))


# -- sharing the load with the in-process silos ------------------------------------------------------------------------
def test_the_in_process_silos_reuse_the_checked_load(tmp_path: Path) -> None:
    """The checks load the data through the silos' own cache, under the DataSpec the server's setup round sends: an
    in-process run then loads nothing again."""
    from silofl.server.engines import run_job

    cfg = config(write(table(), tmp_path / "t.csv"), out_dir="")
    preflight(cfg)
    loads = silo_data._partitioned.cache_info().misses
    result = run_job(cfg, engine="inprocess", progress=False)
    assert result["status"]["completed"]
    assert silo_data._partitioned.cache_info().misses == loads
    preflight(cfg, share_with_silos=False)  # --engine ray: the silos are other processes; nothing is kept
    assert silo_data._partitioned.cache_info().currsize == 0


# -- `silofl data split` ---------------------------------------------------------------------------------------------
def split(argv: list[str]) -> int:
    from silofl.client.data.split_cli import add_data_parser

    parser = argparse.ArgumentParser(prog="silofl")
    add_data_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "split", *argv])
    return int(args.func(args))


def test_data_split_gets_the_same_checks(tmp_path: Path, capsys) -> None:
    columns = ["--target", "approved", "--sensitive", "sex"]
    semi = write(table(), tmp_path / "semi.csv", sep=";")
    assert split([semi, "--silos", "3", *columns, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("silofl: warning:") == 1 and "separator ';'" in err
    assert split([semi, "--silos", "3", *columns, "--csv-sep", ";", "--out", str(tmp_path / "b")]) == 0
    assert "warning" not in capsys.readouterr().err
    empty = write(table().head(0), tmp_path / "empty.csv")
    assert split([empty, "--silos", "3", *columns, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "header row and no records" in err and "test_fraction" not in err
    twelve = write(table(12), tmp_path / "twelve.csv")
    assert split([twelve, "--silos", "3", *columns, "--out", str(tmp_path / "d")]) == 2
    assert "the training split has 9 records" in capsys.readouterr().err
    women = write(table().assign(sex="F"), tmp_path / "women.csv")
    assert split([women, "--silos", "3", *columns, "--out", str(tmp_path / "e")]) == 0
    err = capsys.readouterr().err
    assert "single group" in err and "steffle" in err  # the registry's fairness algorithms will refuse these silos
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


# -- through `silofl run` (needs `preflight` called in server/cli.py's run_command) --------------------
def test_cli_missing_file_is_refused_before_any_federation_starts(tmp_path: Path, capsys, monkeypatch) -> None:
    from silofl.server import engines
    from silofl.server.cli import main

    def no_federation(*args, **kwargs):
        raise AssertionError("the federation was started")

    monkeypatch.setattr(engines, "run_job", no_federation)
    missing = tmp_path / "missing.csv"
    argv = ["run", "fedavg", "--dataset", str(missing), "--target", "y", "--sensitive", "s", "--rounds", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--dataset" in err and str(missing) in err and "no such file" in err
    assert "the run stopped" not in err and not (tmp_path / "run").exists()


def test_cli_prints_each_warning_on_one_line_and_runs(tmp_path: Path, capsys) -> None:
    from silofl.server.cli import main

    frame = table().astype({"age": object})
    frame.loc[3, "age"] = "?"
    path = write(frame, tmp_path / "loans.csv", sep=";")
    out = tmp_path / "run"
    argv = ["run", "dp-fedsgd", "--dataset", path, "--target", "approved", "--sensitive", "sex", "--rounds", "1"]
    assert main([*argv, "--epsilon", "1", "--batch-size", "100000", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("silofl: warning: ")]
    assert len(warnings) == 3, err  # the separator, the text value in 'age', the capped sampling rate
    assert "separator ';'" in warnings[0] and "'age'" in warnings[1] and "'?'" in warnings[1]
    assert "--batch-size 100000" in warnings[2] and "capped at 1" in warnings[2]
    assert json.loads((out / "result.json").read_text())["status"]["completed"]


def test_cli_refuses_one_group_for_steffle_with_exit_2(tmp_path: Path, capsys) -> None:
    from silofl.server.cli import main

    path = write(table().assign(sex="M"), tmp_path / "men.csv")
    argv = ["run", "steffle", "--dataset", path, "--target", "approved", "--sensitive", "sex", "--rounds", "1"]
    assert main([*argv, "--epsilon", "1", "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("silofl: ") and "single group" in err and not (tmp_path / "run").exists()


def test_cli_csv_options_reach_the_silos(tmp_path: Path, capsys) -> None:
    """A ';'-separated file that also splits on ',' into as many fields: detection picks ',' (the first of a tie),
    so the run works only if `--csv-sep ';'` reaches the silos (the setup round's DataSpec, client/silo_data.py)."""
    from silofl.server.cli import main

    rows = ["f,1,2;sex;y"] + [f"{i},5,7;{'FM'[i % 2]};{i % 3 == 0:d}" for i in range(N)]
    path = tmp_path / "tie.csv"
    path.write_text("\n".join(rows) + "\n")
    argv = ["run", "fedavg", "--dataset", str(path), "--target", "y", "--sensitive", "sex", "--rounds", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "guess")]) == 2  # read with ',': no column 'y'
    assert "is not a column" in (err := capsys.readouterr().err) and "give --csv-sep ';'" in err
    assert main([*argv, "--csv-sep", ";", "--no-progress", "--out", str(tmp_path / "run")]) == 0, capsys.readouterr()
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["config"]["csv-sep"] == ";" and result["federation"]["group_names"] == ["F", "M"]
