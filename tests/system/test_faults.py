"""Fault injection on real runs (the real ServerApp, strategies and ClientApp on the in-process engine; one test on the
gRPC deployment): a silo crashes, a silo stalls past the round timeout, a silo restarts mid-run, the server restarts
from its checkpoint. Each ends in a clear stop or a continuation equal, bit for bit, to the uninterrupted run, and no
silo's privacy ledger goes backwards or pays twice for one answer. docs/FAULTS.md walks through each case."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from silofl.client import answer_journal, privacy_state
from silofl.client.app import app as client_app
from silofl.protocols import algorithms, record_codec
from silofl.protocols import messages as msg
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.privacy.ledger import PrivacyLedger
from silofl.server import checkpoint
from silofl.server.app import make_server_app
from silofl.server.engines import run_job
from silofl.server.inprocess_grid import InProcessGrid, deliver
from silofl.strategies.federation import RoundError

SILOS = 3
BASE: dict[str, Any] = {"num-silos": SILOS, "rounds": 5, "batch-size": 64, "eval-every": 2, "checkpoint-every": 1}
PRIVATE = {"algorithm": "dp-fedsgd", "epsilon": 1.0, **BASE}


class ServerKilled(BaseException):
    """The server process dies (SIGKILL): nothing is caught, nothing more is written."""


def _config(values: dict[str, Any], out: Path | None = None, **extra: Any) -> RunConfig:
    return RunConfig.parse({**values, **({"out-dir": str(out)} if out else {}), **extra})


def _serve(grid: InProcessGrid, config: RunConfig) -> dict[str, Any]:
    """One server process: the ServerApp on `grid` (a fresh Flower run)."""
    results: list[dict[str, Any]] = []
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    make_server_app(config, sink=results.append, progress=False)(grid, context)
    return results[0]


def _state_dirs(root: Path) -> list[dict[str, str]]:
    return [{privacy_state.STATE_DIR_KEY: str(root / f"silo_{k}")} for k in range(SILOS)]


def _round_of(message: Message) -> int:
    return int(message.metadata.group_id)


def _is_train(message: Message, at: int) -> bool:
    return message.metadata.message_type == msg.TRAIN and _round_of(message) == at


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Everything a run computed is equal (timings aside): model, per-round metrics, final metrics, privacy, state."""

    def rounds(result: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result["rounds"]]

    assert a["model"] == b["model"]
    assert rounds(a) == rounds(b)
    assert a["final"] == b["final"]
    assert a["privacy"] == b["privacy"]
    assert a["server_state"] == b["server_state"]
    assert a["federation"] == b["federation"]
    operational = {"out-dir", "checkpoint-every", "round-timeout"}
    assert {k: v for k, v in a["config"].items() if k not in operational} == {
        k: v for k, v in b["config"].items() if k not in operational
    }


def _ledger_file(state_dir: Path) -> dict[str, Any]:
    (path,) = state_dir.glob("silo*-job-*.json")
    return json.loads(path.read_text())


def _ledger(state_dir: Path) -> PrivacyLedger:
    record = record_codec.decode_record(_ledger_file(state_dir)["records"][privacy_state.LEDGER_KEY])
    return PrivacyLedger.from_dict(dict(record))


@pytest.fixture(scope="module")
def uninterrupted() -> dict[str, dict[str, Any]]:
    """The reference runs, start to end without a fault (same seeds)."""
    return {
        "dp-fedsgd": run_job(_config(PRIVATE), progress=False),
        "fedavg": run_job(_config({"algorithm": "fedavg", "lr": 0.1, **BASE}), progress=False),
    }


# -- a silo crashes ---------------------------------------------------------------------------------------------------


class CrashingSilo:
    """The real ClientApp; partition `victim` raises in round `at` (its process dies before it answers)."""

    def __init__(self, victim: int, at: int) -> None:
        self.victim, self.at = victim, at

    def __call__(self, message: Message, context: Context) -> Message:
        if int(context.node_config["partition-id"]) == self.victim and _is_train(message, self.at):
            raise RuntimeError("the silo's machine lost power")
        return client_app(message, context)


