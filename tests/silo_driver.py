"""The real ClientApp of one silo, driven message by message for `steffle` and `tran` (setup, the group-count
histogram, train rounds), for tests that read what a silo sends and what its ledger charges (`tests/**/test_*.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from silofl.client import privacy_state
from silofl.client.app import app
from silofl.client.data.silo_store import load_silo, save_silo
from silofl.client.data.tabular import SensitiveDivision, Split
from silofl.protocols import messages as msg
from silofl.protocols.models import build_model, get_parameters
from silofl.protocols.privacy.ledger import PrivacyLedger
from silofl.server.inprocess_grid import deliver

#: The fairness record a round sends, per algorithm: SteFFLe's W (demographic parity, 2 groups, 2 labels) and prior,
#: Tran et al.'s signed multipliers and prior. Both make every record's contribution depend on its attribute.
FAIRNESS = {
    "steffle": {"w": np.array([[0.5, -0.5], [-0.5, 0.5]], np.float32), "prior": np.array([0.5, 0.5], np.float32)},
    "tran": {"multipliers": np.array([[0.0, 1.0], [0.0, -1.0]], np.float32), "prior": np.array([0.5, 0.5], np.float32)},
}


class SiloDriver:
    """One silo (simulated partition `partition` of `spec`, or its own data folder via `node_config["data-path"]`)
    answering the messages a `steffle` or `tran` server would send, with a fixed model and fairness record."""

    def __init__(
        self, algorithm: str, *, spec: msg.DataSpec, partition: int = 0, node_config: dict | None = None, **fields: Any
    ) -> None:
        self.algorithm = algorithm
        self.spec = spec
        self.fields = {"total_rounds": 10, "batch_size": 64, "lr": 0.1, "epsilon": 1.0, "delta": 1e-6, **fields}
        config = {"partition-id": partition, "num-partitions": spec.num_silos, **(node_config or {})}
        self.context = Context(run_id=7, node_id=5, node_config=config, state=RecordDict(), run_config={})
        self.info: msg.SiloInfo | None = None

    def _call(self, content: RecordDict, kind: str, server_round: int) -> Message:
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1
        message = Message(content, 5, kind, group_id=str(server_round))
        message.metadata.__dict__["_message_id"] = f"{kind}-{server_round}"
        return deliver(app, message, self.context)

    def instruction(self, server_round: int, **overrides: Any) -> msg.TrainInstruction:
        return msg.TrainInstruction.for_algorithm(
            self.algorithm, server_round=server_round, **{**self.fields, **overrides}
        )

    def setup(self) -> msg.SiloInfo:
        reply = self._call(RecordDict({msg.CONFIG: self.spec.to_config_record()}), msg.SETUP, 0)
        assert not reply.has_error(), reply.error.reason
        self.info = msg.read_config(reply.content, msg.SiloInfo, record=msg.REPORT)
        return self.info

    def groups(self) -> Message:
        """The group-count histogram (the silo's one-off release before round 1)."""
        return self._call(RecordDict({msg.CONFIG: self.instruction(1).to_config_record()}), msg.GROUPS, 0)

    def train(self, server_round: int, fairness: dict[str, np.ndarray] | None = None, **overrides: Any) -> Message:
        """A train message of round `server_round` (instruction fields `overrides`; the fairness record `fairness`,
        by default the algorithm's :data:`FAIRNESS`)."""
        assert self.info is not None, "setup first"
        model = build_model("logreg", self.info.num_features, self.info.num_labels, seed=0)
        content = RecordDict(
            {
                msg.MODEL: msg.arrays_record(get_parameters(model)),
                msg.CONFIG: self.instruction(server_round, **overrides).to_config_record(),
                msg.FAIRNESS: msg.arrays_record(FAIRNESS[self.algorithm] if fairness is None else fairness),
            }
        )
        return self._call(content, msg.TRAIN, server_round)

    def report(self, reply: Message) -> msg.TrainReport:
        assert not reply.has_error(), reply.error.reason
        return msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)

    def ledger(self) -> PrivacyLedger:
        return PrivacyLedger.from_dict(dict(self.context.state[privacy_state.LEDGER_KEY]))

    def calibration(self) -> dict[str, Any]:
        """The silo's calibration record (noise multiplier, one-off histogram multiplier, steps, ...)."""
        return dict(self.context.state[privacy_state.STATE_KEY])


