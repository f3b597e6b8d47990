"""FedSC's server and silos end to end (strategies/fedsc.py, client/rounds/fedsc.py), on the real messages.

Tiny runs on scikit-learn's digits (10 silos, one class each, a few records per silo, H = 8) through the real
ServerApp orchestration and ClientApp, with a grid that records every message and reply.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from silofl.client.app import app as client_app
from silofl.protocols import messages as msg
from silofl.protocols.config import RunConfig
from silofl.server.inprocess_grid import InProcessGrid
from silofl.server.orchestrator import run_federation
from silofl.strategies.federation import RoundError
from silofl.strategies.fedsc import FedscStrategy, cosine_lr, sharing_rounds
from silofl.strategies.server_optimizer import ServerOptimizer
from tests.system.test_fuzz_replies import make_fedsc

H = 8


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping (message, reply) pairs of every exchange."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[list, list]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        self.log.append((messages, replies))
        return replies

    def exchanges(self, kind: str) -> list[tuple[list, list]]:
        return [(m, r) for m, r in self.log if m and m[0].metadata.message_type == kind]


def _config(algorithm: str = "fedsc", **extra) -> RunConfig:
    values = {
        "algorithm": algorithm,
        "dataset": "digits",
        "model": "cnn",
        "num-silos": 10,
        "partition": "classes",
        "classes-per-silo": 1,
        "max-train-records": 24,
        "projection-dim": H,
        "rounds": 3,
        "batch-size": 12,
        "lr": 0.05,
        "eval-data": "none",
        **{key.replace("_", "-"): value for key, value in extra.items()},
    }
    return RunConfig.parse(values)


def _run(config: RunConfig) -> tuple[dict, RecordingGrid]:
    grid = RecordingGrid(client_app, config.num_silos)
    result = run_federation(grid, config, engine="inprocess")
    return result, grid


def _matrix(message) -> np.ndarray:
    return message.content[msg.CORRELATION_MATRIX]["R"].numpy()


def test_schedule_helpers() -> None:
    assert sharing_rounds(10, 3, 2) == [3, 5, 7, 9]
    assert cosine_lr(0.1, 1, 10) == pytest.approx(0.1)
    assert cosine_lr(0.1, 11, 10) == pytest.approx(0.0)


@pytest.mark.slow
def test_each_silo_receives_the_others_aggregate_built_from_the_replies() -> None:
    result, grid = _run(  # every record shared each time (the closed form's case), alpha decaying
        _config(epsilon=6.0, delta=1e-2, alpha_start=1.0, alpha_end=0.2, calr_sampling_rate=1.0)
    )
    assert result["status"]["completed"]
    n = {s["node_id"]: s["n_train"] for s in result["federation"]["silos"]}
    total_n = sum(n.values())
    shares = grid.exchanges(msg.CORRELATION)
    trains = grid.exchanges(msg.TRAIN)
    assert len(shares) == 3 and len(trains) == 3  # share then train, every round
    for (_, replies), (messages, _) in zip(shares, trains, strict=True):
        received = {r.metadata.src_node_id: _matrix(r) for r in replies}
        for m in messages:
            j = m.metadata.dst_node_id
            expected = sum(n[k] * received[k] for k in received if k != j) / (total_n - n[j])
            np.testing.assert_allclose(m.content[msg.OTHERS]["R"].numpy(), expected, rtol=1e-12, atol=1e-14)
            assert not np.allclose(m.content[msg.OTHERS]["R"].numpy(), received[j])
    # alpha: eq. 80 from the first share on; the lr follows the cosine
    alphas = result["server_state"]["alphas"]
    assert alphas == pytest.approx([1 - 0.8 * t / 3 for t in (1, 2, 3)])
    # every silo shared every round; its ledger counted three shares; the closed form is looser than the accountant
    privacy = result["privacy"]
    assert 5.0 < privacy["epsilon_spent"] <= 6.0 + 1e-9
    for entry in privacy["correlation_shares"].values():
        assert entry["shares"] == 3
        assert entry["epsilon_closed_form"] > privacy["epsilon_spent"]
    assert "weights" in privacy["not_covered"]


@pytest.mark.slow
def test_correlation_replies_are_noised_in_the_silo() -> None:
    """Same run with and without DP: round 1's queries carry the same model and the silos use the same views, so the
    replies differ exactly by the silo's noise, whose spread is the one reported."""
    _, private = _run(_config(epsilon=6.0, delta=1e-2, rounds=1))
    _, clear = _run(_config(rounds=1, algorithm="fedsc"))
    (_, noised), (_, exact) = private.exchanges(msg.CORRELATION)[0], clear.exchanges(msg.CORRELATION)[0]
    by_node = {r.metadata.src_node_id: r for r in exact}
    for reply in noised:
        report = msg.read_config(reply.content, msg.CorrelationReport, record=msg.REPORT)
        diff = _matrix(reply) - _matrix(by_node[reply.metadata.src_node_id])
        assert report.noise_std > 0
        assert np.std(diff) == pytest.approx(report.noise_std, rel=0.35)  # 64 entries
        assert not np.allclose(diff, diff.T)  # i.i.d. noise on every entry (the paper's Algorithm 2)
        clear_report = msg.read_config(
            by_node[reply.metadata.src_node_id].content, msg.CorrelationReport, record=msg.REPORT
        )
        assert clear_report.noise_std == 0.0 and math.isinf(clear_report.epsilon_spent)