@pytest.mark.slow
def test_a_crashing_silo_stops_the_run_and_resume_continues_it_bit_for_bit(tmp_path, uninterrupted) -> None:
    out, silos = tmp_path / "run", tmp_path / "silos"
    with pytest.raises(RoundError, match=r"silo 1 \(node 1001\) failed in round 3 \(train\).*lost power") as stop:
        _serve(
            InProcessGrid(CrashingSilo(victim=1, at=3), SILOS, node_configs=_state_dirs(silos)), _config(PRIVATE, out)
        )
    assert "resume" in str(stop.value)
    kept = json.loads((out / "result.json").read_text())
    assert kept["status"]["state"] == "stopped" and kept["status"]["completed"] is False
    assert kept["status"]["rounds_completed"] == 2 and "round 3" in kept["status"]["error"]
    assert kept["model"] != uninterrupted["dp-fedsgd"]["model"]
    assert checkpoint.load(out).completed == 2

    # The silo comes back (a fresh process: its state comes from its state-dir), the server resumes from round 3.
    resumed = _serve(
        InProcessGrid(client_app, SILOS, node_configs=_state_dirs(silos)), _config(PRIVATE, out, resume=True)
    )
    assert resumed["status"] | {"checkpoint": None} == {
        "completed": True, "state": "completed", "rounds_completed": 5, "error": None, "resumed_from": 2,
        "checkpoint": None,
    }  # fmt: skip
    _same_run(resumed, uninterrupted["dp-fedsgd"])
    for k in range(SILOS):  # silos 0 and 2 answered round 3 before the stop: replayed, not charged again
        assert _ledger(silos / f"silo_{k}").rounds() == [1, 2, 3, 4, 5]


def test_without_a_state_dir_a_restarted_silo_refuses_a_private_job_clearly(tmp_path) -> None:
    """Silos that keep nothing on disk cannot continue a private job after a restart: a clear stop, not a ledger
    that starts from zero."""
    out = tmp_path / "run"
    with pytest.raises(RoundError, match="failed in round 3"):
        _serve(InProcessGrid(CrashingSilo(victim=1, at=3), SILOS), _config(PRIVATE, out))
    # every silo process restarted (a fresh grid) while the checkpoint's snapshot of them is not used: a deployment
    fresh = InProcessGrid(client_app, SILOS)
    fresh.restore_silo_states = None  # type: ignore[method-assign]  # deployed silos: the server cannot restore them
    with pytest.raises(RoundError, match=r"silo 0 has no record of rounds 1\.\.2 .*refuses.*state-dir"):
        _serve(fresh, _config(PRIVATE, out, resume=True))


# -- a silo stalls past the round timeout -----------------------------------------------------------------------------


class StallingSilo:
    """The real ClientApp; partition `victim` takes `seconds` to answer round `at` (then answers, too late)."""

    def __init__(self, victim: int, at: int, seconds: float) -> None:
        self.victim, self.at, self.seconds = victim, at, seconds
        self.done = threading.Event()

    def __call__(self, message: Message, context: Context) -> Message:
        if int(context.node_config["partition-id"]) == self.victim and _is_train(message, self.at):
            time.sleep(self.seconds)
            try:
                return client_app(message, context)
            finally:
                self.done.set()
        return client_app(message, context)


@pytest.mark.slow
def test_a_stalled_silo_stops_the_run_within_the_timeout_and_its_late_answer_is_not_paid_twice(
    tmp_path, uninterrupted
) -> None:
    out, silos = tmp_path / "run", tmp_path / "silos"
    stall = StallingSilo(victim=2, at=3, seconds=4.0)
    grid = InProcessGrid(stall, SILOS, node_configs=_state_dirs(silos), enforce_timeout=True)
    timing: dict[str, float] = {}
    config = _config(PRIVATE, out, **{"round-timeout": 1.0})
    real_send = grid.send_and_receive

    def timed(messages, *, timeout=None):
        messages = list(messages)
        if messages and _is_train(messages[0], 3):
            timing["start"] = time.monotonic()
        return real_send(messages, timeout=timeout)

    grid.send_and_receive = timed  # type: ignore[method-assign]
    with pytest.raises(RoundError, match=r"round 3 \(train\): no reply from silo 2 \(node 1002\) within 1 s"):
        _serve(grid, config)
    waited = time.monotonic() - timing["start"]
    assert 1.0 <= waited < 3.0, waited  # bounded by the timeout, not by the stalled silo
    kept = json.loads((out / "result.json").read_text())
    assert kept["status"]["state"] == "stopped" and kept["status"]["rounds_completed"] == 2
    # The stalled silo finishes in the background: it charged and journaled round 3, which the server never got.
    assert stall.done.wait(10)
    deadline = time.monotonic() + 5
    while _ledger(silos / "silo_2").rounds() != [1, 2, 3] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ledger(silos / "silo_2").rounds() == [1, 2, 3]
    resumed = _serve(
        InProcessGrid(client_app, SILOS, node_configs=_state_dirs(silos)), _config(PRIVATE, out, resume=True)
    )
    _same_run(resumed, uninterrupted["dp-fedsgd"])
    assert _ledger(silos / "silo_2").rounds() == [1, 2, 3, 4, 5]  # round 3 replayed, paid once


