"""SteFFLe with separate feature and sensitive parties exchanging rows through the server each round (`share-rows
sampled` / `all`, the first version of ../shared/specs/steffle-hybrid.md), end to end through the real ServerApp and
ClientApp: every topology runs; what the parties send, checked on the real messages; divided against silos; bad
federations refused before anything private is computed. The default, sealed records: tests/test_sealed_parties.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict

from client import silo_data
from client.app import app as client_app
from protocols import messages as msg
from protocols import parties as pm
from protocols.config import RunConfig
from server.engines import run_job
from server.inprocess_grid import InProcessGrid, deliver
from server.orchestrator import run_federation
from strategies.base import RoundError
from tests.recording_grid import RecordingGrid


def _config(**extra) -> RunConfig:
    """A run of the rows protocol (`share-rows sampled`: rows through the server each round), which this module
    tests; the default, sealed records, is tests/test_sealed_parties.py's (a silos run ignores the key)."""
    values = {
        "algorithm": "steffle",
        "dataset": "synthetic",
        "num-silos": 3,
        "rounds": 4,
        "eval-every": 2,
        "epsilon": 1.0,
    } | extra
    if values.get("topology", "silos") != "silos":
        values.setdefault("share-rows", "sampled")
    return RunConfig.parse(values)


def _run(config: RunConfig) -> tuple[dict, RecordingGrid]:
    grid = RecordingGrid(client_app, config.num_nodes)
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


@pytest.mark.parametrize(
    ("topology", "extra", "sensitive"),
    [
        ("divided", {}, 3),
        ("central-sensitive", {}, 1),
        ("general", {"sensitive-parties": 2, "keep-rate": 0.5}, 2),
        ("general", {"sensitive-parties": 3, "sensitive-by": "age"}, 3),  # one census office per age band
    ],
)
def test_every_topology_runs_with_each_sensitive_party_spending_its_own_budget(topology, extra, sensitive) -> None:
    config = _config(topology=topology, **extra)
    result = run_job(config, progress=False)
    assert 0.5 < result["final"]["accuracy"] <= 1 and result["final"]["dp_violation"] is not None
    assert result["federation"]["topology"] == topology
    assert len(result["federation"]["sensitive_parties"]) == sensitive
    per_party = result["privacy"]["per_silo"]
    assert len(per_party) == sensitive  # the sensitive parties' ledgers: the feature parties add no noise
    for report in per_party.values():
        assert 0 < report["epsilon_spent"] <= 1.0 and report["rounds_answered"] == 4
        assert report["sampling_rate"] == config.keep_rate  # its own secret coins, its only amplification
    assert "secret coins" in result["privacy"]["parties"]


