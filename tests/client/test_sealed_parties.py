"""SteFFLe's separate parties and their sealed record exchange (client/sealed_records.py, client/party_exchange.py,
server/parties.py `sealed_exchange`), through the real ServerApp and ClientApp: the server's whole view (every
message it sends and every reply) holds no record id, feature, label, output or Jacobian; each sensitive party runs
the silos' amplified mechanism on its own secret sample; a forging server is refused; the utility is the silos'."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict

from silofl.client.app import app as client_app
from silofl.client.data.loaders import load_dataset
from silofl.client.data.topology import split_parties
from silofl.client.party_exchange import PARTY_SECRET_KEY, SEALED_KEY
from silofl.client.sealed_records import holdings_boxes, receive_records, record_boxes
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols import party_keys as pk
from silofl.protocols.config import RunConfig
from silofl.protocols.messages import MessageError
from silofl.server.engines import run_job
from silofl.server.inprocess_grid import InProcessGrid
from silofl.server.orchestrator import run_federation
from silofl.strategies.federation import RoundError
from tests.factories import steffle_config
from tests.recording_grid import RecordingGrid


def _config(**extra) -> RunConfig:
    """`steffle_config` with one sensitive party (topology central-sensitive) unless `extra` names another."""
    return steffle_config(**({"topology": "central-sensitive"} | extra))


def _split(topology: str, sensitive_parties: int):
    return split_parties(
        load_dataset("synthetic", seed=0), topology, feature_parties=3, sensitive_parties=sensitive_parties, seed=0
    )


def test_the_server_sees_no_record_id_feature_label_output_or_jacobian() -> None:
    """Every record of every message the server sends or receives in a sealed run is one of the protocol's: the
    model, W and the prior, the feature parties' mean gradients, the sensitive parties' noised means, reports,
    counts of shape (2,) or a (group, label, prediction) table, and sealed boxes; no box contains a record's
    features or id in the clear."""
    config = _config()
    grid = RecordingGrid(client_app, config.num_nodes)
    result = run_federation(grid, config)
    assert 0.5 < result["final"]["accuracy"] <= 1
    kinds = {m.metadata.message_type for m, _ in grid.log}
    assert kinds == {
        msg.SETUP,
        pm.HOLDINGS_QUERY,
        pm.SEAL_QUERY,
        pm.UNSEAL_QUERY,
        msg.GROUPS,
        msg.TRAIN,
        pm.SENSITIVE_QUERY,
        pm.LOSS_QUERY,
        pm.CONFUSION,
    }
    train = load_dataset("synthetic", seed=0).train
    rows = train.nonsensitive.features[::50]  # records of the feature parties, as their float32 bytes
    allowed = {msg.MODEL, msg.FAIRNESS, msg.CONFIG, msg.UPDATE, pm.W_BASE, msg.FAIR_UPDATE, msg.REPORT, msg.COUNTS}
    allowed |= {pm.SEALED}
    boxes = 0
    for sent, reply in grid.log:
        for content in (sent.content, reply.content):
            assert set(content.keys()) <= allowed, (sent.metadata.message_type, sorted(content.keys()))
            for name, record in content.items():
                if not isinstance(record, ArrayRecord):
                    continue
                for key, array in record.items():
                    value = array.numpy()
                    if name == pm.SEALED:
                        boxes += 1
                        data = value.tobytes()
                        assert all(row.tobytes() not in data for row in rows)
                        continue
                    if value.dtype == np.int64:  # counts only: never a column of ids, labels or predictions
                        assert value.size <= 2 or (name == msg.COUNTS and key == "counts"), (name, key, value.shape)
    assert boxes >= 3 + 3 + 3  # holdings to 3 feature parties, their records to the census, relayed


def test_each_sensitive_party_runs_the_silos_amplified_mechanism_on_its_own_sample() -> None:
    """The census samples the records it received at the silos' rate q = m / (n / N) with its own secret coins:
    the silos' mechanism, so its calibrated noise multiplier is a silo's (same rate, rounds and budget)."""
    config = _config(**{"batch-size": 64})
    result = run_job(config, progress=False)
    (report,) = result["privacy"]["per_silo"].values()
    n = len(load_dataset("synthetic", seed=0).train)
    assert report["sampling_rate"] == pytest.approx(64 * 3 / n)
    assert 0.9 < report["epsilon_spent"] <= 1.0 and report["rounds_answered"] == 4
    silos = run_job(_config(topology="silos", **{"batch-size": 64}), progress=False)
    silo = next(iter(silos["privacy"]["per_silo"].values()))
    assert silo["sampling_rate"] == pytest.approx(report["sampling_rate"])
    assert silo["noise_multiplier"] == pytest.approx(report["noise_multiplier"], rel=1e-6)
    # the same composed mechanism (histogram, then T amplified rounds of two releases), accounted alike: a silo's
    # accountant is checked against dp-accounting (tests/protocols/privacy/test_accountant.py,
    # tests/client/test_round_privacy.py)
    assert silo["epsilon_spent"] == pytest.approx(report["epsilon_spent"], rel=1e-9)


@pytest.mark.slow
def test_divided_and_central_sensitive_reach_the_silos_numbers() -> None:
    common = {"rounds": 12, "eval-every": 12, "batch-size": 64, "lambda": 2.0}
    silos = run_job(_config(topology="silos", **common), progress=False)["final"]
    divided = run_job(_config(topology="divided", **common), progress=False)["final"]
    census = run_job(_config(**common), progress=False)["final"]
    assert divided["accuracy"] == pytest.approx(silos["accuracy"], abs=1e-9)  # the same mechanism, the same draws
    assert abs(census["accuracy"] - silos["accuracy"]) < 0.03
    assert abs(census["dp_violation"] - silos["dp_violation"]) < 0.05


def test_exchange_joins_by_pseudonym_and_counts_coverage() -> None:
    """The pure exchange: every feature party's records reach the one sensitive party holding each, joined with
    its groups; records held by nobody or by two are counted; a record the party does not hold is refused."""
    features, sensitive = _split("general", 2)
    names = pk.party_names(len(features), len(sensitive))
    keys = pk.simulated_keys(b"\7" * 32, names)
    holdings = {
        pk.sensitive_name(c): holdings_boxes(keys[pk.sensitive_name(c)], s, 3, "run:1") for c, s in enumerate(sensitive)
    }
    sealed = {}
    for j, party in enumerate(features):
        mine = {name: boxes[pk.feature_name(j)] for name, boxes in holdings.items()}
        sealed[pk.feature_name(j)], coverage = record_boxes(keys[pk.feature_name(j)], party, mine, "run:1")
        assert coverage.unheld == {"train": 0, "test": 0} and coverage.held_twice == {"train": 0, "test": 0}
    total = 0
    for c, party in enumerate(sensitive):
        boxes = {f: sealed[f][pk.sensitive_name(c)] for f in sealed}
        records = receive_records(keys[pk.sensitive_name(c)], party, boxes, 3, "run:1")
        total += len(records.train)
        # each received row is the feature party's row of that record, with this party's group of it
        by_id = {
            int(i): (f.train.features[k], int(f.train.labels[k])) for f in features for k, i in enumerate(f.train_ids)
        }
        group_of = dict(zip(party.train_ids.tolist(), party.train_groups.tolist(), strict=True))
        held = [i for i in party.train_ids.tolist() if i in by_id]
        assert len(held) == len(records.train)
        for k in range(0, len(records.train), 97):
            x = records.train.features[k]
            match = [i for i in held if np.array_equal(by_id[i][0], x) and by_id[i][1] == records.train.labels[k]]
            assert match and group_of[match[0]] == records.train_groups.groups[k]
        with pytest.raises(MessageError, match="from each of"):
            receive_records(keys[pk.sensitive_name(c)], party, dict(list(boxes.items())[:2]), 3, "run:1")
    assert total == sum(len(f.train_ids) for f in features)
    # a sensitive party that lost records: the feature party counts them as unheld
    short = dataclasses.replace(
        sensitive[0], train_ids=sensitive[0].train_ids[5:], train_groups=sensitive[0].train_groups[5:]
    )
    lost = {
        pk.sensitive_name(0): holdings_boxes(keys["sensitive-0"], short, 3, "run:1")["features-0"],
        pk.sensitive_name(1): holdings["sensitive-1"]["features-0"],
    }
    _, coverage = record_boxes(keys["features-0"], features[0], lost, "run:1")
    assert coverage.unheld["train"] == int(np.isin(sensitive[0].train_ids[:5], features[0].train_ids).sum())


def _forge(grid: RecordingGrid, kind: str, change) -> None:
    """Make the grid's server change every `kind` message before it is delivered (`change(content) -> content`)."""
    original = InProcessGrid.send_and_receive

    def forging(self, messages, *, timeout=None):
        out = []
        for m in messages:
            if m.metadata.message_type == kind:
                m = Message(change(m.content), m.metadata.dst_node_id, kind, group_id=m.metadata.group_id)
            out.append(m)
        return original(self, out, timeout=timeout)

    grid.send_and_receive = forging.__get__(grid)  # type: ignore[method-assign]