# -- a silo restarts mid-run ------------------------------------------------------------------------------------------


class RestartingGrid(InProcessGrid):
    """Restarts silo `victim` (a fresh Context, as a restarted SuperNode has) just before round `at`."""

    def __init__(self, *args: Any, victim: int, at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.at = victim, at

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and _is_train(messages[0], self.at):
            self.restart_silo(1000 + self.victim)
        return super().send_and_receive(messages, timeout=timeout)


def test_a_silo_restarted_mid_run_with_a_state_dir_continues_the_same_run(tmp_path, uninterrupted) -> None:
    silos = tmp_path / "silos"
    grid = RestartingGrid(client_app, SILOS, node_configs=_state_dirs(silos), victim=1, at=3)
    result = _serve(grid, _config(PRIVATE, tmp_path / "run"))
    assert result["status"]["completed"]
    _same_run(result, uninterrupted["dp-fedsgd"])
    assert _ledger(silos / "silo_1").rounds() == [1, 2, 3, 4, 5]


def test_a_silo_restarted_mid_run_without_a_state_dir_stops_the_run_clearly(tmp_path) -> None:
    grid = RestartingGrid(client_app, SILOS, victim=1, at=3)
    with pytest.raises(RoundError, match=r"silo 1 \(node 1001\) failed in round 3 .*restarted mid-run without a state"):
        _serve(grid, _config(PRIVATE, tmp_path / "run"))


# -- the server restarts from its checkpoint --------------------------------------------------------------------------


class DyingServerGrid(InProcessGrid):
    """The server process dies in round `at`: before sending it, or after the silos answered it (replies lost)."""

    def __init__(self, *args: Any, at: int, after_answers: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.after_answers = at, after_answers

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        hit = bool(messages) and _is_train(messages[0], self.at)
        if hit and not self.after_answers:
            raise ServerKilled
        replies = super().send_and_receive(messages, timeout=timeout)
        if hit:
            raise ServerKilled
        return replies


SERVER_RESTARTS = {
    "fedavg": {"algorithm": "fedavg", "lr": 0.1, **BASE},
    "dp-fedsgd": PRIVATE,
    "steffle": {"algorithm": "steffle", "epsilon": 1.0, **BASE},
    "mu2fl": {"algorithm": "mu2fl", "dataset": "digits", "epsilon": 2.0, **BASE, "batch-size": 32},
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(SERVER_RESTARTS))
def test_server_restart_from_checkpoint_equals_the_uninterrupted_run(tmp_path, algorithm: str) -> None:
    """In simulation the server and its silos are one process: `silofl run --resume` restores both from the
    checkpoint. The process dies after the silos answered round 3 (their answers are lost with it)."""
    values = SERVER_RESTARTS[algorithm]
    clean = run_job(_config(values), progress=False)
    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, SILOS, at=3, after_answers=True), _config(values, out))
    assert not (out / "result.json").exists()  # killed: only the checkpoint after round 2 is on disk
    assert checkpoint.load(out).completed == 2
    resumed = _serve(InProcessGrid(client_app, SILOS), _config(values, out, resume=True))
    assert resumed["status"]["resumed_from"] == 2 and resumed["status"]["completed"]
    _same_run(resumed, clean)


#: FedSC (private, FedAdam, 2 of 3 silos per round, shares in rounds 1, 3 and 5) and FedAvg+SC (FedAvg, 2 of 3 silos):
#: tiny runs on digits; round 3 is a sharing round, so a server that dies in it dies between the share and the train.
SSL = {"dataset": "digits", "model": "cnn", "partition": "iid", "max-train-records": 24, "projection-dim": 8,
       "eval-data": "none", "participation": 0.5, **BASE, "batch-size": 8}  # fmt: skip
SSL_RESTARTS = {
    "fedsc": {"algorithm": "fedsc", **SSL, "epsilon": 6.0, "delta": 1e-2, "share-every": 2},
    "fedavg-sc": {"algorithm": "fedavg-sc", **SSL, "server-optimizer": "avg"},
}


