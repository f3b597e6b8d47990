"""client.batches: a division's records in a round. Poisson draws exactly what the divisions drew before the
`sampling` option; shuffled epochs are stateless (the same batch on a simulated and a deployed silo, in any process)
and the two divisions' epochs are independent."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from silofl.client import randomness
from silofl.client.batches import poisson_sample, round_sample
from silofl.protocols import messages as msg
from silofl.server.inprocess_grid import InProcessGrid


def _context(**node_config) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


def _instruction(sampling: str, server_round: int, batch_size: int = 64) -> msg.TrainInstruction:
    return msg.TrainInstruction.for_algorithm(
        "steffle", server_round=server_round, total_rounds=40, batch_size=batch_size, lr=0.1, seed=5, sampling=sampling
    )


@pytest.mark.parametrize(("division", "stream"), [("nonsensitive", 0), ("sensitive", 3)])
def test_poisson_is_the_draw_of_the_rounds_stream(division: str, stream: int) -> None:
    context = _context()
    rng = randomness.numpy_rng(context, seed=5, silo_id=2, server_round=7, stream=stream)
    expected = poisson_sample(300, 64 / 300, rng)
    got = round_sample(context, _instruction("poisson", 7), silo_id=2, records=300, division=division)
    np.testing.assert_array_equal(got, expected)


def test_shuffled_batches_are_stateless_and_the_divisions_independent() -> None:
    simulated, deployed = _context(), _context(**{"data-path": "/nowhere"})  # deployed: OS entropy for its noise
    assert not randomness.is_deterministic(deployed)
    epoch: dict[str, list[np.ndarray]] = {"nonsensitive": [], "sensitive": []}
    for server_round in range(1, 6):  # 300 records in batches of 64: 5 batches per epoch
        instr = _instruction("shuffle", server_round)
        for division, batches in epoch.items():
            a = round_sample(simulated, instr, silo_id=2, records=300, division=division)
            b = round_sample(deployed, instr, silo_id=2, records=300, division=division)
            np.testing.assert_array_equal(a, b)
            batches.append(a)
    for batches in epoch.values():
        np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(300))
        assert [len(b) for b in batches] == [64, 64, 64, 64, 44]
    assert not np.array_equal(epoch["nonsensitive"][0], epoch["sensitive"][0])
    second = round_sample(simulated, _instruction("shuffle", 6), silo_id=2, records=300, division="sensitive")
    assert not np.array_equal(second, epoch["sensitive"][0])  # epoch 2 has its own permutation


@pytest.mark.parametrize("name", ["steffle", "tran"])
def test_sampling_poisson_gives_the_golden_numbers(name: str, tmp_path) -> None:
    """`sampling = poisson` given explicitly runs the golden case of tests/system/test_same_numbers.py (recorded before
    the option existed) to the same numbers: exactly in the recording environment, else as the default does here."""
    from tests.system.test_same_numbers import _load_cases, _recorded_here, run_case

    case = _load_cases()[name]
    observed = run_case({**case["config"], "sampling": "poisson"}, tmp_path)
    assert observed == (case["expected"] if _recorded_here() else run_case(case["config"], tmp_path))


def test_shuffled_runs_survive_a_server_restart_and_a_silo_restart_bit_for_bit(tmp_path) -> None:
    """SteFFLe with shuffled epochs (B = 6): the server dies after the silos answered round 7, the first of epoch 2
    (their replies lost, the epoch charged), and resumes from its checkpoint; in another run silo 1 restarts (a
    fresh context, its state-dir) before round 4, mid-epoch. Both end as the uninterrupted run: the same batches,
    each epoch charged once."""
    from silofl.client.app import app as client_app
    from tests.system.test_faults import (
        DyingServerGrid,
        RestartingGrid,
        ServerKilled,
        _config,
        _same_run,
        _serve,
        _state_dirs,
    )

    values = {"algorithm": "steffle", "epsilon": 1.0, "sampling": "shuffle", "num-silos": 3, "rounds": 8}
    values |= {"eval-every": 4, "checkpoint-every": 1}
    clean = _serve(InProcessGrid(client_app, 3), _config(values))
    out = tmp_path / "run"
    with pytest.raises(ServerKilled):
        _serve(DyingServerGrid(client_app, 3, at=7, after_answers=True), _config(values, out))
    _same_run(_serve(InProcessGrid(client_app, 3), _config(values, out, resume=True)), clean)
    silos = tmp_path / "silos"
    restarted = RestartingGrid(client_app, 3, node_configs=_state_dirs(silos), victim=1, at=4)
    _same_run(_serve(restarted, _config(values, tmp_path / "again")), clean)
    assert clean["privacy"]["per_silo"]["1"]["epochs_accounted"] == 2
