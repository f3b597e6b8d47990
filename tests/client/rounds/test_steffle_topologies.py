"""SteFFLe with separate feature and sensitive parties (docs/algorithms/steffle.md, separate parties), end to end
through the real ServerApp and ClientApp: what the parties send, checked on the real messages (nothing a feature party
sends depends on s; one record's s moves only the sensitive party's noised releases); bad federations refused before
anything private is computed; budgets and policies at a sensitive party. The sealed record exchange itself and the
server's whole view: tests/client/test_sealed_parties.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, RecordDict

from silofl.client import silo_data
from silofl.client.app import app as client_app
from silofl.client.party_exchange import PARTY_SECRET_KEY
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols.config import RunConfig
from silofl.server.engines import run_job
from silofl.server.inprocess_grid import InProcessGrid, deliver
from silofl.server.orchestrator import run_federation
from silofl.strategies.federation import RoundError
from tests.factories import steffle_config
from tests.recording_grid import RecordingGrid

#: One party secret for every run of a comparison: the parties' pseudonyms (not the sealed boxes, which are random)
#: are then the same in both runs.
SECRET = {PARTY_SECRET_KEY: "11" * 32}


def _run(config: RunConfig) -> tuple[dict, RecordingGrid]:
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=[dict(SECRET) for _ in range(config.num_nodes)])
    return run_federation(grid, config), grid


def _roles(grid: InProcessGrid, config: RunConfig) -> dict[int, str]:
    return {
        node: pm.simulated_role(
            int(grid.context(node).node_config["partition-id"]), config.num_silos, config.sensitive_nodes
        )[0]
        for node in grid.get_node_ids()
    }


def _arrays(record) -> dict[str, np.ndarray]:
    return {name: a.numpy() for name, a in record.items()} if isinstance(record, ArrayRecord) else {}


@pytest.mark.slow
def test_no_message_leaving_a_feature_party_carries_a_sensitive_value(monkeypatch) -> None:
    """Every feature-party reply has only the protocol's records, and the feature parties' setup, exchange counts,
    round-1 and first evaluation replies are bit-identical when every sensitive value is flipped: they depend on no
    s (the sealed boxes are encrypted with fresh randomness; what they hold is
    tests/client/test_sealed_parties.py's)."""
    config = steffle_config(topology="central-sensitive", rounds=1)
    _, grid = _run(config)
    flipped = _flip_groups(monkeypatch, config, lambda groups: 1 - groups)
    _, grid_flipped = _run(config)
    roles = _roles(grid, config)
    allowed = {msg.UPDATE, pm.W_BASE, msg.REPORT, pm.SEALED, msg.COUNTS}
    feature_replies = 0
    for (sent, reply), (sent_f, reply_f) in zip(grid.log, grid_flipped.log, strict=True):
        assert sent.metadata.message_type == sent_f.metadata.message_type
        if roles[sent.metadata.dst_node_id] != pm.FEATURES:
            continue
        feature_replies += 1
        assert set(reply.content.keys()) <= allowed, sent.metadata.message_type
        for name, record in reply.content.items():
            if name == pm.SEALED:
                continue
            for key, value in _arrays(record).items():
                np.testing.assert_array_equal(value, _arrays(reply_f.content[name])[key], err_msg=f"{name}.{key}")
        if sent.metadata.message_type == pm.LOSS_QUERY:
            report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT)
            assert report == msg.read_config(reply_f.content, msg.EvaluateReport, record=msg.REPORT)
    assert feature_replies == 3 * 4 and flipped["count"] > 0  # setup, seal, train, loss of 3 parties


def _flip_groups(monkeypatch, config: RunConfig, change) -> dict[str, int]:
    """Make every simulated sensitive party hold changed groups (`change(groups) -> groups`)."""
    real = silo_data._parties.__wrapped__
    seen = {"count": 0}

    def changed(spec):
        features, sensitive = real(spec)
        out = []
        for party in sensitive:
            groups = change(party.train_groups.copy())
            seen["count"] += int((groups != party.train_groups).sum())
            out.append(dataclasses.replace(party, train_groups=groups.astype(np.int64)))
        return features, tuple(out)

    monkeypatch.setattr(silo_data, "_parties", changed)
    return seen