def _same_model_npz(a: Path, b: Path) -> None:
    """The runs in out-dirs `a` and `b` wrote the same model.npz (FedSC's model is too large for result.json)."""
    with np.load(a / "model.npz") as x, np.load(b / "model.npz") as y:
        assert sorted(x.files) == sorted(y.files)
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def _silo_ledgers(grid: InProcessGrid) -> dict[int, tuple[list[int], float]]:
    """Each simulated silo's charged rounds and exact epsilon (its ledger in its Flower context; none: not private)."""
    out = {}
    for node in grid.get_node_ids():
        state = grid.context(node).state
        if privacy_state.LEDGER_KEY in state:
            ledger = PrivacyLedger.from_dict(dict(state[privacy_state.LEDGER_KEY]))
            out[node] = (ledger.rounds(), ledger.spent())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(SSL_RESTARTS))
def test_fedsc_server_restart_between_share_and_train_equals_the_uninterrupted_run(tmp_path, algorithm: str) -> None:
    """FedSC's two-phase round on the shared loop: the server dies in round 3 after the silos answered its
    correlation share, before the train message. The resumed run (the cache, FedAdam's moments and the alphas from
    the checkpoint; the simulated silos' ledgers and share counts put back) equals the uninterrupted one, and each
    silo's ledger charges the shares of the uninterrupted run, no more."""
    values = SSL_RESTARTS[algorithm]
    clean_grid = InProcessGrid(client_app, SILOS)
    clean = _serve(clean_grid, _config(values, tmp_path / "clean"))
    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, SILOS, at=3, after_answers=False), _config(values, out))
    saved = checkpoint.load(out)
    assert saved.completed == 2
    if algorithm == "fedsc":
        assert saved.strategy["cached"].all() and "adam.exp_avg.projector.0.weight" in saved.strategy
    grid = InProcessGrid(client_app, SILOS)
    resumed = _serve(grid, _config(values, out, resume=True))
    assert resumed["status"]["resumed_from"] == 2 and resumed["status"]["completed"]
    _same_run(resumed, clean)
    _same_model_npz(out, tmp_path / "clean")
    assert _silo_ledgers(grid) == _silo_ledgers(clean_grid)
    if algorithm == "fedsc":
        charged = [rounds for rounds, _ in _silo_ledgers(grid).values()]
        assert len(charged) == SILOS and all(set(r) <= {1, 3, 5} and r[0] == 1 for r in charged)
        assert resumed["server_state"]["share_rounds"] == [1, 3, 5]


class ShareWatch:
    """The real ClientApp, keeping every correlation answer: (partition, round) -> the released matrices' bytes."""

    def __init__(self) -> None:
        self.shares: dict[tuple[int, int], list[bytes]] = {}

    def __call__(self, message: Message, context: Context) -> Message:
        reply = client_app(message, context)
        if message.metadata.message_type == msg.CORRELATION and not reply.has_error():
            key = (int(context.node_config["partition-id"]), _round_of(message))
            self.shares.setdefault(key, []).append(reply.content[msg.CORRELATION_MATRIX]["R"].data)
        return reply


@pytest.mark.slow
def test_a_resumed_fedsc_round_replays_the_journaled_share_and_no_share_is_charged_twice(tmp_path) -> None:
    """Silos with a `state-dir` outlive the server (a deployment): it dies after their round-3 shares (before the
    train message), resumes, dies again after they answered all of round 5, resumes again. Each round asked again
    gets the journaled share byte for byte (a second charge of a round would be refused by the ledger), each ledger
    ends with the uninterrupted run's rounds and epsilon, and the result equals the uninterrupted run's."""
    values = SSL_RESTARTS["fedsc"]
    clean_grid = InProcessGrid(client_app, SILOS, node_configs=_state_dirs(tmp_path / "clean"))
    clean = _serve(clean_grid, _config(values, tmp_path / "clean_run"))
    out, silos, watch = tmp_path / "run", tmp_path / "silos", ShareWatch()
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(watch, SILOS, node_configs=_state_dirs(silos), at=3, after_answers=False),
               _config(values, out))  # fmt: skip
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(watch, SILOS, node_configs=_state_dirs(silos), at=5, after_answers=True),
               _config(values, out, resume=True))  # fmt: skip
    final = _serve(InProcessGrid(watch, SILOS, node_configs=_state_dirs(silos)), _config(values, out, resume=True))
    _same_run(final, clean)
    _same_model_npz(out, tmp_path / "clean_run")
    asked_again = {key: answers for key, answers in watch.shares.items() if len(answers) > 1}
    assert {r for _, r in asked_again} == {3, 5}
    assert all(len(answers) == 2 and answers[0] == answers[1] for answers in asked_again.values())
    for k in range(SILOS):
        ledger, reference = _ledger(silos / f"silo_{k}"), _ledger(tmp_path / "clean" / f"silo_{k}")
        assert ledger.rounds() == reference.rounds() == sorted({r for p, r in watch.shares if p == k})
        assert ledger.spent() == reference.spent()
        assert privacy_state.PENDING_KEY not in _ledger_file(silos / f"silo_{k}")["records"]