def test_no_message_leaving_a_feature_party_carries_a_sensitive_value(monkeypatch) -> None:
    """Every feature-party reply has only the protocol's records, and the feature parties' setup and round-1
    replies are bit-identical when every sensitive value is flipped: they depend on no s."""
    config = _config(topology="central-sensitive", rounds=1)
    _, grid = _run(config)
    flipped = _flip_groups(monkeypatch, config, lambda groups: 1 - groups)
    _, grid_flipped = _run(config)
    roles = _roles(grid, config)
    allowed = {msg.UPDATE, pm.ROWS, pm.OUTPUTS, msg.REPORT, pm.TRAIN_ROWS, pm.TEST_ROWS}
    feature_replies = 0
    for (sent, reply), (sent_f, reply_f) in zip(grid.log, grid_flipped.log, strict=True):
        assert sent.metadata.message_type == sent_f.metadata.message_type
        if roles[sent.metadata.dst_node_id] != pm.FEATURES:
            continue
        feature_replies += 1
        assert set(reply.content.keys()) <= allowed, sent.metadata.message_type
        if sent.metadata.message_type == msg.EVALUATE:
            continue  # after round 1 the model (post-processing of the noised h) differs
        for name, record in reply.content.items():
            for key, value in _arrays(record).items():
                np.testing.assert_array_equal(value, _arrays(reply_f.content[name])[key], err_msg=f"{name}.{key}")
    assert feature_replies >= 3 * 3 and flipped["count"] > 0  # setup, records, train of 3 parties


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
    group counts and its fair-update sums), each by at most its sensitivity; every other field is identical."""
    config = _config(topology="central-sensitive", rounds=1, fairness="dp")
    _, grid = _run(config)

    def one(groups):
        groups[0] = 1 - groups[0]
        return groups

    _flip_groups(monkeypatch, config, one)
    _, grid_changed = _run(config)
    changed = set()
    for (sent, reply), (_, reply_c) in zip(grid.log, grid_changed.log, strict=True):
        if sent.metadata.message_type == msg.EVALUATE:
            continue
        for name, record in reply.content.items():
            for key, value in _arrays(record).items():
                other = _arrays(reply_c.content[name])[key]
                if not np.array_equal(value, other):
                    changed.add((sent.metadata.message_type, name, key))
                    delta = float(np.linalg.norm(value.astype(np.float64) - other.astype(np.float64)))
                    bound = {"counts": math.sqrt(2), "theta": 2 * config.clip}.get(key, 2 * 2 / math.sqrt(1e-3))
                    assert delta <= bound * (1 + 1e-4), (name, key, delta)
    assert changed <= {
        (msg.GROUPS, msg.COUNTS, "counts"),
        (pm.SENSITIVE_QUERY, msg.FAIR_UPDATE, "theta"),
        (pm.SENSITIVE_QUERY, msg.FAIR_UPDATE, "w"),
    }
    assert (msg.GROUPS, msg.COUNTS, "counts") in changed  # the record was counted: the test saw the change


def _fresh_sensitive_node(config: RunConfig, node_config: dict) -> Context:
    """A sensitive node that has answered the setup round of `config`."""
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})
    from server.orchestrator import setup_round  # noqa: F401  (the DataSpec the server sends)

    spec = msg.DataSpec(
        dataset=config.dataset,
        num_silos=config.num_silos,
        seed=config.seed,
        topology=config.topology,
        sensitive_parties=config.sensitive_nodes,
    )
    reply = client_app(Message(RecordDict({msg.CONFIG: spec.to_config_record()}), 7, msg.SETUP), context)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return context


def test_a_sensitive_partys_reply_has_the_same_shape_and_noise_whether_or_not_it_holds_the_ids() -> None:
    config = _config(topology="central-sensitive", rounds=2)
    _, grid = _run(config)
    sent = next(m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY)
    node_config = dict(grid.context(sent.metadata.dst_node_id).node_config)

    def ask(shift_ids: bool) -> RecordDict:
        content = RecordDict(dict(sent.content.items()))
        rows = _arrays(content[pm.ROWS])
        if shift_ids:  # ids no party holds: the answer is pure (dummy) noise
            rows["ids"] = rows["ids"] + 10**9
        content[pm.ROWS] = pm.int_record(**rows)
        reply = client_app(Message(content, 7, pm.SENSITIVE_QUERY), _fresh_sensitive_node(config, node_config))
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        return reply.content

    held, none = ask(False), ask(True)
    assert set(held.keys()) == set(none.keys())
    for key, value in _arrays(held[msg.FAIR_UPDATE]).items():
        assert value.shape == _arrays(none[msg.FAIR_UPDATE])[key].shape and value.dtype == np.float32
    report_held = msg.read_config(held, msg.TrainReport, record=msg.REPORT)
    report_none = msg.read_config(none, msg.TrainReport, record=msg.REPORT)
    assert report_held == report_none  # the same noise multiplier, epsilon, sampling rate
    theta = _arrays(none[msg.FAIR_UPDATE])["theta"].astype(np.float64)
    expected = report_none.noise_multiplier * config.clip
    assert 0.8 < theta.std() / expected < 1.2 and abs(theta.mean()) < 4 * expected / math.sqrt(theta.size)


def test_a_sensitive_partys_w_noise_is_per_group_by_default() -> None:
    """The default w-noise (auto) is per-group at a separate sensitive party too: on the real reply to the same query
    (ids it does not hold: pure noise, drawn from the same seeded generator), each group's row of the W release is the
    isotropic release scaled by that row's bound 2 / sqrt(p_S(r)) over the largest one, R_W = 2 / sqrt(rho)."""
    from protocols.ermi import GroupPrior

    config = _config(topology="central-sensitive", rounds=2)
    assert config.w_noise == "auto"
    _, grid = _run(config)
    sent = next(m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY)
    node_config = dict(grid.context(sent.metadata.dst_node_id).node_config)
    instr = msg.read_instruction(sent.content)

    def dummy_w(w_noise: str) -> np.ndarray:
        content = RecordDict(dict(sent.content.items()))
        rows = _arrays(content[pm.ROWS])
        rows["ids"] = rows["ids"] + 10**9  # ids no party holds: the W release is noise alone
        content[pm.ROWS] = pm.int_record(**rows)
        content[msg.CONFIG] = instr.model_copy(update={"w_noise": w_noise}).to_config_record()
        reply = client_app(Message(content, 7, pm.SENSITIVE_QUERY), _fresh_sensitive_node(config, node_config))
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        return _arrays(reply.content[msg.FAIR_UPDATE])["w"].astype(np.float64)

    auto, isotropic = dummy_w("auto"), dummy_w("isotropic")
    prior = GroupPrior("dp", _arrays(sent.content[msg.FAIRNESS])["prior"].astype(np.float64), num_labels=2)
    bounds = prior.w_row_bounds().reshape(-1, 1)  # (k, 1) for demographic parity
    assert bounds.min() < bounds.max()  # unequal groups: the two noises differ
    np.testing.assert_allclose(auto, isotropic * bounds / prior.w_gradient_bound(), rtol=1e-5)
    assert np.abs(auto).sum() > 0


