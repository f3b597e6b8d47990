"""What `silofl run` says and does at the console, through the real entry point: every unknown flag is an error,
the last lines state the privacy plainly (what is protected, against whom, what is not; a non-private run says so),
and Ctrl-C stops cleanly: result.json written with the state after the last completed round, the command that
continues the run printed, and that command finishing the run as if it had never stopped."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from silofl.server.cli import main


@pytest.mark.parametrize(
    "flags",
    [["--dry-run"], ["--verbose"], ["--epsilonn"], ["--foo"], ["--foo", "--rounds", "2"], ["--foo="]],
)
def test_every_unknown_flag_is_an_error_with_or_without_a_value(flags, capsys) -> None:
    assert main(["run", "fedavg", "--rounds", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert "unknown flag" in err and "silofl run fedavg --help" in err


def test_an_unknown_flag_with_a_value_is_explained_as_a_run_config_key(capsys) -> None:
    assert main(["run", "dp-fedsgd", "--rounds", "1", "--epsilonn", "1"]) == 2
    assert "did you mean 'epsilon'" in capsys.readouterr().err


def _last_lines(out: str) -> str:
    return " ".join(out.split("result:", 1)[1].split())  # the console wraps lines at its width


@pytest.mark.slow
def test_the_last_lines_state_what_is_protected_and_what_is_not(tmp_path, capsys) -> None:
    assert main(["run", "steffle", "--rounds", "2", "--epsilon", "1", "--out", str(tmp_path / "s")]) == 0
    text = _last_lines(capsys.readouterr().out)
    assert "differential privacy of the sensitive attribute of each training record only" in text
    assert "against the server" in text
    assert "not protected: the features and labels" in text

    assert main(["run", "dp-fedsgd", "--rounds", "2", "--epsilon", "1", "--out", str(tmp_path / "d")]) == 0
    text = _last_lines(capsys.readouterr().out)
    assert "differential privacy of every training record of a silo" in text and "added or removed" in text
    assert "features and labels" not in text


@pytest.mark.parametrize(
    ("algorithm", "needle"), [("dp-fedsgd", "no --epsilon, so epsilon = inf"), ("fedavg", "fedavg adds no noise")]
)
def test_a_non_private_run_says_it_is_not_private(algorithm, needle, tmp_path, capsys) -> None:
    assert main(["run", algorithm, "--rounds", "2", "--out", str(tmp_path)]) == 0
    text = _last_lines(capsys.readouterr().out)
    assert text.startswith(f"{tmp_path / 'result.json'} privacy: none.") and needle in text


def test_a_trusted_server_is_named_as_what_the_guarantee_does_not_cover(tmp_path, capsys) -> None:
    argv = ["run", "mu2fl", "--rounds", "2", "--epsilon", "1", "--trust", "trusted", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "NOT against the server" in _last_lines(capsys.readouterr().out)


def test_ctrl_c_writes_the_state_prints_the_resume_command_and_resume_finishes_the_run(
    tmp_path, capsys, monkeypatch
) -> None:
    """Ctrl-C in round 4 of 6 (raised inside a silo's answer, where the in-process engine runs it): exit 130, no
    traceback, result.json says interrupted after round 3 with its rounds, and the printed command resumes the run
    to the very numbers of a run that was never interrupted."""
    from silofl.client.rounds import dp_fedsgd

    common = ["--rounds", "6", "--epsilon", "1", "--eval-every", "2", "--checkpoint-every", "1"]
    assert main(["run", "dp-fedsgd", *common, "--no-progress", "--out", str(tmp_path / "whole")]) == 0
    capsys.readouterr()
    real = dp_fedsgd.train_round

    def interrupted(model, silo, instr, context, message):
        if instr.server_round == 4:
            raise KeyboardInterrupt
        return real(model, silo, instr, context, message)

    interrupted.__dict__.update(real.__dict__)  # the round's declared records and needs
    monkeypatch.setattr(dp_fedsgd, "train_round", interrupted)
    out = tmp_path / "stopped"
    assert main(["run", "dp-fedsgd", *common, "--out", str(out)]) == 130  # the progress bar on, as a user runs it
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted after round 3 of 6" in err
    result = json.loads((out / "result.json").read_text())
    assert result["status"]["state"] == "interrupted" and result["status"]["rounds_completed"] == 3
    assert len(result["rounds"]) == 3
    command = err.split("continue it with: silofl ", 1)[1].strip()
    assert command.endswith(f"--resume {out}") and "--out" not in command

    monkeypatch.setattr(dp_fedsgd, "train_round", real)
    assert main(shlex.split(command)) == 0
    resumed = json.loads((out / "result.json").read_text())
    whole = json.loads((tmp_path / "whole" / "result.json").read_text())
    assert resumed["status"]["completed"] and resumed["status"]["resumed_from"] == 3
    assert resumed["final"] == whole["final"]
    assert resumed["privacy"]["epsilon_spent"] == pytest.approx(whole["privacy"]["epsilon_spent"])


def test_ctrl_c_before_the_rounds_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    """An interrupt before the rounds (here in the setup round) exits 130 with one line, no traceback."""
    from silofl.server import orchestrator

    def interrupted(grid, config):
        raise KeyboardInterrupt

    monkeypatch.setattr(orchestrator, "setup_round", interrupted)
    assert main(["run", "fedavg", "--rounds", "2", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err


def test_ray_address_needs_the_ray_engine(tmp_path, capsys) -> None:
    assert main(["run", "fedavg", "--rounds", "1", "--ray-address", "head:6379", "--out", str(tmp_path)]) == 2
    assert "--ray-address head:6379 is for the Ray engine" in capsys.readouterr().err


def test_ray_init_args_join_a_cluster_or_start_a_local_ray(monkeypatch) -> None:
    from silofl.server.engines import ray_init_args

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_init_args("head:6379") == {"address": "head:6379"}  # Ray refuses num_cpus when it joins a cluster
    assert set(ray_init_args()) == {"num_cpus", "include_dashboard"}
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert ray_init_args() == {"address": "ray://head:10001"}


@pytest.mark.slow
def test_the_ray_engine_joins_a_running_ray_cluster(tmp_path, capsys) -> None:
    """A Ray head started here (as `ray start --head` on a cluster's first machine); `--engine ray --ray-address`
    runs the job on it and gives the same numbers as the in-process engine (the same seed, the same draws)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile

    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    env.pop("RAY_ADDRESS", None)
    # Ray's sockets live under its temp dir, and a Unix socket's path has at most 107 bytes: a short folder
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    head = [ray, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    head += [f"--temp-dir={temp}", "--disable-usage-stats"]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        argv = ["run", "fedavg", "--rounds", "2", "--no-progress", "--engine", "ray"]
        joined = [*argv, "--ray-address", f"127.0.0.1:{port}", "--out", str(tmp_path / "ray")]
        assert main(joined) == 0, capsys.readouterr().err
        assert main(["run", "fedavg", "--rounds", "2", "--no-progress", "--out", str(tmp_path / "local")]) == 0
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
    on_ray = json.loads((tmp_path / "ray" / "result.json").read_text())
    local = json.loads((tmp_path / "local" / "result.json").read_text())
    assert on_ray["final"] == local["final"] and on_ray["engine"] == "ray"