def test_a_server_that_forges_or_swaps_boxes_is_refused_by_the_parties() -> None:
    """A malicious server cannot read the boxes, and cannot make a party accept a box it made, nor one party's box
    as another's: the party refuses (no box opens) before it uses anything."""
    config = _config()

    def swap(content: RecordDict) -> RecordDict:
        boxes = content[pm.SEALED]
        names = list(boxes.keys())
        if len(names) < 2:  # one sensitive party: replace its box by a server-made one
            fake = pk.generate(["features-9"])["features-9"]
            forged = pk.seal(fake, "features-9", "holdings", "run:1", b"ids the server wants")
            swapped = {names[0]: np.frombuffer(forged, dtype=np.uint8)}
        else:
            swapped = {names[0]: boxes[names[1]].numpy(), names[1]: boxes[names[0]].numpy()}
            swapped |= {n: boxes[n].numpy() for n in names[2:]}
        return RecordDict({msg.CONFIG: content[msg.CONFIG], pm.SEALED: msg.arrays_record(swapped)})

    for kind in (pm.SEAL_QUERY, pm.UNSEAL_QUERY):
        grid = RecordingGrid(client_app, config.num_nodes)
        _forge(grid, kind, swap)
        with pytest.raises(RoundError, match="does not open"):
            run_federation(grid, config)