def test_one_records_sensitive_value_changes_only_noised_fields(monkeypatch) -> None:
    """Setup and round 1 with one record's s changed: only the sensitive party's noised releases differ (its
    group counts and its fair-update means), each by at most its sensitivity (over q n_c for the means); every other
    field is identical. The evaluation is left out: exact here (no policy), its counts are public by design (the
    run's `not_covered`)."""
    config = steffle_config(topology="central-sensitive", rounds=1, fairness="dp")
    _, grid = _run(config)

    def one(groups):
        groups[0] = 1 - groups[0]
        return groups

    _flip_groups(monkeypatch, config, one)
    _, grid_changed = _run(config)
    changed = set()
    for (sent, reply), (_, reply_c) in zip(grid.log, grid_changed.log, strict=True):
        kind = sent.metadata.message_type
        if kind in (pm.CONFUSION, pm.LOSS_QUERY):
            continue
        scale = 1.0
        if kind == pm.SENSITIVE_QUERY:  # means over the party's sample: a sum over q n_c
            report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
            scale = report.sampling_rate * report.num_examples
        for name, record in reply.content.items():
            if name == pm.SEALED:
                continue
            for key, value in _arrays(record).items():
                other = _arrays(reply_c.content[name])[key]
                if not np.array_equal(value, other):
                    changed.add((kind, name, key))
                    delta = float(np.linalg.norm(value.astype(np.float64) - other.astype(np.float64))) * scale
                    bound = {"counts": math.sqrt(2), "theta": 2 * config.clip}.get(key, 2 * 2 / math.sqrt(1e-3))
                    assert delta <= bound * (1 + 1e-4), (name, key, delta)
    assert changed <= {
        (msg.GROUPS, msg.COUNTS, "counts"),
        (pm.SENSITIVE_QUERY, msg.FAIR_UPDATE, "theta"),
        (pm.SENSITIVE_QUERY, msg.FAIR_UPDATE, "w"),
    }
    assert (msg.GROUPS, msg.COUNTS, "counts") in changed  # the record was counted: the test saw the change


def test_a_query_naming_records_is_refused_by_a_sensitive_party() -> None:
    """The server cannot aim a round at chosen records: a sensitive party samples the records it received with its
    own secret coins, and a query.sensitive that carries anything beyond the model, W, the prior and the
    instruction (here a column of record ids), or a model it does not accept, is refused before anything is
    charged."""
    config = steffle_config(topology="central-sensitive", rounds=2)
    _, grid = _run(config)
    sent = next(m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY)
    census = grid.context(sent.metadata.dst_node_id)
    ledger = dict(census.state["silofl.ledger"])
    content = RecordDict(dict(sent.content.items()))
    content["rows"] = msg.arrays_record({"ids": np.arange(10, dtype=np.int64)})
    reply = deliver(client_app, Message(content, 7, pm.SENSITIVE_QUERY), census)
    assert reply.has_error() and "unexpected ['rows']" in reply.error.reason
    assert dict(census.state["silofl.ledger"]) == ledger
    # a model beyond the bound, in a round it has not answered: refused before its budget is charged
    instruction = msg.read_instruction(sent.content)
    content = RecordDict(dict(sent.content.items()))
    model = {name: array.numpy().copy() for name, array in sent.content[msg.MODEL].items()}
    model[next(iter(model))][...] = 3e38
    content[msg.MODEL] = msg.arrays_record(model)
    content[msg.CONFIG] = instruction.model_copy(update={"server_round": 3}).to_config_record()
    reply = deliver(client_app, Message(content, 7, pm.SENSITIVE_QUERY), census)
    assert reply.has_error() and "above the 1e+06" in reply.error.reason
    assert dict(census.state["silofl.ledger"]) == ledger