def test_divided_gives_the_silos_results_over_seeds() -> None:
    """`divided` with every row shared and the sensitive party's secret coins at q = m / n_j is the silos'
    mechanism over the network: the same distribution of results (here, per seed, nearly the same numbers)."""
    n_j = 2000 // 3  # synthetic: 2000 training records over 3 silos (mean)
    results = {"silos": [], "divided": []}
    for seed in range(3):
        common = {"seed": seed, "rounds": 12, "eval-every": 12, "batch-size": 64}
        results["silos"].append(run_job(_config(**common), progress=False)["final"])
        divided = _config(topology="divided", **{"share-rows": "all", "keep-rate": 64 / n_j}, **common)
        results["divided"].append(run_job(divided, progress=False)["final"])
    for metric in ("accuracy", "dp_violation"):
        silos = np.array([r[metric] for r in results["silos"]])
        divided = np.array([r[metric] for r in results["divided"]])
        assert abs(silos.mean() - divided.mean()) < 0.02, (metric, silos, divided)


@pytest.mark.parametrize("share_rows", ["sampled", "sealed"])
def test_a_feature_partys_ids_not_held_by_any_sensitive_party_stop_the_run_before_any_budget_is_spent(
    monkeypatch, share_rows
) -> None:
    config = _config(topology="central-sensitive", **{"share-rows": share_rows})
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
    with pytest.raises(
        RoundError, match=r"features party 1 .*5 of its \d+ train records? (ids )?are held by no sensitive"
    ):
        run_federation(grid, config)
    kinds = {m.metadata.message_type for m, _ in grid.log}
    assert msg.GROUPS not in kinds and pm.SENSITIVE_QUERY not in kinds  # nothing private was asked


def test_ids_held_by_two_sensitive_parties_are_refused(monkeypatch) -> None:
    config = _config(topology="general", **{"sensitive-parties": 2})
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
    with pytest.raises(RoundError, match=r"held .* times by the sensitive parties"):
        run_federation(InProcessGrid(client_app, config.num_nodes), config)