def test_a_sensitive_party_without_its_records_refuses_a_round() -> None:
    """A server that skips the exchange (or a node that lost its state) gets a refusal naming the exchange."""
    config = _config()
    grid = RecordingGrid(client_app, config.num_nodes)
    run_federation(grid, config)
    census_node = next(node for node, c in grid._contexts.items() if SEALED_KEY in c.state)
    del grid._contexts[census_node].state[SEALED_KEY]
    query = next(m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY)
    reply = next(iter(InProcessGrid.send_and_receive(grid, [Message(query.content, census_node, pm.SENSITIVE_QUERY)])))
    assert reply.has_error() and "holds no sealed records for this run" in reply.error.reason
    assert grid._contexts[census_node].node_config[PARTY_SECRET_KEY]


@pytest.mark.parametrize(
    ("topology", "extra", "sensitive"),
    [
        ("divided", {}, 3),
        ("general", {"sensitive-parties": 2}, 2),
        ("general", {"sensitive-parties": 3, "sensitive-by": "age"}, 3),  # one census office per age band
    ],
)
@pytest.mark.slow
def test_every_topology_runs_sealed_with_each_sensitive_party_on_its_own_budget(topology, extra, sensitive) -> None:
    config = _config(topology=topology, **{"batch-size": 64}, **extra)
    result = run_job(config, progress=False)
    assert 0.5 < result["final"]["accuracy"] <= 1 and result["final"]["dp_violation"] is not None
    per_party = result["privacy"]["per_silo"]
    assert len(per_party) == sensitive
    n = len(load_dataset("synthetic", seed=0).train)
    for report in per_party.values():
        assert 0 < report["epsilon_spent"] <= 1.0 and report["rounds_answered"] == 4
        assert report["sampling_rate"] == pytest.approx(64 * 3 / n)
    assert "sealed" in result["privacy"]["parties"] and "no record id" in result["privacy"]["parties"]