def test_a_feature_partys_ids_not_held_by_any_sensitive_party_stop_the_run_before_any_budget_is_spent(
    monkeypatch,
) -> None:
    config = steffle_config(topology="central-sensitive")
    real = silo_data._parties.__wrapped__

    def missing(spec):
        features, sensitive = real(spec)
        party = sensitive[0]
        drop = np.isin(party.train_ids, features[1].train_ids[:5])
        return features, (
            dataclasses.replace(party, train_ids=party.train_ids[~drop], train_groups=party.train_groups[~drop]),
        )

    monkeypatch.setattr(silo_data, "_parties", missing)
    grid = RecordingGrid(client_app, config.num_nodes)
    with pytest.raises(RoundError, match=r"features party 1 .*5 of its \d+ train records are held by no sensitive"):
        run_federation(grid, config)
    kinds = {m.metadata.message_type for m, _ in grid.log}
    assert msg.GROUPS not in kinds and pm.SENSITIVE_QUERY not in kinds  # nothing private was asked


def test_ids_held_by_two_sensitive_parties_are_refused(monkeypatch) -> None:
    config = steffle_config(topology="general", **{"sensitive-parties": 2})
    real = silo_data._parties.__wrapped__

    def twice(spec):
        features, (a, b) = real(spec)
        extra = a.train_ids[:3]
        b = dataclasses.replace(
            b,
            train_ids=np.concatenate([b.train_ids, extra]),
            train_groups=np.concatenate([b.train_groups, a.train_groups[:3]]),
        )
        return features, (a, b)

    monkeypatch.setattr(silo_data, "_parties", twice)
    grid = RecordingGrid(client_app, config.num_nodes)
    with pytest.raises(RoundError, match=r"features party \d+ .*\d of its \d+ train records are held by two or more"):
        run_federation(grid, config)
    kinds = {m.metadata.message_type for m, _ in grid.log}
    assert msg.GROUPS not in kinds and pm.SENSITIVE_QUERY not in kinds


def test_topology_options_belong_to_steffle_and_fit_the_topology() -> None:
    from silofl.protocols.config import ConfigError

    with pytest.raises(ConfigError, match="topology"):
        RunConfig.parse({"algorithm": "mu2fl", "dataset": "synthetic", "rounds": 2, "topology": "divided"})
    with pytest.raises(ConfigError, match="'sensitive-parties' is for topology 'general'"):
        steffle_config(topology="divided", **{"sensitive-parties": 2})
    for removed in ("share-rows", "keep-rate"):  # the first version's rows through the server, removed
        with pytest.raises(ConfigError, match=f"'{removed}' is no longer an option: .*drop the option"):
            steffle_config(topology="divided", **{removed: "sampled" if removed == "share-rows" else 0.5})
    assert steffle_config(topology="general", **{"sensitive-parties": 4}).num_nodes == 7


def test_a_node_with_a_party_role_in_a_silos_run_is_refused_naming_it() -> None:
    config = steffle_config(rounds=1)
    configs = [{}, {}, {pm.ROLE_KEY: "sensitive"}]
    with pytest.raises(RoundError, match=r"has role 'sensitive' but the run's topology is 'silos'"):
        run_federation(InProcessGrid(client_app, 3, node_configs=configs), config)