def test_topology_options_belong_to_steffle_and_fit_the_topology() -> None:
    from protocols.config import ConfigError

    with pytest.raises(ConfigError, match="topology"):
        RunConfig.parse({"algorithm": "mu2fl", "dataset": "synthetic", "rounds": 2, "topology": "divided"})
    with pytest.raises(ConfigError, match="'sensitive-parties' is for topology 'general'"):
        _config(topology="divided", **{"sensitive-parties": 2})
    with pytest.raises(ConfigError, match="'keep-rate'"):
        _config(**{"keep-rate": 0.5})
    assert _config(topology="general", **{"sensitive-parties": 4}).num_nodes == 7


def test_a_node_with_a_party_role_in_a_silos_run_is_refused_naming_it() -> None:
    config = _config(rounds=1)
    configs = [{}, {}, {pm.ROLE_KEY: "sensitive"}]
    with pytest.raises(RoundError, match=r"has role 'sensitive' but the run's topology is 'silos'"):
        run_federation(InProcessGrid(client_app, 3, node_configs=configs), config)


def test_silofl_run_with_a_topology_shows_the_parties(tmp_path, capsys) -> None:
    from server.cli import main

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
    silos = run_job(_config(**common), progress=False)
    for topology, extra in (("divided", {}), ("central-sensitive", {}), ("general", {"sensitive-parties": 2})):
        parties = run_job(_config(topology=topology, **common, **extra), progress=False)
        assert parties["final"] == silos["final"], topology
        assert [r.get("accuracy") for r in parties["rounds"]] == [r.get("accuracy") for r in silos["rounds"]]


@pytest.mark.parametrize("fairness", ["eo", "eopp"])
def test_equalized_odds_and_equal_opportunity_run_on_parties(fairness: str) -> None:
    """P_{S|Y} from the sensitive parties' histograms over the labels the feature parties sent in setup; W has one
    block per label (eo) or the positive label's (eopp)."""
    result = run_job(_config(topology="general", fairness=fairness, **{"sensitive-parties": 2}), progress=False)
    assert result["config"]["fairness"] == fairness
    assert np.asarray(result["server_state"]["prior"]).shape == (2, 2)  # (labels, groups)
    assert 0.5 < result["final"]["accuracy"] <= 1 and math.isfinite(result["final"]["eo_violation"])
    assert all(0 < p["epsilon_spent"] <= 1.0 for p in result["privacy"]["per_silo"].values())


def test_a_sensitive_party_refuses_past_its_budget_and_charges_nothing_more() -> None:
    """The census's operator caps its epsilon (node config `epsilon-budget`) below the run's: its noise is
    calibrated to the cap, and a server that keeps asking past the announced rounds is refused, naming the party,
    with its ledger unchanged."""
    config = _config(topology="central-sensitive", rounds=3)
    _, grid = _run(config)
    sent = next(m for m, _ in grid.log if m.metadata.message_type == pm.SENSITIVE_QUERY)
    node_config = dict(grid.context(sent.metadata.dst_node_id).node_config) | {"epsilon-budget": 0.4}
    context = _fresh_sensitive_node(config, node_config)
    instruction = msg.read_instruction(sent.content)
    spent, refused = [], None
    for server_round in range(1, 20):
        content = RecordDict(dict(sent.content.items()))
        content[msg.CONFIG] = instruction.model_copy(update={"server_round": server_round}).to_config_record()
        reply = deliver(client_app, Message(content, 7, pm.SENSITIVE_QUERY), context)
        if reply.has_error():
            refused = reply.error.reason
            break
        spent.append(msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT).epsilon_spent)
    assert refused is not None, "the sensitive party answered 19 rounds on a budget calibrated for 3"
    assert "BudgetExceededError" in refused and "sensitive party 0" in refused
    assert len(spent) >= 3 and max(spent) <= 0.4 * (1 + 1e-9)
    ledger = dict(context.state["silofl.ledger"])
    content[msg.CONFIG] = instruction.model_copy(update={"server_round": server_round + 1}).to_config_record()
    assert deliver(client_app, Message(content, 7, pm.SENSITIVE_QUERY), context).has_error()
    assert dict(context.state["silofl.ledger"]) == ledger