def sensitive_rounds_of_each_record(
    algorithm: str, folder: Path, scratch: Path, *, rounds: int, **fields: Any
) -> dict[int, list[int]]:
    """For each training record i of the silo in `folder`: the rounds whose reply changes when only record i's
    sensitive attribute changes (the silo and its twin answer the same messages with the same seeds and noise).

    Read from the real replies: the rounds whose sensitive batch holds record i. Also checks that nothing else of
    the replies (the non-sensitive division's update, the report) depends on the attribute."""

    def replies(data: Path) -> list[Message]:
        driver = SiloDriver(
            algorithm,
            spec=msg.DataSpec(dataset="synthetic", num_silos=1),
            node_config={"data-path": str(data), "deterministic-noise": True},
            total_rounds=rounds,
            **fields,
        )
        driver.setup()
        assert not driver.groups().has_error()
        out = [driver.train(t) for t in range(1, rounds + 1)]
        for reply in out:
            driver.report(reply)
        return out

    silo = load_silo(folder)
    reference = replies(folder)
    touched: dict[int, list[int]] = {}
    for i in range(len(silo.train)):
        groups = silo.train.sensitive.groups.copy()
        groups[i] = (groups[i] + 1) % silo.info.num_groups
        twin = scratch / f"twin_{i}"
        save_silo(dataclasses.replace(silo, train=Split(silo.train.nonsensitive, SensitiveDivision(groups))), twin)
        touched[i] = []
        for t, (mine, theirs) in enumerate(zip(reference, replies(twin), strict=True), start=1):
            for name in (msg.UPDATE, msg.REPORT):
                assert _record_bytes(mine, name) == _record_bytes(theirs, name), (i, t, name)
            if _record_bytes(mine, msg.FAIR_UPDATE) != _record_bytes(theirs, msg.FAIR_UPDATE):
                touched[i].append(t)
    return touched


def _record_bytes(reply: Message, name: str) -> bytes:
    record = reply.content[name]
    if isinstance(record, ArrayRecord):
        return b"".join(key.encode() + array.data for key, array in sorted(record.items()))
    return repr(sorted(dict(record).items())).encode()


def shuffled_cli_run(algorithm: str, out: Path, capsys: Any, *, rounds: int = 13) -> dict[str, Any]:
    """`silofl run ALGORITHM --sampling shuffle --epsilon 1 --rounds ROUNDS` through the command line's entry point,
    progress bar on, on the synthetic dataset (3 silos of 1500 records, m = 256: B = 6 batches per epoch); checks that
    the epsilon it prints is every silo's ledger figure, the accountant's for the histogram and E = ceil(ROUNDS / 6)
    unsampled releases of the silo's two vectors, within 1 and close to it, and that the privacy block names the
    sampler and its accounting. Returns result.json."""
    import json
    import math

    from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent
    from silofl.server.cli import main

    flags = ["--sampling", "shuffle", "--epsilon", "1", "--rounds", str(rounds), "--out", str(out)]
    code = main(["run", algorithm, *flags])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads((out / "result.json").read_text())
    privacy, epochs = result["privacy"], math.ceil(rounds / 6)
    delta = privacy["delta"]
    one_off = calibrate_noise(0.1, delta, 1.0, 1, relation="replace_one").noise_multiplier  # counts-share 0.1
    for silo in privacy["per_silo"].values():
        assert (silo["sampling"], silo["batches_per_epoch"], silo["epochs_accounted"]) == ("shuffle", 6, epochs)
        assert silo["accounted_sampling_rate"] == 1.0 and silo["rounds_answered"] == rounds
        composed = epsilon_spent(
            silo["noise_multiplier"], 1.0, epochs, delta, releases=2, relation="replace_one", prior=[(one_off,)]
        )
        assert silo["epsilon_spent"] == pytest.approx(composed, rel=1e-12)
    spent = privacy["epsilon_spent"]
    assert spent == max(silo["epsilon_spent"] for silo in privacy["per_silo"].values())
    assert 0.99 < spent <= 1.0 * (1 + 1e-9)
    assert f"{spent:.4f}" in printed.out  # the summary's "eps spent"
    assert f"eps {spent:.3f}" in printed.err  # the progress bar's last figure
    assert privacy["sampling"].startswith("shuffle") and "WITHOUT amplification" in privacy["sampling"]
    assert "shuffled epoch" in privacy["mechanism"] and "WITHOUT amplification" in privacy["mechanism"]
    return result