def test_silofl_run_with_a_topology_shows_the_parties(tmp_path, capsys) -> None:
    from silofl.server.cli import main

    code = main(
        ["run", "steffle", "--topology", "central-sensitive", "--rounds", "3", "--epsilon", "1", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "3 feature and 1 sensitive parties" in out
    assert (tmp_path / "result.json").is_file()


def test_without_noise_or_fairness_term_every_topology_gives_the_silos_numbers_evaluated_through_the_parties() -> None:
    """lambda = 0 and epsilon = inf: the feature parties take the silos' steps on the same Poisson samples, and the
    evaluation counted by group at the sensitive parties equals the silos' own counts, metric for metric."""
    common = {"epsilon": math.inf, "lambda": 0.0, "rounds": 6, "eval-every": 3}
    silos = run_job(steffle_config(**common), progress=False)
    for topology, extra in (("divided", {}), ("central-sensitive", {}), ("general", {"sensitive-parties": 2})):
        parties = run_job(steffle_config(topology=topology, **common, **extra), progress=False)
        assert parties["final"] == silos["final"], topology
        assert [r.get("accuracy") for r in parties["rounds"]] == [r.get("accuracy") for r in silos["rounds"]]


@pytest.mark.parametrize("fairness", ["eo", "eopp"])
def test_equalized_odds_and_equal_opportunity_run_on_parties(fairness: str) -> None:
    """P_{S|Y} from the sensitive parties' histograms over the labels the feature parties sent in setup; W has one
    block per label (eo) or the positive label's (eopp)."""
    result = run_job(steffle_config(topology="general", fairness=fairness, **{"sensitive-parties": 2}), progress=False)
    assert result["config"]["fairness"] == fairness
    assert np.asarray(result["server_state"]["prior"]).shape == (2, 2)  # (labels, groups)
    assert 0.5 < result["final"]["accuracy"] <= 1 and math.isfinite(result["final"]["eo_violation"])
    assert all(0 < p["epsilon_spent"] <= 1.0 for p in result["privacy"]["per_silo"].values())


def test_a_sensitive_party_refuses_past_its_budget_and_charges_nothing_more(tmp_path) -> None:
    """The census's operator caps its epsilon (node config `epsilon-budget`) below the run's: its noise is
    calibrated to the cap, and a server that keeps asking past the announced rounds is refused, naming the party,
    with its ledger unchanged."""
    from silofl.server.engines import simulated_node_configs

    config = steffle_config(topology="central-sensitive", rounds=3)
    configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path))  # a budget evaluates noised
    configs[-1]["epsilon-budget"] = 0.4
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    result = run_federation(grid, config)
    spent = result["privacy"]["per_silo"]["0"]["epsilon_spent"]
    assert 0.3 < spent <= 0.4 * (1 + 1e-9)
    sent = [m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY][-1]
    census = grid.context(sent.metadata.dst_node_id)
    ledger = dict(census.state["silofl.ledger"])
    instruction = msg.read_instruction(sent.content)
    for server_round in (4, 5):
        content = RecordDict(dict(sent.content.items()))
        content[msg.CONFIG] = instruction.model_copy(update={"server_round": server_round}).to_config_record()
        reply = deliver(client_app, Message(content, 7, pm.SENSITIVE_QUERY), census)
        assert reply.has_error(), "the sensitive party answered a 4th round on a budget calibrated for 3"
        assert "BudgetExceededError" in reply.error.reason and "sensitive party 0" in reply.error.reason
        assert dict(census.state["silofl.ledger"]) == ledger


def test_party_folders_given_to_an_algorithm_that_runs_on_silos_only_are_refused_naming_it(tmp_path) -> None:
    """Nodes started on party folders (a census and two banks) asked to run dp-fedsgd: the setup round stops the
    run with the algorithm named, before anything private is asked."""
    from silofl.client.data.loaders import load_dataset
    from silofl.client.data.party_store import save_party
    from silofl.client.data.topology import split_parties

    features, sensitive = split_parties(load_dataset("synthetic", seed=0), "central-sensitive", feature_parties=2)
    configs = []
    for party in (*features, *sensitive):
        role = pm.FEATURES if party in features else pm.SENSITIVE
        folder = tmp_path / f"{role}_{party.party_id}"
        save_party(party, folder, num_parties=len(features) if role == pm.FEATURES else 1)
        configs.append({"data-path": str(folder), pm.ROLE_KEY: role})
    config = RunConfig.parse({"algorithm": "dp-fedsgd", "num-silos": 2, "rounds": 2, "epsilon": 1.0})
    grid = RecordingGrid(client_app, 3, node_configs=configs)
    with pytest.raises(RoundError, match=r"separate parties .* dp-fedsgd runs on silos only"):
        run_federation(grid, config)
    assert {m.metadata.message_type for m, _ in grid.log} == {msg.SETUP}


def test_a_feature_and_a_sensitive_party_sharing_a_state_dir_keep_apart_ledgers(tmp_path) -> None:
    """Feature party 0 and sensitive party 0 given one state-dir by mistake: their job files are named by role, so
    the census's ledger is its own (a shared file would have refused or mixed their answers)."""
    config = steffle_config(topology="central-sensitive", rounds=2)
    shared = {"state-dir": str(tmp_path)}
    result = run_federation(InProcessGrid(client_app, config.num_nodes, node_configs=[shared] * 4), config)
    assert result["privacy"]["per_silo"]["0"]["rounds_answered"] == 2
    names = sorted(p.name.split("-job-")[0] for p in tmp_path.glob("*-job-*.json"))
    assert names == ["features0", "features1", "features2", "sensitive0"]