@pytest.mark.slow
def test_policies_hold_with_sealed_records(tmp_path) -> None:
    """The census capped below the run's epsilon calibrates to its cap; under a lifetime budget (noised
    evaluations) it answers every confusion query noised, charged first; a feature party whose policy answers
    evaluations noised answers its loss noised and charged, and the census counts the test records noised too."""
    import math

    from silofl.client import lifetime_ledger
    from silofl.server.engines import simulated_node_configs

    config = _config(rounds=2, **{"eval-every": 1})
    policy, banks = tmp_path / "lifetime.toml", tmp_path / "banks.toml"
    policy.write_text("lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\n")
    banks.write_text('evaluation = "noised"\n')  # a bank's gradients go in the clear: no budget, noised evaluations

    configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path / "capped"))
    configs[-1]["epsilon-budget"] = 0.4
    result = run_federation(RecordingGrid(client_app, config.num_nodes, node_configs=configs), config)
    assert 0 < result["privacy"]["per_silo"]["0"]["epsilon_spent"] <= 0.4 * (1 + 1e-9)

    for who, state in (("census", "census"), ("bank", "bank")):
        configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path / state))
        configs[-1 if who == "census" else 0]["policy"] = str(policy if who == "census" else banks)
        grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
        result = run_federation(grid, config)
        assert result["status"]["completed"]
        reports = {
            kind: [
                msg.read_config(r.content, msg.EvaluateReport, record=msg.REPORT)
                for m, r in grid.log
                if m.metadata.message_type == kind
            ]
            for kind in (pm.CONFUSION, pm.LOSS_QUERY)
        }
        assert len(reports[pm.CONFUSION]) == 2 and all(r.noise_std == 20.0 for r in reports[pm.CONFUSION])
        loss_noise = {r.silo_id: r.noise_std for r in reports[pm.LOSS_QUERY]}
        assert loss_noise == ({0: 0.0, 1: 0.0, 2: 0.0} if who == "census" else {0: 20.0, 1: 0.0, 2: 0.0})
        folder = tmp_path / state / ("sensitive0" if who == "census" else "features0")
        ledger = lifetime_ledger.load(folder)
        [(multiplier, count)] = ledger.evaluations.items()
        radius = math.sqrt(2.0) / 2.0 if who == "census" else 0.5
        assert multiplier == pytest.approx(20.0 / radius) and count == 2