def test_silofl_run_resume_continues_a_killed_run(tmp_path, uninterrupted, capsys) -> None:
    """The command line: `silofl run dp-fedsgd ... --resume DIR` after the process died in round 4."""
    from silofl.server.cli import main

    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, SILOS, at=4, after_answers=False), _config(PRIVATE, out))
    flags = ["run", "dp-fedsgd", "--epsilon", "1", "--rounds", "5", "--batch-size", "64", "--eval-every", "2"]
    assert main([*flags, "--epsilon", "2", "--resume", str(out), "--no-progress"]) == 2
    assert "epsilon: checkpoint 1.0, now 2.0" in capsys.readouterr().err
    assert main([*flags, "--resume", str(out), "--no-progress"]) == 0
    resumed = json.loads((out / "result.json").read_text())
    assert resumed["status"]["resumed_from"] == 3
    _same_run(resumed, uninterrupted["dp-fedsgd"])
    assert resumed["config"]["resume"] is False  # the result reruns the job; it does not resume it again
    assert main([*flags, "--resume", str(out), "--no-progress"]) == 2  # already complete
    assert "already completed its 5 rounds" in capsys.readouterr().err


def test_resume_refuses_what_it_cannot_continue(tmp_path) -> None:
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint to resume from"):
        _serve(InProcessGrid(client_app, SILOS), _config(PRIVATE, tmp_path / "none", resume=True))
    fedavg = algorithms.get("fedavg")
    try:  # an algorithm whose registry entry says its server state is not checkpointed
        algorithms.register(dataclasses.replace(fedavg, resumable=False), replace=True)
        with pytest.raises(ConfigError, match=r"not supported for fedavg .*resumable=False"):
            run_job(_config({"algorithm": "fedavg", **BASE}, tmp_path, resume=True))
    finally:
        algorithms.register(fedavg, replace=True)
    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, SILOS, at=3, after_answers=False), _config(PRIVATE, out))
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's \(seed: checkpoint 0, now 1\)"):
        _serve(InProcessGrid(client_app, SILOS), _config(PRIVATE, out, resume=True, seed=1))

    def other_data(message: Message, context: Context) -> Message:  # silo 2 comes back with one record less
        reply = client_app(message, context)
        if message.metadata.message_type == msg.SETUP and context.node_config["partition-id"] == 2:
            info = msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)
            info = info.model_copy(update={"n_train": info.n_train - 1})
            return Message(RecordDict({msg.REPORT: info.to_config_record()}), reply_to=message)
        return reply

    with pytest.raises(RoundError, match=r"federation differs .*: silo 2 now describes different data \(n_train\)"):
        _serve(InProcessGrid(other_data, SILOS), _config(PRIVATE, out, resume=True))


# -- no privacy ledger goes backwards ---------------------------------------------------------------------------------


class LedgerWatch:
    """The real ClientApp, recording each silo's exact epsilon (its ledger's) after every train answer, across
    processes (restarts read it back from the silo's state-dir)."""

    def __init__(self) -> None:
        self.spent: dict[int, list[tuple[int, float]]] = {}

    def __call__(self, message: Message, context: Context) -> Message:
        reply = client_app(message, context)
        if message.metadata.message_type == msg.TRAIN and not reply.has_error():
            ledger = PrivacyLedger.from_dict(dict(context.state[privacy_state.LEDGER_KEY]))
            silo = int(context.node_config["partition-id"])
            self.spent.setdefault(silo, []).append((_round_of(message), ledger.spent()))
        return reply