@pytest.mark.slow
@pytest.mark.parametrize("stale_shares", ["keep", "drop"])
def test_partial_participation_builds_rbar_from_the_stale_cache_or_from_the_latest_shares_only(stale_shares) -> None:
    """'keep' (the paper's Algorithm 1): a participant's Rbar_{-j} weighs every silo's latest matrix, stale ones of the
    silos not sampled included; 'drop' (the default): only the matrices of this round's share, the other
    participants'. Round 1 (everyone shares) is the same for both."""
    result, grid = _run(_config(rounds=3, participation=0.3, epsilon=6.0, delta=1e-2, stale_shares=stale_shares))
    shares = grid.exchanges(msg.CORRELATION)
    trains = grid.exchanges(msg.TRAIN)
    assert len(shares[0][0]) == 10  # round 1: everyone
    assert len(shares[1][0]) == 3 and len(trains[1][0]) == 3
    latest: dict[int, np.ndarray] = {}
    n = {s["node_id"]: s["n_train"] for s in result["federation"]["silos"]}
    for (_, replies), (messages, _) in zip(shares, trains, strict=True):
        fresh = {r.metadata.src_node_id: _matrix(r) for r in replies}
        latest.update(fresh)
        used = latest if stale_shares == "keep" else fresh
        for m in messages:
            j = m.metadata.dst_node_id
            expected = sum(n[k] * used[k] for k in used if k != j) / (sum(n[k] for k in used) - n[j])
            np.testing.assert_allclose(m.content[msg.OTHERS]["R"].numpy(), expected, rtol=1e-12, atol=1e-14)
    assert len(latest) == 10 and len(fresh) == 3  # what 'drop' leaves out in the last round: 7 stale matrices
    assert result["server_state"]["stale_shares"] == stale_shares
    counted = {int(k): v["shares"] for k, v in result["privacy"]["correlation_shares"].items()}
    assert sorted(counted.values()) != [3] * 10  # not everyone shared every round
    assert sum(counted.values()) == 10 + 3 + 3


