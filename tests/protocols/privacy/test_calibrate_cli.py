"""Tests for protocols.privacy.calibrate_cli: the `privacy calibrate` sub-command."""

from __future__ import annotations

import argparse
import io
import re

import pytest
from rich.console import Console

from silofl.protocols.privacy.accountant import calibrate_noise
from silofl.protocols.privacy.calibrate_cli import add_privacy_parser, calibrate_command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="silofl")
    add_privacy_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _words(command_line: str) -> list[str]:
    return command_line.split()


def _run(command_line: str) -> tuple[int, str]:
    args = _parser().parse_args(_words(command_line))
    buffer = io.StringIO()
    code = args.func(args, console=Console(file=buffer, width=120))
    return code, buffer.getvalue()


@pytest.mark.slow
def test_calibrate_prints_multiplier_and_both_epsilons() -> None:
    code, output = _run("privacy calibrate --epsilon 2 --delta 1e-6 --sampling-rate 0.05 --steps 60 --releases 2")
    expected = calibrate_noise(2.0, 1e-6, 0.05, 60, releases=2, accountant="best")
    assert code == 0
    assert f"{expected.noise_multiplier:.6f}" in output
    assert f"{expected.combined_noise_multiplier:.6f}" in output
    assert f"{expected.epsilon_rdp:.6f}" in output and f"{expected.epsilon_pld:.6f}" in output
    assert f"{expected.accountant} (asked: best)" in output


def test_calibrate_with_a_chosen_accountant() -> None:
    code, output = _run("privacy calibrate --epsilon 2 --delta 1e-6 --sampling-rate 0.05 --steps 60 --accountant rdp")
    expected = calibrate_noise(2.0, 1e-6, 0.05, 60, accountant="rdp")
    assert code == 0
    assert f"{expected.noise_multiplier:.6f}" in output
    assert "rdp (asked: rdp)" in output


def test_default_console_writes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(_words("privacy calibrate --epsilon 5 --delta 1e-5 --sampling-rate 1 --steps 10"))
    assert calibrate_command(args) == 0
    assert "noise multiplier" in capsys.readouterr().out


def test_invalid_value_is_reported_with_its_name() -> None:
    code, output = _run("privacy calibrate --epsilon 2 --delta 2 --sampling-rate 0.05 --steps 60")
    assert code == 2
    assert "delta must be in (0, 1)" in output


@pytest.mark.slow
def test_calibrate_under_replace_one_prints_the_relation_and_pld_only() -> None:
    code, output = _run(
        "privacy calibrate --epsilon 2 --delta 1e-6 --sampling-rate 0.05 --steps 60 --releases 2 --relation replace_one"
    )
    expected = calibrate_noise(2.0, 1e-6, 0.05, 60, releases=2, relation="replace_one")
    plain = calibrate_noise(2.0, 1e-6, 0.05, 60, releases=2)
    assert code == 0
    assert "replace_one" in output and "n/a (no RDP analysis under replace_one)" in output
    assert f"{expected.noise_multiplier:.6f}" in output and f"{plain.noise_multiplier:.6f}" not in output
    assert f"{expected.epsilon_pld:.6f} (used)" in output
    assert "pld (asked: best)" in output
    assert "within radius R of 0 whatever its sensitive attribute" in " ".join(output.split())


def test_default_relation_is_add_remove() -> None:
    code, output = _run("privacy calibrate --epsilon 2 --delta 1e-6 --sampling-rate 0.05 --steps 60")
    assert code == 0
    assert "add_remove" in output and "add/remove-one record" in output


def test_rdp_under_replace_one_is_reported() -> None:
    code, output = _run(
        "privacy calibrate --epsilon 2 --delta 1e-6 --sampling-rate 0.05 --steps 60 --relation replace_one "
        "--accountant rdp"
    )
    assert code == 2
    assert "cannot account relation='replace_one'" in " ".join(output.split())


@pytest.mark.parametrize(
    "argv",
    [
        "privacy calibrate --delta 1e-6 --sampling-rate 0.05 --steps 60",  # no --epsilon
        "privacy calibrate --epsilon 1 --delta 1e-6 --sampling-rate 0.05 --steps 60 --accountant moments",
        "privacy calibrate --epsilon 1 --delta 1e-6 --sampling-rate 0.05 --steps 60 --relation swap",
        "privacy calibrate --epsilon 1 --delta 1e-6 --sampling-rate 0.05 --steps 6.5",
        "privacy",
    ],
)
def test_parser_rejects_bad_command_lines(argv: str) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(_words(argv))


@pytest.mark.slow
def test_calibrate_shuffled_epochs_accounts_one_unsampled_step_per_epoch_next_to_poisson() -> None:
    """--sampling shuffle: 100 rounds over 1000 records in batches of 64 are B = 16 batches per epoch and E = 7
    unsampled steps; the table also gives what Poisson sampling at q = 64/1000 would need for the 100 rounds."""
    line = "privacy calibrate --epsilon 2 --delta 1e-6 --sampling shuffle --records 1000 --batch-size 64 --steps 100"
    code, output = _run(f"{line} --releases 2")
    shuffled = calibrate_noise(2.0, 1e-6, 1.0, 7, releases=2)
    poisson = calibrate_noise(2.0, 1e-6, 0.064, 100, releases=2)
    assert code == 0
    assert f"{shuffled.noise_multiplier:.6f}" in output and f"{poisson.noise_multiplier:.6f}" in output
    assert f"x{shuffled.noise_multiplier / poisson.noise_multiplier:.3g}" in output
    assert "shuffled epochs, no amplification" in output
    assert re.search(r"batches per epoch B = ceil\(n / m\) +│ +16 │", output)
    assert re.search(r"epochs E = ceil\(T / B\), each q = 1 +│ +7 │", output)


@pytest.mark.slow
def test_calibrate_poisson_rate_from_records_and_batch_size() -> None:
    code, output = _run("privacy calibrate --epsilon 2 --delta 1e-6 --records 1000 --batch-size 50 --steps 60")
    assert code == 0 and f"{calibrate_noise(2.0, 1e-6, 0.05, 60).noise_multiplier:.6f}" in output


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ("--sampling shuffle --steps 10", "--sampling shuffle needs --records N and --batch-size M"),
        ("--sampling shuffle --sampling-rate 0.1 --records 100 --batch-size 10 --steps 10", "drop it"),
        ("--steps 10", "give --sampling-rate Q (or --records N and --batch-size M"),
        ("--records 100 --steps 10", "give --records and --batch-size together"),
        ("--sampling-rate 0.1 --records 100 --batch-size 10 --steps 10", "not both"),
    ],
)
def test_sampling_flags_that_do_not_fit_are_named(flags: str, needle: str) -> None:
    code, output = _run(f"privacy calibrate --epsilon 2 --delta 1e-6 {flags}")
    assert code == 2 and needle in " ".join(output.split())