def test_no_privacy_ledger_goes_backwards_across_silo_and_server_restarts(tmp_path, uninterrupted, monkeypatch) -> None:
    """One run through every fault: silo 1 goes down after charging round 2 but before releasing its answer, the
    run stops, every process restarts; the server dies after the silos answered round 4 and restarts again. Each
    silo's epsilon never decreases and ends where the uninterrupted run's ends, each round charged exactly once."""
    out, silos = tmp_path / "run", tmp_path / "silos"
    watch = LedgerWatch()
    real_answered = answer_journal.answered

    def dies_before_release(context, kind, server_round, digest, content):
        if int(context.node_config["partition-id"]) == 1 and kind == "train" and server_round == 2:
            raise RuntimeError("silo 1 lost power after charging round 2, before its answer left")
        real_answered(context, kind, server_round, digest, content)

    monkeypatch.setattr(answer_journal, "answered", dies_before_release)
    with pytest.raises(RoundError, match=r"silo 1 \(node 1001\) failed in round 2"):
        _serve(InProcessGrid(watch, SILOS, node_configs=_state_dirs(silos)), _config(PRIVATE, out))
    monkeypatch.setattr(answer_journal, "answered", real_answered)
    assert _ledger(silos / "silo_1").rounds() == [1, 2]  # paid for, not released: pending in its file
    assert privacy_state.PENDING_KEY in _ledger_file(silos / "silo_1")["records"]

    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(watch, SILOS, node_configs=_state_dirs(silos), at=4, after_answers=True),
               _config(PRIVATE, out, resume=True))  # fmt: skip
    final = _serve(InProcessGrid(watch, SILOS, node_configs=_state_dirs(silos)), _config(PRIVATE, out, resume=True))
    _same_run(final, uninterrupted["dp-fedsgd"])

    reference = uninterrupted["dp-fedsgd"]["privacy"]["per_silo"]
    for k in range(SILOS):
        spent = [eps for _, eps in watch.spent[k]]
        assert spent == sorted(spent), f"silo {k}'s ledger went backwards: {watch.spent[k]}"
        ledger = _ledger(silos / f"silo_{k}")
        assert ledger.rounds() == [1, 2, 3, 4, 5]
        assert ledger.spent() == pytest.approx(reference[str(k)]["epsilon_spent"], rel=1e-12)
        assert privacy_state.PENDING_KEY not in _ledger_file(silos / f"silo_{k}")["records"]
    # Answers as the server saw them: silo 1's round 2 once it came back; round 4 again after the server's restart
    # (replayed, the same figure); silos 0 and 2 also replayed round 2. Each ledger charged each round once (above).
    assert [r for r, _ in watch.spent[1]] == [1, 2, 3, 4, 4, 5]
    assert [r for r, _ in watch.spent[0]] == [1, 2, 2, 3, 4, 4, 5]


# -- the silo's side, message by message ------------------------------------------------------------------------------


def _silo_context(state_dir: Path | None, partition: int = 0) -> Context:
    node_config: dict[str, Any] = {"partition-id": partition, "num-partitions": 2}
    if state_dir is not None:
        node_config[privacy_state.STATE_DIR_KEY] = str(state_dir)
    return Context(run_id=7, node_id=5, node_config=node_config, state=RecordDict(), run_config={})


def _message(content: RecordDict, kind: str, server_round: int) -> Message:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1
    message = Message(content, 5, kind, group_id=str(server_round))
    message.metadata.__dict__["_message_id"] = f"{kind}-{server_round}"
    return message


def _setup(context: Context) -> msg.SiloInfo:
    spec = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0)
    reply = deliver(client_app, _message(RecordDict({msg.CONFIG: spec.to_config_record()}), msg.SETUP, 0), context)
    return msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)


def _train(context: Context, info: msg.SiloInfo, server_round: int, *, scale: float = 0.0) -> Message:
    import numpy as np

    from silofl.protocols.models import build_model, get_parameters

    params = get_parameters(build_model("logreg", info.num_features, info.num_labels))
    params = {k: (v + scale).astype(np.float32) for k, v in params.items()}
    instruction = msg.TrainInstruction.for_algorithm("dp-fedsgd",
         server_round=server_round, total_rounds=10, batch_size=64, lr=0.1, epsilon=1.0,
        delta=1e-6,
    )  # fmt: skip
    content = RecordDict({msg.MODEL: msg.arrays_record(params), msg.CONFIG: instruction.to_config_record()})
    return deliver(client_app, _message(content, msg.TRAIN, server_round), context)


def _update_bytes(reply: Message) -> bytes:
    assert not reply.has_error(), reply.error.reason
    return b"".join(a.data for a in reply.content[msg.UPDATE].values())