def test_party_folders_given_to_an_algorithm_that_runs_on_silos_only_are_refused_naming_it(tmp_path) -> None:
    """Nodes started on party folders (a census and two banks) asked to run dp-fedsgd: the setup round stops the
    run with the algorithm named, before anything private is asked."""
    from client.data.loaders import load_dataset
    from client.data.party_store import save_party
    from client.data.topology import split_parties

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
    config = _config(topology="central-sensitive", rounds=2)
    shared = {"state-dir": str(tmp_path)}
    result = run_federation(InProcessGrid(client_app, config.num_nodes, node_configs=[shared] * 4), config)
    assert result["privacy"]["per_silo"]["0"]["rounds_answered"] == 2
    names = sorted(p.name.split("-job-")[0] for p in tmp_path.glob("*-job-*.json"))
    assert names == ["features0", "features1", "features2", "sensitive0"]


def test_a_census_under_a_lifetime_budget_answers_the_confusion_counts_noised_and_charges_each(tmp_path) -> None:
    """Central-sensitive: the feature parties under no policy (their test predictions exact, as before), the census
    under a lifetime budget, whose default is to answer evaluations noised: every confusion query is answered with
    a Gaussian histogram (report noise_std = evaluation-noise, counts unlike the exact ones), charged to the census's
    lifetime ledger first at radius sqrt(2)/2 (counts alone), once per query; the run still reports its metrics. Under
    `evaluation = "refuse"` the run stops at setup, naming it."""
    import math

    from client import lifetime_ledger
    from server.engines import simulated_node_configs

    config = _config(topology="central-sensitive", rounds=2, **{"eval-every": 1})
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


def test_feature_parties_answering_noised_evaluate_by_the_censuss_randomized_groups(tmp_path) -> None:
    """Central-sensitive, the banks answering evaluations noised (their policy; SteFFLe sends a bank's own gradients
    in the clear, so no budget), the census under a lifetime budget: no per-record value leaves a party. The census
    answers the randomized response of its test records' groups, the same at every evaluation (permanent: a keyed
    hash of the id) and charged to its lifetime ledger once, also across two runs on its folder;
    each bank answers a Gaussian histogram by (source, randomized group, label, prediction) and its clipped loss,
    charged per evaluation; the server's metrics come from the debiased sum, near the exact run's; the exact
    evaluation leaves the privacy report's not_covered."""
    import math

    from client import lifetime_ledger
    from server.engines import simulated_node_configs

    config = _config(topology="central-sensitive", rounds=2, **{"eval-every": 1})
    banks, census_policy = tmp_path / "banks.toml", tmp_path / "census.toml"
    banks.write_text('evaluation = "noised"\n')  # SteFFLe releases a bank's own gradients in the clear: no budget
    census_policy.write_text("lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\n")
    state = tmp_path / "state"
    configs = simulated_node_configs(config, policy=str(banks), state_dir=str(state))
    configs[-1]["policy"] = str(census_policy)
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    result = run_federation(grid, config)
    exact, _ = _run(config)
    assert result["status"]["completed"]
    kinds = [m.metadata.message_type for m, _ in grid.log]
    assert pm.CONFUSION not in kinds and kinds.count(pm.TEST_GROUPS) == 2
    groups = [
        np.asarray(reply.content[pm.ROWS]["groups"].numpy())
        for sent, reply in grid.log
        if sent.metadata.message_type == pm.TEST_GROUPS
    ]
    assert np.array_equal(groups[0], groups[1])  # permanent
    for sent, reply in grid.log:
        if sent.metadata.message_type == msg.EVALUATE:
            assert set(reply.content.keys()) == {msg.COUNTS, msg.REPORT}  # no rows (ids, labels, predictions)
            assert msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT).noise_std == 20.0
    census = lifetime_ledger.load(state / "sensitive0")
    assert len(census.randomized_responses) == 1 and census.evaluations == {}
    [(p, k)] = census.randomized_responses.values()
    assert k == 2 and p == pytest.approx(2 / (math.e + 1))
    for bank in ("features0", "features1", "features2"):
        assert sum(lifetime_ledger.load(state / bank).evaluations.values()) == 2
    assert abs(result["final"]["accuracy"] - exact["final"]["accuracy"]) < 0.05
    assert "federated evaluation" not in result["privacy"]["not_covered"]
    assert result["privacy"]["evaluation"] == {"0": 20.0, "1": 20.0, "2": 20.0}
    second = run_federation(
        RecordingGrid(client_app, config.num_nodes, node_configs=configs),
        RunConfig.parse({**config.to_run_config(), "seed": 1}),
    )
    assert second["status"]["completed"]
    assert len(lifetime_ledger.load(state / "sensitive0").randomized_responses) == 1  # the same answers: no new charge


