"""SteFFLe on the silo, checked on the real outgoing messages of a run.

Two silos whose data differ only in one record's protected attribute, sent the very same messages with the same
seeds, must send replies that differ only in the noised fields: nothing un-noised depends on the protected data.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from silofl.client.app import app as client_app
from silofl.client.data.federate import load_federation
from silofl.client.data.silo_store import load_silo, save_silo
from silofl.client.data.tabular import SensitiveDivision, Split
from silofl.protocols import messages as msg
from silofl.protocols.config import RunConfig
from silofl.server.app import make_server_app
from silofl.server.inprocess_grid import InProcessGrid, deliver
from tests.factories import copy_message

NOISED = {(msg.COUNTS, "counts"), (msg.FAIR_UPDATE, "*")}


class TwinApp:
    """Delivers every message to the real silo and to its twin (same seeds, one protected attribute flipped)."""

    def __init__(self, twin_configs: dict[int, dict]) -> None:
        from flwr.app import Context, RecordDict

        self.twins = {
            p: Context(run_id=1, node_id=1000 + p, node_config=cfg, state=RecordDict(), run_config={})
            for p, cfg in twin_configs.items()
        }
        self.pairs: list[tuple[str, object, object]] = []

    def __call__(self, message, context):
        twin_message = copy_message(message)
        reply = deliver(client_app, message, context)
        twin_reply = deliver(client_app, twin_message, self.twins[int(context.node_config["partition-id"])])
        self.pairs.append((message.metadata.message_type, reply, twin_reply))
        if reply.has_error():
            raise RuntimeError(reply.error.reason)
        return reply


def _flip_one_record(folder, out) -> int:
    silo = load_silo(folder)
    groups = silo.train.sensitive.groups.copy()
    groups[7] = (groups[7] + 1) % silo.info.num_groups
    train = Split(silo.train.nonsensitive, SensitiveDivision(groups))
    save_silo(dataclasses.replace(silo, train=train), out)
    return int(groups[7])


@pytest.mark.slow
@pytest.mark.parametrize("fairness", ["dp", "eo"])
def test_replies_differ_only_in_noised_fields_when_one_protected_attribute_changes(tmp_path, fairness) -> None:
    _, silos = load_federation("synthetic", 2, seed=0)
    folders = []
    for silo in silos:
        save_silo(silo, tmp_path / f"silo_{silo.silo_id}")
        folders.append(tmp_path / f"silo_{silo.silo_id}")
    _flip_one_record(folders[0], tmp_path / "twin_0")
    base = {"deterministic-noise": True}
    node_configs = [{"data-path": str(f), **base} for f in folders]
    twin_configs = {
        0: {"data-path": str(tmp_path / "twin_0"), "partition-id": 0, **base},
        1: {"data-path": str(folders[1]), "partition-id": 1, **base},
    }
    twin_app = TwinApp(twin_configs)
    config = RunConfig.parse(
        {
            "algorithm": "steffle",
            "num-silos": 2,
            "rounds": 4,
            "epsilon": 2.0,
            "batch-size": 64,
            "fairness": fairness,
            "lambda": 1.0,
        }
    )
    grid = InProcessGrid(twin_app, 2, node_configs=node_configs)
    from flwr.app import Context, RecordDict

    make_server_app(config, progress=False)(
        grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    )
    kinds = {kind for kind, _, _ in twin_app.pairs}
    assert {msg.SETUP, msg.GROUPS, msg.TRAIN, msg.EVALUATE} <= kinds
    differing = set()
    for kind, reply, twin in twin_app.pairs:
        assert not twin.has_error(), twin.error.reason
        assert set(reply.content.keys()) == set(twin.content.keys())
        for record_name, record in reply.content.items():
            for key, value in record.items():
                other = twin.content[record_name][key]
                a = value.numpy() if hasattr(value, "numpy") else value
                b = other.numpy() if hasattr(other, "numpy") else other
                if not np.array_equal(np.asarray(a), np.asarray(b)):
                    differing.add((kind, record_name, key))
    # the silo with the flipped record differs in its noised releases, and only there
    assert differing, "the flipped attribute changed nothing: the test would not catch a leak"
    for kind, record_name, key in differing:
        assert (record_name, "*") in NOISED or (record_name, key) in NOISED, (kind, record_name, key)


@pytest.mark.slow
def test_lambda_zero_releases_no_fairness_gradient_and_spends_nothing(tmp_path) -> None:
    from silofl.server.engines import run_job

    config = RunConfig.parse(
        {"algorithm": "steffle", "num-silos": 2, "rounds": 3, "epsilon": 1.0, "batch-size": 64, "lambda": 0.0}
    )
    result = run_job(config, progress=False)
    # only the group-count histogram was charged
    assert 0 < result["privacy"]["epsilon_spent"] < 1.0
    assert math.isfinite(result["privacy"]["epsilon_spent"])


def test_shuffled_epochs_put_every_record_in_one_sensitive_batch_per_epoch(tmp_path) -> None:
    """sampling shuffle, read from a silo's real replies: changing record i's attribute changes exactly one round's
    fairness release per epoch (the round whose sensitive batch holds i), nothing else; over an epoch the rounds'
    batches cover the 22 records once, in batches of 8, 8 and 6, the sampler's batches."""
    from silofl.client.randomness import SENSITIVE_EPOCH_ORDER, epoch_seed
    from silofl.protocols.shuffled_epochs import batch_indices
    from tests.silo_driver import sensitive_rounds_of_each_record

    _, silos = load_federation("synthetic", 2, seed=0)
    small = dataclasses.replace(silos[0], train=silos[0].train.subset(np.arange(22)))
    save_silo(small, tmp_path / "silo")
    touched = sensitive_rounds_of_each_record(
        "steffle", tmp_path / "silo", tmp_path, rounds=6, sampling="shuffle", batch_size=8, epsilon=1.0, delta=1e-6
    )
    assert all([(t - 1) // 3 for t in rounds] == [0, 1] for rounds in touched.values())  # B = 3: one round per epoch
    for epoch in (1, 2):
        batches = [{i for i, rounds in touched.items() if t in rounds} for t in range(3 * epoch - 2, 3 * epoch + 1)]
        assert [len(b) for b in batches] == [8, 8, 6] and set().union(*batches) == set(range(22))
        seed = epoch_seed(seed=0, silo_id=small.silo_id, epoch=epoch, stream=SENSITIVE_EPOCH_ORDER)
        assert batches == [set(batch_indices(22, 8, b, seed).tolist()) for b in range(3)]