def test_drop_uses_the_latest_sharing_round_and_falls_back_to_the_cache_for_a_lone_participant() -> None:
    """Between shares (share-every > 1) 'drop' uses the latest sharing round's entries; a participant that is the only
    entry of that round gets the whole cache's Rbar_{-j}; 'keep' always the whole cache; a bad value is refused."""
    rng = np.random.default_rng(1)
    s = _strategy()
    h = s.instruction.projection_dim
    s.cache = {j: rng.normal(size=(h, h)) for j in (0, 1, 2)}
    s.shared_in = {0: 4, 1: 4, 2: 2}  # silo 2 last shared two rounds before the latest share
    weights = {j: s.weights[j] for j in (0, 1)}
    expected = {0: s.cache[1], 1: s.cache[0]}  # each of the two fresh entries is the other's whole Rbar
    got = s.others_for([0, 1])
    for j in (0, 1):
        np.testing.assert_allclose(got[j], expected[j], rtol=1e-12)
    assert set(s.entries_used()) == {0, 1} and sum(weights.values()) > 0
    s.stale_shares = "keep"
    keep = s.others_for([0])[0]
    total = sum(s.weights[k] for k in (1, 2))
    np.testing.assert_allclose(keep, (s.weights[1] * s.cache[1] + s.weights[2] * s.cache[2]) / total, rtol=1e-12)
    s.stale_shares = "drop"
    s.shared_in = {0: 6, 1: 4, 2: 2}  # silo 0 alone in the latest share: the whole cache for it
    np.testing.assert_allclose(s.others_for([0])[0], keep, rtol=1e-12)
    with pytest.raises(ValueError, match="stale_shares must be 'drop' or 'keep', got 'old'"):
        FedscStrategy(
            s.federation,
            s.param_spec,
            instruction=s.instruction,
            eval_instruction=s.eval_instruction,
            initial=s.initial,
            share_start=1,
            share_every=1,
            alpha_end=0.2,
            participation=0.5,
            stale_shares="old",
            evaluator=None,
        )
    with pytest.raises(ValueError, match="stale-shares"):
        _config(participation=0.5, stale_shares="old")


def test_fedavg_sc_shares_nothing_and_share_schedule_delays_sharing() -> None:
    result, grid = _run(_config(algorithm="fedavg-sc"))
    assert not grid.exchanges(msg.CORRELATION)
    assert all(msg.OTHERS not in m.content for m in grid.exchanges(msg.TRAIN)[0][0])
    assert result["server_state"]["alphas"] == [1.0, 1.0, 1.0]
    result, grid = _run(_config(rounds=4, share_start=2, share_every=2))
    assert [m[0].metadata.group_id for m, _ in grid.exchanges(msg.CORRELATION)] == ["2", "4"]
    assert result["server_state"]["alphas"][0] == 1.0  # before the first share: plain local SC
    assert result["server_state"]["alphas"][1] < 1.0


def test_alpha_start_sets_the_schedule_from_the_first_share_and_reaches_the_silos() -> None:
    """alpha_start = alpha_end = q_j (eq. 6's exact weight for equal silos): alpha is constant once shared."""
    result, grid = _run(_config(rounds=3, share_start=2, alpha_start=0.1, alpha_end=0.1))
    assert result["server_state"]["alphas"] == pytest.approx([1.0, 0.1, 0.1])
    sent = [msg.read_instruction(m.content).alpha for m in grid.exchanges(msg.TRAIN)[2][0]]
    assert sent == pytest.approx([0.1] * 10)