def test_forged_grouped_evaluations_and_repeated_test_group_queries(tmp_path) -> None:
    """A server forging the grouped evaluation: a bank answering noised refuses rows that miss one of its test
    records, repeat an id, or name a source or group out of range, and refuses to send its predictions one by one;
    the census answers a repeated test-groups query, whatever round it names, with the same groups and no new
    charge."""
    from client import lifetime_ledger
    from server.engines import simulated_node_configs

    config = _config(topology="central-sensitive", rounds=1)
    banks, census_policy = tmp_path / "banks.toml", tmp_path / "census.toml"
    banks.write_text('evaluation = "noised"\n')
    census_policy.write_text("lifetime-epsilon = 10.0\nlifetime-delta = 1e-5\n")
    configs = simulated_node_configs(config, policy=str(banks), state_dir=str(tmp_path / "state"))
    configs[-1]["policy"] = str(census_policy)
    grid = RecordingGrid(client_app, config.num_nodes, node_configs=configs)
    assert run_federation(grid, config)["status"]["completed"]
    evaluate = next(m for m, _ in grid.log if m.metadata.message_type == msg.EVALUATE)
    bank = grid.context(evaluate.metadata.dst_node_id)
    rows = {name: np.asarray(evaluate.content[pm.ROWS][name].numpy()) for name in ("ids", "groups", "sources")}

    def forged(**changes: np.ndarray) -> str:
        content = RecordDict(dict(evaluate.content.items()))
        content[pm.ROWS] = pm.int_record(**{**rows, **changes})
        reply = deliver(client_app, Message(content, 7, msg.EVALUATE), bank)
        assert reply.has_error()
        return reply.error.reason

    assert "have no row" in forged(**{k: v[1:] for k, v in rows.items()})
    repeated = rows["ids"].copy()
    repeated[1] = repeated[0]
    assert "appears twice" in forged(ids=repeated)
    assert "'rows.sources' must be in 0..0" in forged(sources=rows["sources"] + 1)
    assert "'rows.groups' must be in 0..1" in forged(groups=rows["groups"] + 2)
    one_by_one = RecordDict({msg.MODEL: evaluate.content[msg.MODEL], msg.CONFIG: evaluate.content[msg.CONFIG]})
    reply = deliver(client_app, Message(one_by_one, 7, msg.EVALUATE), bank)
    assert reply.has_error() and "one by one" in reply.error.reason

    query = next(m for m, _ in grid.log if m.metadata.message_type == pm.TEST_GROUPS)
    census = grid.context(query.metadata.dst_node_id)
    first = next(r for m, r in grid.log if m is query)
    for server_round in (1, 5, 99):
        content = RecordDict({msg.CONFIG: msg.EvaluateInstruction(server_round=server_round).to_config_record()})
        reply = deliver(client_app, Message(content, 7, pm.TEST_GROUPS), census)
        assert np.array_equal(reply.content[pm.ROWS]["groups"].numpy(), first.content[pm.ROWS]["groups"].numpy())
    assert len(lifetime_ledger.load(tmp_path / "state" / "sensitive0").randomized_responses) == 1
