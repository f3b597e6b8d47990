"""The lifetime ledger (`client.lifetime_ledger`): its figure against dp-accounting composing the same releases by
hand across two algorithms, its evaluations, its file, and `silofl silo budget` / `silofl run --silo-policy` the way
an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from silofl.client import lifetime_ledger, privacy_state
from silofl.protocols import messages as msg
from silofl.protocols.silo_policy import SiloPolicy
from tests import malicious_server as ms

N = 200
DELTA = 1e-6


def _node(tmp_path: Path, policy_text: str) -> ms.Node:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text)
    node = ms.Node(
        ms.make_silo(N, n_test=50), tmp_path / "silo", **{"state-dir": str(tmp_path / "state")}, policy=str(policy)
    )
    node.info = node.setup()
    return node


def _library_epsilon(parts: list[pld_lib.PrivacyLossDistribution]) -> float:
    total = parts[0]
    for part in parts[1:]:
        total = total.compose(part)
    return float(total.get_epsilon_for_delta(DELTA))


@pytest.mark.slow
def test_two_algorithms_compose_as_dp_accounting_composes_their_releases_by_hand(tmp_path: Path) -> None:
    """A DP-FedSGD job (Poisson-sampled Gaussians of clipped sums: REPLACE adjacency at its multiplier) and a
    DP-mu2-FL job (Gaussians whose sensitivity is the replacement distance itself) on one silo: the lifetime ledger's
    epsilon is the PLD of both runs composed, built here from the library's primitives."""
    node = _node(tmp_path, "lifetime-epsilon = 50\nlifetime-delta = 1e-6\n")
    params = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels)
    dp = ms.train("dp-fedsgd", params, server_round=1, total_rounds=6, batch_size=40, lr=0.1, epsilon=2.0, delta=1e-6)
    assert not node.send(msg.TRAIN, dp, 1).has_error()
    sigma_dp = float(node.context.state[privacy_state.STATE_KEY]["noise-multiplier"])
    node.context.state.clear()
    node.info = node.setup()
    x = ms.tabular_model("logreg", node.info.num_features, node.info.num_labels, dtype=np.float64)
    mu = ms.train(
        "mu2fl", x, records={msg.PREVIOUS: x}, server_round=1, total_rounds=5, batch_size=20, rho=1.0, delta=1e-6
    )
    assert not node.send(msg.TRAIN, mu, 1).has_error()
    sigma_mu = float(node.context.state[privacy_state.STATE_KEY]["noise-multiplier"])

    grid = 1e-4
    replace = NeighboringRelation.REPLACE_ONE
    dp_step = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma_dp,
        sampling_prob=40 / N,
        neighboring_relation=replace,
        value_discretization_interval=grid,
    )
    # q_t = t d_t moves by at most its sensitivity when a record is replaced: a Gaussian shifted by 1 at std sigma
    mu_step = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma_mu,
        sensitivity=1.0,
        value_discretization_interval=grid,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    by_hand = _library_epsilon([dp_step.self_compose(6), mu_step.self_compose(5)])
    ledger = lifetime_ledger.load(tmp_path / "state")
    assert [job.algorithm for job in ledger.jobs.values()] == ["dp-fedsgd", "mu2fl"]
    figure = lifetime_ledger.epsilon_of(ledger.training_state(), DELTA)
    assert figure == pytest.approx(by_hand, rel=2e-3)
    alone = [lifetime_ledger.epsilon_of(job.events, DELTA) for job in ledger.jobs.values()]
    assert figure > max(alone) and figure < sum(alone)  # composed, not added