@pytest.mark.slow
def test_a_census_under_a_lifetime_budget_answers_the_confusion_counts_noised_and_charges_each(tmp_path) -> None:
    """Central-sensitive: the feature parties under no policy (their test predictions exact, as before), the census
    under a lifetime budget, whose default is to answer evaluations noised: every confusion query is answered with
    a Gaussian histogram (report noise_std = evaluation-noise, counts unlike the exact ones), charged to the census's
    lifetime ledger first at radius sqrt(2)/2 (counts alone), once per query; the run still reports its metrics. Under
    `evaluation = "refuse"` the run stops at setup, naming it."""
    import math

    from silofl.client import lifetime_ledger
    from silofl.server.engines import simulated_node_configs

    config = steffle_config(topology="central-sensitive", rounds=2, **{"eval-every": 1})
    policy = tmp_path / "census.toml"
    policy.write_text("lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\n")
    configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path / "state"))
    census = configs[-1]
    assert census["state-dir"].endswith("sensitive0")
    census["policy"] = str(policy)
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    result = run_federation(grid, config)
    exact, exact_grid = _run(config)
    assert result["status"]["completed"] and 0.0 <= result["final"]["accuracy"] <= 1.0

    def confusion_replies(recording: RecordingGrid) -> list[tuple[msg.EvaluateReport, np.ndarray]]:
        return [
            (
                msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT),
                np.asarray(reply.content[msg.COUNTS]["counts"].numpy()),
            )
            for sent, reply in recording.log
            if sent.metadata.message_type == pm.CONFUSION
        ]

    noised, plain = confusion_replies(grid), confusion_replies(exact_grid)
    assert len(noised) == len(plain) == 2
    for (report, counts), (exact_report, exact_counts) in zip(noised, plain, strict=True):
        assert report.noise_std == 20.0 and exact_report.noise_std == 0.0
        assert report.num_examples == exact_report.num_examples == int(exact_counts.sum())
        assert not np.array_equal(counts, exact_counts) and (counts >= 0).all()
        assert abs(int(counts.sum()) - int(exact_counts.sum())) < 10 * 20.0 * math.sqrt(counts.size)
    ledger = lifetime_ledger.load(tmp_path / "state" / "sensitive0")
    [(multiplier, count)] = ledger.evaluations.items()
    assert multiplier == pytest.approx(20.0 / (math.sqrt(2.0) / 2.0)) and count == 2
    assert len(ledger.jobs) == 1  # the SteFFLe job, admitted once
    assert exact["final"] != result["final"]

    # a node that would refuse the run's evaluations (every run evaluates) stops it at setup, before any release
    policy.write_text('lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\nevaluation = "refuse"\n')
    configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path / "other"))  # the same job anew
    configs[-1]["policy"] = str(policy)
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    with pytest.raises(RoundError, match=r"setup round: sensitive party 0 \(node \d+\) \(evaluation = 'refuse'\)"):
        run_federation(grid, config)
    assert [m.metadata.message_type for m, _ in grid.log] == ["query.setup"] * config.num_nodes
    assert lifetime_ledger.load(tmp_path / "other" / "sensitive0").jobs == {}  # nothing admitted, nothing released

    # one noised evaluation past the lifetime budget: refused before anything is counted, nothing charged
    policy.write_text("lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\nevaluation-noise = 0.05\n")
    configs = simulated_node_configs(config, policy=None, state_dir=str(tmp_path / "third"))
    configs[-1]["policy"] = str(policy)
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    with pytest.raises(RoundError, match=r"sensitive party 0.*lifetime-epsilon = 10.*refuses to evaluate"):
        run_federation(grid, config)
    assert lifetime_ledger.load(tmp_path / "third" / "sensitive0").evaluations == {}
