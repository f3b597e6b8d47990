"""The operator's policy against a server that names the job (issue 30), on real messages through the ClientApp.

Each gap of the issue as an attack: a new job past the lifetime budget, a delta above the policy, an algorithm the
policy does not answer (FedAvg's un-noised weights from a budgeted silo), repeated evaluations, a job resubmitted after
a fault; and the policy file's own validation. Nodes are deployed silos on their own folders (`tests.malicious_server`),
with a state folder and a policy file.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from silofl.client import lifetime_ledger
from silofl.protocols import messages as msg
from silofl.protocols.silo_policy import PolicyError, SiloPolicy, load_policy, parse_policy
from tests import malicious_server as ms

N = 200
FIELDS = {"total_rounds": 4, "batch_size": 50, "lr": 0.1, "delta": 1e-6}


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def _node(tmp_path: Path, policy: Path | None, name: str = "silo", **config) -> ms.Node:
    extra = {"state-dir": str(tmp_path / f"{name}.state"), **config}
    if policy is not None:
        extra["policy"] = str(policy)
    node = ms.Node(ms.make_silo(N, n_test=400), tmp_path / name, **extra)
    node.info = node.setup()
    return node


def _dp_fedsgd(node: ms.Node, server_round: int, **values) -> object:
    params = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels)
    content = ms.train("dp-fedsgd", params, server_round=server_round, **{**FIELDS, **values})
    return node.send(msg.TRAIN, content, server_round)


def _evaluate(node: ms.Node, server_round: int) -> object:
    params = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels)
    instr = msg.EvaluateInstruction(server_round=server_round, model="logreg").to_config_record()
    content = RecordDict({msg.MODEL: msg.arrays_record(params), msg.CONFIG: instr})
    return node.send(msg.EVALUATE, content, server_round)


def _run(node: ms.Node, seed: int, rounds: int = 4, **values) -> list[object]:
    return [_dp_fedsgd(node, t, seed=seed, **values) for t in range(1, rounds + 1)]


# -- the policy file ------------------------------------------------------------------------------------------------


def test_a_policy_file_is_read_with_its_defaults(tmp_path: Path) -> None:
    policy = load_policy(_policy(tmp_path, 'lifetime-epsilon = 4\nlifetime-delta = 1e-6\nalgorithms = ["DP-FedSGD"]\n'))
    assert policy.lifetime_epsilon == 4 and math.isinf(policy.job_epsilon_cap) and policy.has_budget
    assert policy.algorithms == ("dp-fedsgd",)  # registry names, aliases resolved
    assert policy.evaluation_mode() == "noised" and policy.max_delta_for(1000) == pytest.approx(1e-3)
    assert not policy.allows("fedavg", "silo") and policy.allows("dp-fedsgd", "silo")
    unbudgeted = SiloPolicy()
    assert unbudgeted.evaluation_mode() == "exact" and unbudgeted.max_delta_for(10) is None
    assert unbudgeted.allows("fedavg", "silo")


def test_with_a_budget_the_default_algorithms_are_those_noised_for_the_nodes_data() -> None:
    policy = SiloPolicy.model_validate({"max-epsilon-per-job": 1.0})
    assert set(policy.allowed_algorithms("silo")) == {"dp-fedsgd", "fedfdp", "mu2fl", "noisy-sgd"}
    assert policy.allowed_algorithms("sensitive") == ["steffle"]  # all a sensitive party holds is noised
    assert policy.allowed_algorithms("features") == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("lifetime-epsilon = 2\n", "lifetime-epsilon needs lifetime-delta"),
        ("lifetime-epsilon = -1\nlifetime-delta = 1e-6\n", "'lifetime-epsilon'"),
        ("max-delta = 2\n", "'max-delta'"),
        ('algorithms = ["fedsgd-typo"]\n', "'algorithms"),
        ('evaluation = "sometimes"\n', "'evaluation'"),
        ("lifetime-epsilon = 1\nlifetime-delta = 1e-6\nbudget = 3\n", "unknown key 'budget'"),
        ("evaluation-groups-epsilon = 1.0\n", "'evaluation-groups-epsilon' is no longer read"),
        ("lifetime-epsilon = \n", "not valid TOML"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = _policy(tmp_path, text)
    with pytest.raises(PolicyError, match="silo policy") as error:
        load_policy(path)
    assert needle in str(error.value) and str(path) in str(error.value)


def test_parse_policy_names_every_bad_key() -> None:
    with pytest.raises(PolicyError) as error:
        parse_policy({"max-delta": 5, "evaluation-noise": 0}, source="test")
    assert "'max-delta'" in str(error.value) and "'evaluation-noise'" in str(error.value)


# -- attacks --------------------------------------------------------------------------------------------------------


def test_a_budgeted_silo_refuses_fedavg_where_it_used_to_send_its_weights_un_noised(tmp_path: Path) -> None:
    """The issue: "a silo with a budget still answers fedavg with un-noised weights" (epsilon-budget = 1)."""
    node = _node(tmp_path, None, **{"epsilon-budget": 1.0})
    info = node.info
    params = ms.tabular_model("logreg", info.num_features, info.num_labels)
    content = ms.train("fedavg", params, server_round=1, total_rounds=2, batch_size=50, lr=0.1)
    reply = node.send(msg.TRAIN, content, 1)
    reason = ms.error_reason(reply)
    assert "'fedavg'" in reason and "refuses" in reason and "dp-fedsgd" in reason
    without = _node(tmp_path, None, "free")  # no policy: a silo answers as it always did
    assert not without.send(msg.TRAIN, ms.train("fedavg", params, server_round=1, total_rounds=2), 1).has_error()


def test_an_algorithm_outside_the_listed_ones_is_refused(tmp_path: Path) -> None:
    node = _node(tmp_path, _policy(tmp_path, 'algorithms = ["mu2fl"]\n'))
    reason = ms.error_reason(_dp_fedsgd(node, 1, seed=0))
    assert "'dp-fedsgd'" in reason and "algorithms = ['mu2fl']" in reason


def test_a_delta_above_the_policy_is_refused_before_anything_is_charged(tmp_path: Path) -> None:
    """delta = 0.5 used to be accepted (a multiplier of about 1 instead of about 8 at 1e-9)."""
    node = _node(tmp_path, _policy(tmp_path, "max-epsilon-per-job = 1\n"))
    reason = ms.error_reason(_dp_fedsgd(node, 1, seed=0, delta=0.5, epsilon=1.0))
    assert "delta = 0.5" in reason and "max-delta (default 1/n_j" in reason and f"{1 / N:g}" in reason
    assert not lifetime_ledger.path_of(tmp_path / "silo.state").exists()  # nothing admitted, nothing charged
    explicit = _node(tmp_path, _policy(tmp_path, "max-delta = 1e-7\n"), "explicit")
    assert "max-delta = 1e-07" in ms.error_reason(_dp_fedsgd(explicit, 1, seed=0, delta=1e-6))


@pytest.mark.slow
def test_a_new_job_past_the_lifetime_budget_is_refused_before_it_releases_anything(tmp_path: Path) -> None:
    """A new seed used to get a fresh ledger: epsilon 1 spent again, and again."""
    # one such job costs 1.60 under replacing one record, two 2.30 (PLD at delta 1e-6)
    node = _node(tmp_path, _policy(tmp_path, "lifetime-epsilon = 2\nlifetime-delta = 1e-6\n"))
    first = _run(node, seed=1, epsilon=1.0)
    assert all(not reply.has_error() for reply in first)
    node.context.state.clear()  # a new Flower run (the server submits another job)
    node.info = node.setup()
    second = _dp_fedsgd(node, 1, seed=2, epsilon=1.0)
    reason = ms.error_reason(second)
    assert "lifetime-epsilon = 2" in reason and "refuses the job before releasing anything" in reason
    assert "spent 1.603 over 1 earlier job" in reason and "to 2.301" in reason
    ledger = lifetime_ledger.load(tmp_path / "silo.state")
    assert len(ledger.jobs) == 1  # the refused job reserved nothing
    node.context.state.clear()
    node.info = node.setup()
    small = _run(node, seed=3, epsilon=0.2)  # a job that fits what is left is answered
    assert all(not reply.has_error() for reply in small)
    assert len(lifetime_ledger.load(tmp_path / "silo.state").jobs) == 2


def test_a_job_asking_for_more_than_the_per_job_cap_is_calibrated_for_the_cap(tmp_path: Path) -> None:
    node = _node(tmp_path, _policy(tmp_path, "max-epsilon-per-job = 0.5\n"))
    reports = [msg.read_config(r.content, msg.TrainReport, record=msg.REPORT) for r in _run(node, 0, epsilon=8.0)]
    assert reports[-1].epsilon_spent <= 0.5 * (1 + 1e-9)
    (job,) = lifetime_ledger.load(tmp_path / "silo.state").jobs.values()
    assert job.epsilon == 0.5 and job.algorithm == "dp-fedsgd" and job.covers_all_data


def test_an_infinite_epsilon_is_never_answered_un_noised_by_a_budgeted_silo(tmp_path: Path) -> None:
    lifetime = _node(tmp_path, _policy(tmp_path, "lifetime-epsilon = 3\nlifetime-delta = 1e-6\n"), "lifetime")
    assert "asks for no noise (epsilon = inf)" in ms.error_reason(_dp_fedsgd(lifetime, 1, seed=0, epsilon=math.inf))
    capped = _node(tmp_path, _policy(tmp_path, "max-epsilon-per-job = 1\n"), "capped")
    report = msg.read_config(_run(capped, 0, epsilon=math.inf)[0].content, msg.TrainReport, record=msg.REPORT)
    assert report.noise_multiplier > 0 and report.epsilon_spent <= 1.0


def test_a_lifetime_budget_needs_a_state_folder(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "lifetime-epsilon = 1\nlifetime-delta = 1e-6\n")
    node = ms.Node(ms.make_silo(N), tmp_path / "silo", policy=str(policy))
    node.info = node.setup()
    assert "no state folder" in ms.error_reason(_dp_fedsgd(node, 1, seed=0))


def test_repeated_evaluations_are_noised_charged_and_refused_past_the_lifetime_budget(tmp_path: Path) -> None:
    """Evaluations used to be exact confusion counts, answered as often as asked, for any model."""
    node = _node(tmp_path, _policy(tmp_path, "lifetime-epsilon = 1\nlifetime-delta = 1e-6\nevaluation-noise = 20\n"))
    answered = 0
    for t in range(1, 200):
        reply = _evaluate(node, t)
        if reply.has_error():
            reason = ms.error_reason(reply)
            assert "lifetime-epsilon = 1" in reason and "refuses to evaluate" in reason
            break
        answered += 1
        report = msg.read_config(reply.content, msg.EvaluateReport, record=msg.REPORT)
        counts = reply.content[msg.COUNTS]["counts"].numpy()
        assert report.noise_std == 20.0 and counts.dtype == np.int64 and (counts >= 0).all()
    else:
        pytest.fail("a silo answered 199 evaluations within a lifetime epsilon of 1")
    ledger = lifetime_ledger.load(tmp_path / "silo.state")
    assert sum(ledger.evaluations.values()) == answered >= 1
    # what it answered composes to at most the budget; one more would exceed it
    after = lifetime_ledger.epsilon_of(ledger.evaluation_state(), 1e-6)
    assert after <= 1.0 < lifetime_ledger.epsilon_of(ledger.evaluation_state(((20.0 / (3**0.5 / 2), 1.0, 1),)), 1e-6)


def test_noised_counts_carry_the_noise_the_report_names(tmp_path: Path) -> None:
    """The same model on the same test split: the noised counts minus the exact ones are Gaussian noise of the
    policy's std (a silo does not merely claim it), and the noised counts no longer sum to the split's size."""
    exact = _node(tmp_path, _policy(tmp_path, 'evaluation = "exact"\n'), "exact")
    truth = _evaluate(exact, 1).content[msg.COUNTS]["counts"].numpy()
    assert int(truth.sum()) == exact.info.n_test
    noised = _node(tmp_path, _policy(tmp_path, 'evaluation = "noised"\nevaluation-noise = 3\n'), "noised")
    differences = []
    for t in range(1, 41):
        reply = _evaluate(noised, t)
        counts = reply.content[msg.COUNTS]["counts"].numpy()
        differences.append((counts - truth)[truth >= 12])  # cells far from the clipping at 0
    spread = np.concatenate(differences).astype(float)
    assert abs(spread.mean()) < 0.5 and 2.4 < spread.std() < 3.6
    assert sum(lifetime_ledger.load(tmp_path / "noised.state").evaluations.values()) == 40


def test_a_policy_that_refuses_evaluations_refuses_them(tmp_path: Path) -> None:
    node = _node(tmp_path, _policy(tmp_path, 'evaluation = "refuse"\n'))
    assert 'evaluation = "refuse"' in ms.error_reason(_evaluate(node, 1))


def test_a_job_resubmitted_after_a_fault_is_charged_never_free(tmp_path: Path) -> None:
    """A run that failed at round 2, submitted again: with the same seed its rounds are refused as already answered
    (or replayed byte for byte), with another seed it is another job, reserved on top of the first."""
    policy = _policy(tmp_path, "lifetime-epsilon = 5\nlifetime-delta = 1e-6\n")
    node = _node(tmp_path, policy)
    assert all(not r.has_error() for r in _run(node, seed=1, rounds=2, epsilon=1.0))
    node.context.state.clear()  # the SuperNode restarts, the server submits the job again from round 1
    node.info = node.setup()
    again = _dp_fedsgd(node, 1, seed=1, epsilon=1.0)
    assert again.has_error() and "already" in ms.error_reason(again)
    node.context.state.clear()
    node.info = node.setup()
    assert all(not r.has_error() for r in _run(node, seed=2, rounds=2, epsilon=1.0))
    ledger = lifetime_ledger.load(tmp_path / "silo.state")
    assert len(ledger.jobs) == 2
    one = lifetime_ledger.epsilon_of(next(iter(ledger.jobs.values())).events, 1e-6)
    assert lifetime_ledger.epsilon_of(ledger.training_state(), 1e-6) > one * 1.2  # both jobs composed


def test_a_trusted_server_needs_the_policys_consent_and_no_lifetime_budget(tmp_path: Path) -> None:
    node = _node(tmp_path, _policy(tmp_path, "max-epsilon-per-job = 1\n"))
    info = node.info
    params = ms.tabular_model("logreg", info.num_features, info.num_labels, dtype=np.float64)
    content = ms.train(
        "mu2fl", params, records={msg.PREVIOUS: params}, server_round=1, total_rounds=2, batch_size=10, trust="trusted"
    )
    assert "allow-trusted-server" in ms.error_reason(node.send(msg.TRAIN, content, 1))
    budgeted = _node(
        tmp_path,
        _policy(tmp_path, "lifetime-epsilon = 1\nlifetime-delta = 1e-6\nallow-trusted-server = true\n"),
        "budgeted",
    )
    assert "no lifetime ledger can hold" in ms.error_reason(budgeted.send(msg.TRAIN, content, 1))


def test_a_job_whose_state_predates_lifetime_ledgers_is_admitted_before_its_next_release(tmp_path: Path) -> None:
    """A job file written before lifetime ledgers (no admission mark, no lifetime ledger): the silo, now under a
    lifetime budget, admits the job with the calibration it holds before answering its next round."""
    from silofl.client import privacy_state
    from silofl.client.round_privacy import ADMITTED_KEY

    node = _node(tmp_path, None)
    assert not _dp_fedsgd(node, 1, seed=0, epsilon=1.0).has_error()
    del node.context.state[privacy_state.STATE_KEY][ADMITTED_KEY]
    lifetime_ledger.path_of(tmp_path / "silo.state").unlink()
    policy = _policy(tmp_path, "lifetime-epsilon = 1.2\nlifetime-delta = 1e-6\n")
    node.context.node_config["policy"] = str(policy)
    reason = ms.error_reason(_dp_fedsgd(node, 2, seed=0, epsilon=1.0))  # 1.60 under replace-one: over 1.2
    assert "lifetime-epsilon = 1.2" in reason and "spent 0 over 0 earlier job" in reason
    policy.write_text("lifetime-epsilon = 2\nlifetime-delta = 1e-6\n")
    assert not _dp_fedsgd(node, 2, seed=0, epsilon=1.0).has_error()
    assert len(lifetime_ledger.load(tmp_path / "silo.state").jobs) == 1
    assert node.context.state[privacy_state.STATE_KEY][ADMITTED_KEY] == 1


def test_silofl_silo_start_checks_the_policy_and_keeps_state_by_default(tmp_path: Path, capsys) -> None:
    """`silofl silo start --policy FILE`: a bad policy stops the node before the SuperNode exists, naming the key; a
    good one goes into the node config with its absolute path, next to the default state folder DATA.state."""
    from silofl.client.data.silo_store import save_silo
    from silofl.server.cli import main

    data = tmp_path / "silo_0"
    save_silo(ms.make_silo(N), data)
    start = ["silo", "start", "--data", str(data), "--superlink", "127.0.0.1:9092", "--insecure", "--dry-run"]
    bad = _policy(tmp_path, "max-delta = 3\n")
    assert main([*start, "--policy", str(bad)]) == 2
    assert "'max-delta'" in capsys.readouterr().err
    good = _policy(tmp_path, "lifetime-epsilon = 4\nlifetime-delta = 1e-6\n")
    assert main([*start, "--policy", str(good)]) == 0
    command = shlex.split(capsys.readouterr().out.strip())
    node_config = command[command.index("--node-config") + 1]
    assert f"policy='{good.resolve()}'" in node_config and f"state-dir='{data.resolve()}.state'" in node_config
    assert (tmp_path / "silo_0.state").is_dir()
    assert oct((tmp_path / "silo_0.state").stat().st_mode & 0o777) == "0o700"


def test_un_noised_jobs_are_kept_in_the_lifetime_ledger_and_refused_under_a_lifetime_budget(tmp_path: Path) -> None:
    """A silo counts everything it ever released: a FedAvg job answered without a policy is in its lifetime ledger,
    un-noised (epsilon unbounded), so a lifetime budget set later refuses every new job; and a lifetime budget
    refuses FedAvg even when the operator lists it."""
    node = _node(tmp_path, None)
    params = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels)
    fedavg = ms.train("fedavg", params, server_round=1, total_rounds=2, batch_size=50, lr=0.1)
    assert not node.send(msg.TRAIN, fedavg, 1).has_error()
    (job,) = lifetime_ledger.load(tmp_path / "silo.state").jobs.values()
    assert job.algorithm == "fedavg" and math.isinf(job.epsilon) and not job.covers_all_data
    node.context.state.clear()
    node.context.node_config["policy"] = str(_policy(tmp_path, "lifetime-epsilon = 5\nlifetime-delta = 1e-6\n"))
    node.info = node.setup()
    reason = ms.error_reason(_dp_fedsgd(node, 1, seed=0, epsilon=1.0))
    assert "would bring the total to inf" in reason
    listed = _node(
        tmp_path,
        _policy(tmp_path, 'lifetime-epsilon = 5\nlifetime-delta = 1e-6\nalgorithms = ["fedavg"]\n'),
        "listed",
    )
    assert "no lifetime budget can hold" in ms.error_reason(listed.send(msg.TRAIN, fedavg, 1))