def test_evaluations_compose_into_one_gaussian_as_the_library_composes_them() -> None:
    """k noised evaluations at multipliers m_i are one Gaussian of (sum 1/m_i^2)^(-1/2): the figure equals the
    library's self-composition of each under REPLACE."""
    ledger = lifetime_ledger.LifetimeLedger(evaluations={20.0: 7, 35.0: 3})
    (state,) = ledger.evaluation_state()
    assert state[0] == pytest.approx((7 / 400 + 3 / 1225) ** -0.5) and state[1:] == (1.0, 1)
    parts = [
        pld_lib.from_gaussian_mechanism(
            standard_deviation=m,
            neighboring_relation=NeighboringRelation.REPLACE_ONE,
            value_discretization_interval=1e-4,
        ).self_compose(k)
        for m, k in ((20.0, 7), (35.0, 3))
    ]
    assert lifetime_ledger.epsilon_of(ledger.evaluation_state(), DELTA) == pytest.approx(
        _library_epsilon(parts), rel=2e-3
    )


def test_randomized_responses_an_earlier_version_recorded_still_count_against_evaluations(tmp_path: Path) -> None:
    """Versions before the sealed record exchange charged a sensitive party's randomized response of its test groups
    (k-ary, eps-DP at noise parameter p = k / (e^eps + k - 1)). silofl no longer makes one, but a ledger holding one
    keeps composing it with the noised evaluations (replace one, as dp-accounting's PLD accountant composes the same
    events by hand), and an evaluation that it pushes past lifetime-epsilon is refused, charging nothing."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from silofl.client import noised_evaluation

    k, eps = 2, 1.5
    p = k / (np.exp(eps) + k - 1)
    old = lifetime_ledger.LifetimeLedger(randomized_responses={"f1": (p, k)})
    lifetime_ledger.path_of(tmp_path).write_text(json.dumps(old.to_json()))
    policy = SiloPolicy.model_validate({"lifetime-epsilon": 3.2, "lifetime-delta": DELTA})
    multiplier = noised_evaluation.evaluation_multiplier(policy)
    after = lifetime_ledger.charge_evaluation(
        tmp_path, policy, multiplier=multiplier, run_id=1, server_round=1, who="x"
    )
    by_hand = pld_privacy_accountant.PLDAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    by_hand.compose(dp_event.GaussianDpEvent(multiplier))
    by_hand.compose(dp_event.RandomizedResponseDpEvent(p, k))
    assert after == pytest.approx(by_hand.get_epsilon(DELTA), rel=1e-3)
    assert after > eps  # the response counts: an evaluation alone is far below it
    ledger = lifetime_ledger.load(tmp_path)
    assert ledger.randomized_responses == {"f1": (p, k)} and sum(ledger.evaluations.values()) == 1
    rounds = 1
    with pytest.raises(msg.MessageError, match=r"lifetime-epsilon = 3\.2"):
        while True:  # the budget ends sooner than it would without the response
            rounds += 1
            lifetime_ledger.charge_evaluation(
                tmp_path, policy, multiplier=multiplier, run_id=1, server_round=rounds, who="x"
            )
    assert sum(lifetime_ledger.load(tmp_path).evaluations.values()) == rounds - 1
    without = lifetime_ledger.LifetimeLedger(evaluations={multiplier: rounds})
    assert without.evaluation_epsilon(DELTA) <= 3.2  # the refused evaluation fit the budget without the response


def test_a_damaged_lifetime_ledger_is_refused_not_reset(tmp_path: Path) -> None:
    lifetime_ledger.path_of(tmp_path).write_text("{not json")
    with pytest.raises(msg.MessageError, match="unreadable") as error:
        lifetime_ledger.load(tmp_path)
    assert "deleting it forgets every job" in str(error.value)


def test_a_job_readmitted_with_another_plan_is_refused(tmp_path: Path) -> None:
    policy = SiloPolicy.model_validate({"lifetime-epsilon": 10, "lifetime-delta": DELTA})
    job = lifetime_ledger.JobRecord("silo0-job-x", "dp-fedsgd", "silo", 0, 1.0, DELTA, True, ((2.0, 0.1, 10),))
    lifetime_ledger.admit_job(tmp_path, job, policy, who="silo 0")
    lifetime_ledger.admit_job(tmp_path, job, policy, who="silo 0")  # the same job again (a resumed run): admitted
    changed = lifetime_ledger.JobRecord("silo0-job-x", "dp-fedsgd", "silo", 0, 1.0, DELTA, True, ((1.0, 0.1, 10),))
    with pytest.raises(msg.MessageError, match="another planned run"):
        lifetime_ledger.admit_job(tmp_path, changed, policy, who="silo 0")
    data = json.loads(lifetime_ledger.path_of(tmp_path).read_text())
    assert list(data["jobs"]) == ["silo0-job-x"] and data["budget"] == {"lifetime-epsilon": 10, "lifetime-delta": DELTA}
    assert oct(lifetime_ledger.path_of(tmp_path).stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_silofl_run_under_a_silo_policy_and_silofl_silo_budget(tmp_path: Path, capsys) -> None:
    """The operator's path: two `silofl run` jobs (progress bar on) on one --silo-state folder under a policy; the
    second run past the lifetime budget stops before any silo releases anything; `silofl silo budget` prints each
    job, its rounds and epsilon, and what is left; result.json no longer lists the evaluation as not covered."""
    from silofl.server.cli import main

    policy = tmp_path / "policy.toml"
    policy.write_text("lifetime-epsilon = 3.0\nlifetime-delta = 1e-6\nmax-epsilon-per-job = 2.0\n")
    state = tmp_path / "state"
    flags = [
        "--dataset",
        "synthetic",
        "--silos",
        "2",
        "--rounds",
        "5",
        "--epsilon",
        "2",
        "--silo-policy",
        str(policy),
        "--silo-state",
        str(state),
    ]
    assert main(["run", "dp-fedsgd", *flags, "--out", str(tmp_path / "one")]) == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "one" / "result.json").read_text())
    assert "federated evaluation" not in result["privacy"]["not_covered"]
    assert result["privacy"]["evaluation"] == {"0": 20.0, "1": 20.0}
    assert main(["run", "dp-fedsgd", *flags, "--seed", "2", "--out", str(tmp_path / "two")]) == 0
    capsys.readouterr()
    code = main(["run", "dp-fedsgd", *flags, "--seed", "3", "--out", str(tmp_path / "three")])
    err = capsys.readouterr().err
    assert code == 1 and "lifetime-epsilon = 3" in err and "refuses the job before releasing anything" in err
    assert main(["silo", "budget", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert out.count("dp-fedsgd") == 4 and "1..5" in out and "budget 3, left" in out
    for folder in ("silo0", "silo1"):
        ledger = lifetime_ledger.load(state / folder)
        assert len(ledger.jobs) == 2 and sum(ledger.evaluations.values()) == 2 * 5
        assert lifetime_ledger.epsilon_of(ledger.training_state(), DELTA) <= 3.0


def test_silofl_run_checks_the_policy_before_anything_runs(tmp_path: Path, capsys) -> None:
    from silofl.server.cli import main

    bad = tmp_path / "policy.toml"
    bad.write_text("lifetime-epsilon = 2\n")
    code = main(["run", "fedavg", "--rounds", "1", "--silo-policy", str(bad), "--silo-state", str(tmp_path / "s")])
    assert code == 2 and "lifetime-epsilon needs lifetime-delta" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    code = main(["run", "fedavg", "--rounds", "1", "--silo-policy", str(bad)])
    assert code == 2 and "--silo-policy needs --silo-state" in capsys.readouterr().err


def test_evaluations_compose_in_parallel_with_the_jobs(tmp_path: Path) -> None:
    """The test split's records are not the training records: a silo whose jobs used most of its lifetime budget can
    still answer evaluations up to the same budget (each composition alone within it), where composing the two in
    sequence would refuse them."""
    policy = SiloPolicy.model_validate({"lifetime-epsilon": 2.0, "lifetime-delta": DELTA})
    job = lifetime_ledger.JobRecord("silo0-job-a", "dp-fedsgd", "silo", 0, 1.0, DELTA, True, ((2.5, 0.25, 4),))
    training = lifetime_ledger.admit_job(tmp_path, job, policy, who="silo 0")
    assert 1.5 < training <= 2.0
    answered = 0
    while answered < 50:
        try:
            lifetime_ledger.charge_evaluation(
                tmp_path, policy, multiplier=23.0, run_id=1, server_round=answered, who="silo 0"
            )
        except msg.MessageError:
            break
        answered += 1
    ledger = lifetime_ledger.load(tmp_path)
    evaluations = lifetime_ledger.epsilon_of(ledger.evaluation_state(), DELTA)
    assert answered >= 3 and 1.0 < evaluations <= 2.0
    sequential = lifetime_ledger.epsilon_of(ledger.training_state() + ledger.evaluation_state(), DELTA)
    assert sequential > 2.0  # in sequence the same releases would be over the budget


@pytest.mark.slow
def test_silofl_run_on_ray_under_a_silo_policy_meets_the_same_ledgers(tmp_path: Path, capsys) -> None:
    """`silofl run --engine ray --silo-policy FILE --silo-state DIR`: Flower's Ray simulation gives a node only its
    partition id, so each simulated silo gets its policy and its own folder under DIR through it; the run equals the
    in-process one under the same policy (model, the job charged to each lifetime ledger), and later in-process runs
    on the same DIR meet the ledgers the Ray run charged: the third job past the lifetime budget is refused."""
    from silofl.server.cli import main

    policy = tmp_path / "policy.toml"
    policy.write_text("lifetime-epsilon = 3.0\nlifetime-delta = 1e-6\nmax-epsilon-per-job = 2.0\n")
    base = ["--dataset", "synthetic", "--silos", "2", "--rounds", "5", "--epsilon", "2", "--silo-policy", str(policy)]
    ray_state, local_state = tmp_path / "ray-state", tmp_path / "local-state"
    argv = ["run", "dp-fedsgd", *base, "--silo-state", str(ray_state), "--engine", "ray", "--out", str(tmp_path / "r")]
    assert main(argv) == 0, capsys.readouterr().err
    argv = ["run", "dp-fedsgd", *base, "--silo-state", str(local_state), "--out", str(tmp_path / "l")]
    assert main(argv) == 0, capsys.readouterr().err
    ray, local = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("r", "l"))
    assert ray["engine"] == "ray" and ray["model"] == local["model"]
    assert ray["privacy"]["evaluation"] == {"0": 20.0, "1": 20.0}
    for folder in ("silo0", "silo1"):
        on_ray, in_process = lifetime_ledger.load(ray_state / folder), lifetime_ledger.load(local_state / folder)
        assert len(on_ray.jobs) == 1 and on_ray.jobs.keys() == in_process.jobs.keys()
        assert lifetime_ledger.epsilon_of(on_ray.training_state(), DELTA) == pytest.approx(
            lifetime_ledger.epsilon_of(in_process.training_state(), DELTA)
        )
    again = ["run", "dp-fedsgd", *base, "--silo-state", str(ray_state)]
    assert main([*again, "--seed", "2", "--out", str(tmp_path / "two")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main([*again, "--seed", "3", "--out", str(tmp_path / "three")]) == 1
    assert "refuses the job before releasing anything" in capsys.readouterr().err


def test_a_silo_that_refuses_evaluations_stops_the_run_at_setup(tmp_path: Path, capsys) -> None:
    """Every run evaluates (every eval-every rounds and after the last): silos whose policy says
    `evaluation = "refuse"` stop it at the setup round, naming them, before any job is admitted or any round
    released, not after the training at the first evaluation."""
    from silofl.server.cli import main

    policy = tmp_path / "policy.toml"
    policy.write_text('lifetime-epsilon = 3.0\nlifetime-delta = 1e-6\nevaluation = "refuse"\n')
    state = tmp_path / "state"
    argv = [
        "run",
        "dp-fedsgd",
        "--rounds",
        "2",
        "--silos",
        "2",
        "--silo-policy",
        str(policy),
        "--silo-state",
        str(state),
    ]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "setup round: silo 0 (node" in err and "(evaluation = 'refuse')" in err and "silo 1 (node" in err
    for folder in ("silo0", "silo1"):
        assert lifetime_ledger.load(state / folder).jobs == {}
        assert not list((state / folder).glob("silo*-job-*.json"))