def test_a_silo_answers_each_round_once_and_replays_it_after_a_restart(tmp_path) -> None:
    state = tmp_path / "silo"
    context = _silo_context(state)
    info = _setup(context)
    first = _update_bytes(_train(context, info, 1))
    assert _update_bytes(_train(context, info, 1)) == first  # asked again: the same answer, replayed
    assert _ledger(state).rounds() == [1]
    refused = _train(context, info, 1, scale=0.5)  # a different request for an answered round
    assert refused.has_error() and "already answered round 1 (train)" in refused.error.reason

    restarted = _silo_context(state)  # the SuperNode restarts: a fresh context, the same run, the same state-dir
    assert _update_bytes(_train(restarted, info, 1)) == first  # no setup needed: the run's spec is on disk too
    assert not _train(restarted, info, 2).has_error()
    assert _ledger(state).rounds() == [1, 2]
    assert PrivacyLedger.from_dict(dict(restarted.state[privacy_state.LEDGER_KEY])).rounds() == [1, 2]

    stale = _train(restarted, info, 1)  # an earlier round whose journal entry is gone: refused, not re-charged
    assert stale.has_error() and "already charged" in stale.error.reason and str(state) in stale.error.reason


def test_a_silo_without_state_dir_keeps_nothing_on_disk_and_refuses_to_start_mid_job(tmp_path) -> None:
    context = _silo_context(None)
    info = _setup(context)
    assert not _train(context, info, 1).has_error()
    again = _train(context, info, 1)
    assert again.has_error() and "already charged" in again.error.reason
    late = _silo_context(None)
    _setup(late)
    refused = _train(late, info, 3)
    assert refused.has_error() and "no record of rounds 1..2" in refused.error.reason
    assert privacy_state.LEDGER_KEY not in late.state


def test_a_damaged_state_file_is_refused_not_reset(tmp_path) -> None:
    state = tmp_path / "silo"
    context = _silo_context(state)
    info = _setup(context)
    assert not _train(context, info, 1).has_error()
    (path,) = state.glob("silo*-job-*.json")
    path.write_text(path.read_text()[:-20])
    reply = _train(_silo_context(state), info, 2)
    assert (
        reply.has_error()
        and "unreadable" in reply.error.reason
        and "cannot tell what it has spent" in reply.error.reason
    )


def test_checkpoint_writes_are_atomic_and_rounds_beyond_it_are_dropped(tmp_path) -> None:
    """A server that dies between appending a round's record and renaming the checkpoint leaves a checkpoint that
    ignores the extra line; resuming cuts it off."""
    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, SILOS, at=4, after_answers=False), _config(PRIVATE, out))
    rounds_file = checkpoint.checkpoint_dir(out) / checkpoint.ROUNDS_FILE
    with open(rounds_file, "a") as fh:
        fh.write(json.dumps({"round": 4, "seconds": 0.0, "lr": 0.5, "epsilon_spent": 0.1, "evaluation": None}) + "\n")
    loaded = checkpoint.load(out)
    assert loaded.completed == 3 and [r.server_round for r in loaded.history_rounds] == [1, 2, 3]
    assert not list(checkpoint.checkpoint_dir(out).glob("*.tmp"))
    resumed = _serve(InProcessGrid(client_app, SILOS), _config(PRIVATE, out, resume=True))
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4, 5]
    lines = rounds_file.read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4, 5]


def test_job_fingerprint_ignores_only_the_per_round_fields() -> None:
    a = msg.TrainInstruction.for_algorithm("dp-fedsgd", server_round=1, total_rounds=5, batch_size=64, lr=0.5)
    assert privacy_state.job_fingerprint(a) == privacy_state.job_fingerprint(
        a.model_copy(update={"server_round": 4, "lr": 0.1, "alpha": 0.5})
    )
    for change in ({"seed": 1}, {"epsilon": 2.0}, {"total_rounds": 6}, {"batch_size": 32}):
        assert privacy_state.job_fingerprint(a) != privacy_state.job_fingerprint(a.model_copy(update=change))


def test_state_records_round_trip_exactly() -> None:
    import numpy as np
    from flwr.app import ArrayRecord, MetricRecord

    records = [
        ConfigRecord({"a": 1, "b": 0.1, "c": "x", "d": True, "e": [1.5, float("inf")], "f": b"\x00\xff", "g": [b"z"]}),
        MetricRecord({"m": 3, "n": [0.25, 2.0]}),
        msg.arrays_record({"w": np.random.default_rng(0).standard_normal((3, 2)), "i": np.arange(4)}),
    ]
    for record in records:
        back = record_codec.decode_record(json.loads(json.dumps(record_codec.encode_record(record))))
        assert type(back) is type(record)
        if isinstance(record, ArrayRecord):
            assert {k: a.numpy().tolist() for k, a in back.items()} == {
                k: a.numpy().tolist() for k, a in record.items()
            }
            assert [a.dtype for a in back.values()] == [a.dtype for a in record.values()]
        else:
            assert dict(back) == dict(record)


