"""`silofl` command line: run writes result.json; bad flags fail with a message naming the key."""

from __future__ import annotations

import json

import pytest

from silofl.server.cli import main


@pytest.mark.slow
def test_run_writes_result_and_prints_summary(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "dp-fedsgd",
            "--epsilon",
            "2",
            "--rounds",
            "4",
            "--batch-size",
            "64",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["config"]["algorithm"] == "dp-fedsgd" and result["federation"]["rounds"] == 4
    assert 0 < result["privacy"]["epsilon_spent"] <= 2
    assert "result.json" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "fedavg", "--heterogeneity", "2", "--rounds", "1"], "key 'heterogeneity'"),
        (["run", "fedavg", "--epsilon", "1", "--rounds", "1"], "is an option of dp-fedsgd"),
        (["run", "fedavg", "--epslon", "1", "--rounds", "1"], "did you mean 'epsilon'"),
        (["run", "dp-fedsgd", "--lr", "-1", "--rounds", "1"], "key 'lr'"),
        (["run", "fedavg", "--dataset", "x.csv", "--rounds", "1"], "'target' and 'sensitive'"),
    ],
)
def test_bad_flags_exit_2_naming_the_key(argv: list[str], needle: str, capsys) -> None:
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_unknown_dataset_is_a_clear_error(tmp_path, capsys) -> None:
    code = main(["run", "fedavg", "--dataset", "nosuch", "--rounds", "1", "--no-progress", "--out", str(tmp_path)])
    assert code == 2
    assert "'nosuch' is neither a built-in dataset" in capsys.readouterr().err


def test_a_silo_failure_stops_the_run_with_exit_1(tmp_path, capsys, monkeypatch) -> None:
    """A silo that fails to load its data after the command line's checks passed stops the run: exit 1."""
    from silofl.client import app as client_app

    def broken(context, spec):
        raise OSError("disk gone: /data/silo.csv")

    monkeypatch.setattr(client_app, "load_silo_data", broken)
    code = main(["run", "fedavg", "--rounds", "1", "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 1
    err = capsys.readouterr().err
    assert "the run stopped" in err and "disk gone" in err


def test_a_missing_file_is_refused_before_the_run_with_exit_2(tmp_path, capsys) -> None:
    missing = tmp_path / "missing.csv"
    argv = ["run", "fedavg", "--dataset", str(missing), "--target", "y", "--sensitive", "s", "--rounds", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--dataset" in err and str(missing) in err and "the run stopped" not in err


def test_default_length_is_the_algorithms_own(tmp_path) -> None:
    from silofl.server.cli import build_parser, config_from_args

    args = build_parser().parse_args(["run", "fedavg", "--out", str(tmp_path)])
    assert config_from_args(args).epochs == 40.0  # docs/RESULTS.md's configuration for the minibatch algorithms
    args = build_parser().parse_args(["run", "mu2fl", "--out", str(tmp_path)])
    assert config_from_args(args).epochs == 1.0  # a single pass over the data


def test_run_steffle_with_shuffled_epochs_prints_the_ledgers_epsilon(tmp_path, capsys) -> None:
    """`silofl run steffle --sampling shuffle --epsilon 1 --rounds 13`, progress bar on: the epsilon printed is the
    silos' ledgers', the accountant's for 3 unsampled releases per silo after the histogram (B = 6, E = 3)."""
    from tests.silo_driver import shuffled_cli_run

    result = shuffled_cli_run("steffle", tmp_path / "run", capsys)
    assert result["config"]["sampling"] == "shuffle" and result["status"]["completed"]


def test_shuffled_epochs_are_refused_for_separate_parties(capsys) -> None:
    assert main(["run", "steffle", "--sampling", "shuffle", "--topology", "divided", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "'sampling' = 'shuffle' is implemented for topology 'silos' only" in err and "topology silos" in err