@pytest.mark.slow
def test_a_csv_the_tests_never_saw_split_central_sensitive_trains_fairer_with_lambda(tmp_path) -> None:
    """A held-out-style check of the default, the way a user runs it: a fresh CSV (loan applicants: income, debt,
    years employed, a region, the label approved, the sensitive column gender, with approval correlated with gender
    through income), split with `silofl data split --topology central-sensitive` (3 banks and a census), trained on
    those folders with sealed records: lambda lowers the demographic-parity violation at a usable accuracy."""
    import csv
    import subprocess
    import sys

    from silofl.server.engines import run_job

    rng = np.random.default_rng(2026)
    n = 3000
    gender = rng.integers(0, 2, n)
    income = rng.normal(40 + 12 * gender, 10, n)
    debt = rng.normal(15, 5, n)
    years = rng.integers(0, 30, n)
    region = rng.choice(["north", "south", "east"], n)
    approved = (income - debt + 0.3 * years + rng.normal(0, 6, n) > 30).astype(int)
    path = tmp_path / "loans.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["income", "debt", "years", "region", "gender", "approved"])
        for row in zip(
            income.round(2), debt.round(2), years, region, np.where(gender, "f", "m"), approved, strict=True
        ):
            writer.writerow(row)
    out = tmp_path / "parties"
    silofl = str(Path(sys.executable).parent / "silofl")  # the real entry point
    split = [silofl, "data", "split", str(path), "--silos", "3", "--target", "approved"]
    split += ["--sensitive", "gender", "--topology", "central-sensitive", "--out", str(out)]
    done = subprocess.run(split, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    folders = sorted(p for p in out.iterdir() if p.is_dir())  # beside them: preprocessing.json
    assert [f.name for f in folders] == ["features_0", "features_1", "features_2", "sensitive_0"]
    configs = [{"data-path": str(f), pm.ROLE_KEY: f.name.rpartition("_")[0]} for f in folders]
    finals = {}
    for lam in (0.0, 4.0):
        config = RunConfig.parse(
            {
                "algorithm": "steffle",
                "num-silos": 3,
                "topology": "central-sensitive",
                "epsilon": 3.0,
                "lambda": lam,
                "epochs": 20,
                "seed": 0,
            }
        )
        finals[lam] = run_job(config, progress=False, node_configs=configs)["final"]
    assert finals[0.0]["accuracy"] > 0.7 and finals[4.0]["accuracy"] > 0.65
    # measured: lambda 0 accuracy 0.872, violation 0.378; lambda 4: 0.795, 0.198
    assert finals[4.0]["dp_violation"] < 0.8 * finals[0.0]["dp_violation"], finals


def test_a_census_restarted_mid_run_stops_it_and_resume_exchanges_again_and_continues(tmp_path) -> None:
    """The census loses its sealed records with its process (they are never written to its state-dir): the run
    stops at its next round before anything is charged; resume=true on fresh processes runs the exchange again and
    finishes with the uninterrupted run's numbers, every round charged once."""
    from silofl.client import privacy_state
    from silofl.protocols.privacy.ledger import PrivacyLedger
    from silofl.protocols.record_codec import decode_record
    from silofl.server.app import make_server_app

    base = {"rounds": 4, "eval-every": 2, "checkpoint-every": 1}
    reference = run_job(_config(**base), progress=False)

    def serve(grid, config):
        results = []
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
        make_server_app(config, sink=results.append, progress=False)(grid, context)
        return results[0]

    states = [{privacy_state.STATE_DIR_KEY: str(tmp_path / "state" / f"node{k}")} for k in range(4)]
    out = tmp_path / "run"
    grid = InProcessGrid(client_app, 4, node_configs=states)
    census = next(node for node, c in grid._contexts.items() if c.node_config["partition-id"] == 3)
    real = grid.send_and_receive

    def restart_census_before_round_3(messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.message_type == pm.SENSITIVE_QUERY and m.metadata.group_id == "3" for m in messages):
            grid._contexts[census].state = RecordDict()  # a fresh process: only its state-dir is left
        return real(messages, timeout=timeout)

    grid.send_and_receive = restart_census_before_round_3  # type: ignore[method-assign]
    with pytest.raises(RoundError, match="holds no sealed records for this run"):
        serve(grid, _config(**base, **{"out-dir": str(out)}))
    fresh = InProcessGrid(client_app, 4, node_configs=states)
    fresh.restore_silo_states = None  # type: ignore[method-assign]  # as deployed: nothing restored by the server
    resumed = serve(fresh, _config(**base, **{"out-dir": str(out), "resume": True}))
    assert resumed["status"]["completed"] and resumed["status"]["resumed_from"] == 2
    assert resumed["final"] == reference["final"] and resumed["model"] == reference["model"]
    (job,) = (tmp_path / "state" / "node3").glob("sensitive*-job-*.json")
    saved = json.loads(job.read_text())["records"]
    assert SEALED_KEY not in saved  # the banks' records never reach the census's disk
    record = decode_record(saved[privacy_state.LEDGER_KEY])
    assert PrivacyLedger.from_dict(dict(record)).rounds() == [0, 1, 2, 3, 4]  # the histogram, then each round once