# -- the real deployment: a silo's process dies -----------------------------------------------------------------------


@pytest.mark.slow
def test_deployed_silo_killed_mid_run_stops_the_run_within_the_timeout(tmp_path, monkeypatch) -> None:
    """gRPC on loopback: a SuperLink and 2 SuperNodes (TLS, authentication), each silo with a state-dir. SuperNode 1
    is killed (SIGKILL) once the server has the setup round's answers: the run stops (`round-timeout` runs out, or
    Flower returns an error for the dead node) naming silo 1 and the round it died in instead of hanging, result.json
    says so, and the silo that answered holds its charges for every round up to that one in its ledger file on disk
    (written by its ClientApp process). Rounds are fast on silofl's SuperNode runtime, so silo 1 may die in round 1
    or a little later, possibly after charging the round it died in, but never charged a round it was not sent."""
    import os
    import signal
    import subprocess

    import silofl.client.silo_cli as silo_cli
    from silofl.server.deploy import flower_setup, local

    states = tmp_path / "states"
    plain = silo_cli.node_config_string

    def with_state_dir(data, epsilon_budget=None, deterministic_noise=False, **options):  # `--state-dir` per silo
        return plain(data, epsilon_budget, deterministic_noise, **{**options, "state_dir": states / Path(data).name})

    monkeypatch.setattr(silo_cli, "node_config_string", with_state_dir)
    root, out = tmp_path / "fed", tmp_path / "out"
    timeout, silos, rounds = 15.0, 2, 5
    with local.running(root, silos) as dep:
        run_config = (
            f'algorithm="dp-fedsgd" epsilon=1.0 rounds={rounds} epochs=0 eval-every={rounds} batch-size=64 '
            "checkpoint-every=1 "
            f'round-timeout={timeout} num-silos={silos} out-dir="{out}"'
        )
        flwr = str(flower_setup.bin_dir() / "flwr")
        command = [flwr, "run", ".", dep.connection, "--stream", "--run-config", run_config]
        project = Path(__file__).resolve().parents[2]
        env = local.flower_env(Path(dep.flwr_home))
        lines: list[str] = []
        set_up = threading.Event()

        def read(stream) -> None:  # the ServerApp prints the federation it set up (server/progress.py)
            for line in stream:
                lines.append(line.decode(errors="replace"))
                if "training records" in lines[-1]:
                    set_up.set()

        with subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as run:
            reader = threading.Thread(target=read, args=(run.stdout,), daemon=True)
            reader.start()
            assert set_up.wait(180), "".join(lines)[-3000:]
            (victim,) = [p for p in dep.processes if p.name == "silo_1"]
            os.kill(victim.pid, signal.SIGKILL)  # the SuperNode this test started for silo 1
            killed_at = time.monotonic()
            run.wait(timeout=180)
            stopped_after = time.monotonic() - killed_at
            reader.join(10)
            output = "".join(lines)
        charged = {}
        deadline = time.monotonic() + 30  # the healthy silo charged round 1 before answering it
        while not charged and time.monotonic() < deadline:
            charged = {k: _ledger(states / f"silo_{k}").rounds() for k in (0,) if _has_job(states / f"silo_{k}")}
            time.sleep(0.2)
    result = json.loads((out / "result.json").read_text())
    assert result["status"]["state"] == "stopped", output[-3000:]
    died_in = result["status"]["rounds_completed"] + 1  # the round the run stopped in
    assert died_in <= rounds, result["status"]
    error = result["status"]["error"]
    named = (
        rf"silo 1 \(node \d+\) failed in round {died_in} \(train\)|round {died_in} \(train\): no reply from .*silo 1 "
    )
    assert re.search(named, error), error
    assert stopped_after < timeout + 60, stopped_after  # bounded by the round timeout: no hang
    # the healthy silo charged every round it was sent, and nothing else
    assert charged == {0: list(range(1, died_in + 1))}, (charged, died_in)
    if _has_job(states / "silo_1"):  # killed after it charged: at most the round it died in
        assert set(_ledger(states / "silo_1").rounds()) <= set(range(1, died_in + 1))


def _has_job(state_dir: Path) -> bool:
    return bool(list(state_dir.glob("silo*-job-*.json")))
