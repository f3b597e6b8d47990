"""The run's orchestration: a silo that dies mid-run stops the run with a clear error, and the server's state up to
the last completed round is kept in result.json."""

from __future__ import annotations

import json

import pytest
from flwr.app import Context, RecordDict

from silofl.client.app import app as client_app
from silofl.protocols.config import RunConfig
from silofl.server.app import make_server_app
from silofl.server.engines import run_job
from silofl.server.inprocess_grid import InProcessGrid
from silofl.strategies.federation import RoundError


def _hit(message, partition: int, victim: int, at: int) -> bool:
    return partition == victim and message.metadata.message_type == "train" and int(message.metadata.group_id) >= at


class DyingSilo:
    """The real ClientApp, except that partition `victim` crashes from round `at` on."""

    def __init__(self, victim: int, at: int) -> None:
        self.victim, self.at = victim, at

    def __call__(self, message, context):
        if _hit(message, int(context.node_config["partition-id"]), self.victim, self.at):
            raise RuntimeError("the silo's machine lost power")
        return client_app(message, context)


class SilentGrid(InProcessGrid):
    """Never delivers to silo 2 from round 4 on: no reply arrives, as when a deployed silo stalls past the timeout."""

    def push_messages(self, messages):
        kept = [m for m in messages if not _hit(m, m.metadata.dst_node_id - 1000, victim=2, at=4)]
        return super().push_messages(kept)


def _run(tmp_path, app, grid_cls=InProcessGrid, rounds: int = 5):
    config = RunConfig.parse(
        {
            "algorithm": "dp-fedsgd",
            "epsilon": 1.0,
            "rounds": rounds,
            "batch-size": 64,
            "eval-every": 1,
            "out-dir": str(tmp_path),
        }
    )
    grid = grid_cls(app, 3)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    make_server_app(config, progress=False)(grid, context)
    return config


def test_a_crashing_silo_stops_the_run_naming_silo_and_round_and_keeps_the_state(tmp_path) -> None:
    with pytest.raises(RoundError, match=r"silo 1 \(node 1001\) failed in round 3 \(train\).*lost power"):
        _run(tmp_path / "dies", DyingSilo(victim=1, at=3))
    kept = json.loads((tmp_path / "dies" / "result.json").read_text())
    assert kept["status"]["completed"] is False and kept["status"]["rounds_completed"] == 2
    assert "round 3" in kept["status"]["error"]
    # the kept model is exactly the one a clean 2-round run ends with (same seeds)
    clean = run_job(
        RunConfig.parse({"algorithm": "dp-fedsgd", "epsilon": 1.0, "rounds": 5, "batch-size": 64, "eval-every": 1}),
        progress=False,
    )
    assert kept["rounds"] == [r | {"seconds": kept["rounds"][i]["seconds"]} for i, r in enumerate(clean["rounds"][:2])]


def test_a_silent_silo_is_named_after_the_timeout(tmp_path) -> None:
    with pytest.raises(RoundError, match=r"round 4 \(train\): no reply from silo 2 \(node 1002\)"):
        _run(tmp_path / "silent", client_app, grid_cls=SilentGrid)
    kept = json.loads((tmp_path / "silent" / "result.json").read_text())
    assert kept["status"]["rounds_completed"] == 3
    assert kept["privacy"]["per_silo"]["2"]["rounds_answered"] == 3