@pytest.mark.slow
def test_subsampled_calr_noise_one_step_rounds_and_fedadam_on_the_real_messages() -> None:
    """The CPU configuration's options end to end: silos take `local-steps` steps at a constant lr, share Poisson
    subsampled DP-CalR matrices noised in the silo (accounted as subsampled Gaussians), and the server takes an Adam
    step along the silos' mean update with a cosine server lr."""
    from silofl.protocols.privacy.calr import calr_noise

    options = {"rounds": 3, "local_steps": 1, "calr_sampling_rate": 0.5, "server_optimizer": "adam", "server_lr": 0.01}
    result, grid = _run(_config(epsilon=6.0, delta=1e-2, **options))
    _, clear = _run(_config(**options))
    assert result["status"]["completed"]
    trains = grid.exchanges(msg.TRAIN)
    sent = [msg.read_instruction(m[0].content) for m, _ in trains]
    assert [i.local_steps for i in sent] == [1, 1, 1] and [i.lr for i in sent] == [0.05] * 3  # lr constant
    assert [r["lr"] for r in result["rounds"]] == pytest.approx([cosine_lr(0.01, t, 3) for t in (1, 2, 3)])
    # round 1's new model (sent in round 2) = first Adam step from the initial model: lr along sign(mean - current)
    (messages, replies), (next_messages, _) = trains[0], trains[1]
    n = {s["node_id"]: s["n_train"] for s in result["federation"]["silos"]}
    total = sum(n.values())
    for name in ("projector.0.bias", "backbone.0.0.weight"):
        current = messages[0].content[msg.MODEL][name].numpy().astype(np.float64)
        mean = sum(n[r.metadata.src_node_id] * r.content[msg.UPDATE][name].numpy() for r in replies) / total
        new = next_messages[0].content[msg.MODEL][name].numpy()
        moved = np.abs(mean - current) > 1e-6
        np.testing.assert_allclose(new[moved], (current + 0.01 * np.sign(mean - current))[moved], atol=1e-4)
    # the noise in each matrix is the silo's, calibrated for 3 subsampled shares; same coins and views without DP
    sigma = calr_noise(6.0, 1e-2, 3, 4.0, 24, sampling_rate=0.5)
    by_node = {r.metadata.src_node_id: r for r in clear.exchanges(msg.CORRELATION)[0][1]}
    for reply in grid.exchanges(msg.CORRELATION)[0][1]:
        report = msg.read_config(reply.content, msg.CorrelationReport, record=msg.REPORT)
        assert report.noise_std == pytest.approx(sigma, rel=1e-9)
        diff = _matrix(reply) - _matrix(by_node[reply.metadata.src_node_id])
        assert np.std(diff) == pytest.approx(sigma, rel=0.35)
    privacy = result["privacy"]
    assert 5.9 <= privacy["epsilon_spent"] <= 6.0
    assert "Poisson" in privacy["relation"] and "Poisson-subsampled" in privacy["mechanism"]
    assert all("epsilon_closed_form" not in v for v in privacy["correlation_shares"].values())
    assert result["server_state"]["server_optimizer"] == "adam"


def test_fedsc_run_is_reproducible_and_the_probe_is_the_final_accuracy(tmp_path) -> None:
    config = _config(rounds=2, eval_data="central", probe_epochs=5, knn_k=20, out_dir=str(tmp_path))
    first, _ = _run(config)
    second, _ = _run(config)
    import json

    written = json.loads((tmp_path / "result.json").read_text())  # a non-private run's result is valid JSON
    assert written["final"]["accuracy"] == first["final"]["accuracy"]
    from silofl.protocols.models import parameter_spec
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    expected = parameter_spec(build_ssl_model("cnn", image_shape(64), projection_dim=H))
    with np.load(tmp_path / "model.npz") as saved:
        assert [(name, saved[name].shape) for name in saved.files] == expected
    assert first["final"]["accuracy"] == second["final"]["accuracy"]
    assert 0.2 < first["final"]["accuracy"] <= 1.0  # digits: even a barely trained CNN's features beat chance (0.1)
    assert 0.0 < first["final"]["knn_accuracy"] <= 1.0


def _strategy(server_optimizer: str = "adam") -> FedscStrategy:
    """The fuzz tests' FedSC server (3 silos, a two-array model, H = 4), with `server_optimizer`."""
    strategy = make_fedsc()
    strategy.server_optimizer = ServerOptimizer(server_optimizer)  # type: ignore[arg-type]
    return strategy


def test_fedsc_state_arrays_round_trip_and_a_foreign_checkpoint_is_refused() -> None:
    """What a checkpoint keeps of the server (the cache with a silo missing, the reports, the alphas, FedAdam's
    moments) is what a fresh strategy continues from: same Rbar_{-j}, same result state, same next Adam step."""
    rng = np.random.default_rng(0)
    s = _strategy()
    h, spec = s.instruction.projection_dim, s.param_spec
    s.cache = {0: rng.normal(size=(h, h)), 2: rng.normal(size=(h, h))}  # silo 1 never shared
    s.shares, s.correlation_epsilon, s.noise_std = {0: 2, 1: 0, 2: 1}, {0: 1.5, 2: math.inf}, {0: 0.3, 2: 0.0}
    s.shared_in = {0: 2, 2: 1}  # silo 2's entry is older: 'drop' leaves it out
    s.alphas = [1.0, 0.6]
    current = {name: rng.normal(size=shape).astype(np.float32) for name, shape in spec}
    s.server_optimizer.step(current, {k: v + 1.0 for k, v in current.items()}, lr=0.01)
    state = s.state_arrays()
    assert state["cached"].tolist() == [True, False, True] and state["alphas"].shape == (5,)  # 5 rounds
    t = _strategy()
    t.restore_state_arrays(state)
    assert list(t.cache) == [0, 2] and t.result_state() == s.result_state() and t.shared_in == s.shared_in
    assert state["shared_in"].tolist() == [2, 0, 1]
    for j, others in s.others_for([0, 2]).items():
        np.testing.assert_array_equal(t.others_for([j])[j], others)
    mean = {k: v - 0.5 for k, v in current.items()}
    stepped, restored = s.server_optimizer.step(current, mean, 0.02), t.server_optimizer.step(current, mean, 0.02)
    for name, value in stepped.items():
        np.testing.assert_array_equal(restored[name], value)

    with pytest.raises(RoundError, match=r"holds strategy state \['weights'\], but FedscStrategy keeps"):
        _strategy().restore_state_arrays({"weights": np.ones(3)})
    wrong = {**state, "correlation": np.zeros((3, h + 1, h + 1))}
    with pytest.raises(RoundError, match=rf"strategy array 'correlation' is float64\(3, {h + 1}, {h + 1}\), expected"):
        _strategy().restore_state_arrays(wrong)
    with pytest.raises(RoundError, match="server optimizer 'avg' keeps no state"):
        _strategy("avg").restore_state_arrays(state)


@pytest.mark.slow
def test_a_silo_refuses_to_share_past_the_announced_schedule() -> None:
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from silofl.client.rounds.fedsc import correlation_reply
    from silofl.client.silo_data import load_silo_data

    config = _config(rounds=1)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    spec = msg.DataSpec(
        dataset="digits", num_silos=10, partition="classes", classes_per_silo=1, max_train_records=24, seed=0
    )
    silo = load_silo_data(context, spec)
    from silofl.protocols.models import get_parameters
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    model = build_ssl_model("cnn", image_shape(64), projection_dim=H)
    instr = msg.TrainInstruction.for_algorithm(
        "fedsc",
        server_round=1,
        total_rounds=1,
        model="cnn",
        projection_dim=H,
        batch_size=12,
        lr=0.1,
        planned_shares=1,
        epsilon=6.0,
        delta=1e-2,
    )
    content = RecordDict({msg.MODEL: msg.arrays_record(get_parameters(model)), msg.CONFIG: instr.to_config_record()})
    message = Message(content, 1, msg.CORRELATION)
    correlation_reply(silo, instr, context, message)
    again = instr.model_copy(update={"server_round": 2})
    with pytest.raises(msg.MessageError, match="all the run's schedule announced"):
        correlation_reply(silo, again, context, message)
    assert isinstance(context.state["silofl.fedsc.shares"], ConfigRecord)
    assert config.num_silos == 10


@pytest.mark.slow
def test_fedsc_on_cifar10_python_batches_with_the_resnet(tmp_path) -> None:
    """The CIFAR path end to end: a tiny file in the standard python-batch format, ResNet-20, RGB augmentations."""
    import pickle

    from silofl.client.data.cifar import CIFAR10_FOLDER

    folder = tmp_path / CIFAR10_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"):
        batch = {
            b"batch_label": name.encode(),
            b"labels": [i % 10 for i in range(10)],
            b"data": rng.integers(0, 256, size=(10, 3072), dtype=np.uint8),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    config = RunConfig.parse(
        {
            "algorithm": "fedsc",
            "dataset": "cifar10",
            "data-dir": str(tmp_path),
            "model": "resnet20",
            "num-silos": 2,
            "partition": "iid",  # (fedsc's default is one class per silo, for 10 silos)
            "projection-dim": H,
            "rounds": 2,
            "batch-size": 8,
            "lr": 0.05,
            "probe-epochs": 2,
            "knn-k": 5,
            "epsilon": 6.0,
            "delta": 1e-2,
        }
    )
    result, grid = _run(config)
    assert result["status"]["completed"]
    assert result["federation"]["num_features"] == 3072
    assert 0.0 <= result["final"]["accuracy"] <= 1.0
    assert len(grid.exchanges(msg.CORRELATION)) == 2
    assert 0 < result["privacy"]["epsilon_spent"] <= 6.0 + 1e-9
