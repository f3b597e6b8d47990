"""Whole-record privacy for SteFFLe and Tran et al. (`protect = record`, issue 34), on the real outgoing messages.

Under `protect = record` neighbours differ by one whole record (x, s, y) added or removed, so every release of a silo
must be a noised sum of per-record terms in bounded balls, the loss gradient included (DP-FERMI Theorem D.2, second
part). The tests send real messages to deployed silos through the ClientApp (`tests.malicious_server`) and check:

* with no noise (epsilon = inf, the test seam) every release is its clipped sum over the round's one sample divided by
  the public batch size m, computed here from the records themselves;
* on neighbouring silos (one record added, or one record's features, label and attribute replaced), with the same
  seeded noise, each release moves only by that record's own clipped term (at most C / m, C / m, and its own W term),
  and nothing that is not noised differs at all; in the default mode the loss gradient does (what the mode fixes);
* the noise on the loss gradient has the std the report's multiplier says;
* the epsilon a silo reports is dp-accounting's over the events it ran (the histogram's Gaussian, then T
  Poisson-subsampled Gaussians of the four releases at one multiplier);
* what a malicious server could make a silo do: a policy `protect = "record"` refuses a job asking for less (and one
  without noise), a job cannot switch mode mid-run, shuffled epochs and separate parties are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch

from silofl.client import lifetime_ledger, privacy_state
from silofl.client.gradients import clipped_gradient_sum
from silofl.client.rounds import steffle as steffle_round
from silofl.client.rounds import tran as tran_round
from silofl.client.silo_policy import node_policy
from silofl.protocols import messages as msg
from silofl.protocols.algorithms import steffle as steffle_entry
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.models import build_model, set_parameters
from silofl.protocols.steffle import (
    GroupPrior,
    clipped_psi_theta_sum,
    output_block_sums_checked,
    psi_w_sensitive_sum_checked,
    w_output_term,
)
from tests import malicious_server as ms

N = 60
M = 64  # the batch size: m >= n + 1, so q = 1 and every record is in the round's one sample
CLIP = 1.0
FAIR = {"w": np.array([[0.5, -0.5], [-0.5, 0.5]], np.float32), "prior": np.array([0.5, 0.5], np.float32)}
TRAN_FAIR = {"multipliers": np.array([[0.0, 1.0], [0.0, -1.0]], np.float32), "prior": FAIR["prior"]}
VALUES = {"total_rounds": 3, "lr": 0.1, "delta": 1e-6, "clip": CLIP, "batch_size": M, "protect": "record"}
#: Every record a whole-record silo sends that depends on its data is noised: these may differ between neighbours.
NOISED = frozenset({msg.UPDATE, msg.FAIR_UPDATE, msg.COUNTS})


def _params(features: int = 4) -> dict[str, np.ndarray]:
    params = ms.tabular_model("logreg", features, 2)  # the binary head: one logit
    params["head.weight"][:] = np.resize(np.array([0.3, -0.2, 0.1, 0.4], np.float32), (1, features))
    params["head.bias"][:] = 0.1
    return params


def _silo(n: int = N, features: int = 4):
    return ms.make_silo(n, low=-2.0, high=2.0, num_features=features)


def _train(algorithm: str, features: int = 4, **values) -> object:
    fair = TRAN_FAIR if algorithm == "tran" else FAIR
    return ms.train(algorithm, _params(features), records={msg.FAIRNESS: fair}, **values)


def _start(node_or_twins, algorithm: str = "steffle", **values) -> None:
    """The setup release (the group counts), which every job answers first."""
    replies = node_or_twins.send(msg.GROUPS, ms.groups(algorithm, **{**VALUES, **values}), 0)
    for reply in replies if isinstance(replies, tuple) else (replies,):
        assert not reply.has_error(), reply.error.reason


def _flat(arrays: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([arrays[name].astype(np.float64).ravel() for name in names])


PARAM_NAMES = ["head.weight", "head.bias"]


def _releases(x: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a whole-record round releases without noise for the records (x, y, s) at the test's model, W and prior,
    computed here from `protocols`' maths: the clipped loss and theta sums / m and the W-gradient."""
    model = build_model("logreg", 4, 2)
    set_parameters(model, _params())
    x, y, s = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(s)
    w = torch.from_numpy(FAIR["w"])
    prior = GroupPrior("dp", FAIR["prior"].astype(np.float64), num_labels=2)
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1)
    w_gradient = w_output_term(w, output_block_sums_checked(probs, prior, labels=y) / M, prior)
    return (
        clipped_gradient_sum(model, x, y, CLIP) / M,
        clipped_psi_theta_sum(model, x, s, w, prior, CLIP, labels=y) / M,
        w_gradient + psi_w_sensitive_sum_checked(probs, s, prior, labels=y) / M,
    )


# -- the seam: no noise, every release is its clipped sum / m --------------------------------------------------------
def test_without_noise_every_release_is_its_clipped_sum_over_the_public_batch_size(tmp_path: Path) -> None:
    silo = _silo()
    node = ms.Node(silo, tmp_path / "silo")
    node.setup()
    _start(node)  # epsilon = inf: no noise
    reply = node.send(msg.TRAIN, _train("steffle", server_round=1, **VALUES), 1)
    update, fair = ms.arrays_of(reply, msg.UPDATE), ms.arrays_of(reply, msg.FAIR_UPDATE)

    train = silo.train
    loss, theta, w_gradient = _releases(train.nonsensitive.features, train.nonsensitive.labels, train.sensitive.groups)
    np.testing.assert_allclose(_flat(update, PARAM_NAMES), loss.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(_flat(fair, PARAM_NAMES), theta.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fair["w"], w_gradient.numpy(), rtol=1e-5, atol=1e-7)


# -- neighbours: each release moves by the record's own clipped term only -------------------------------------------
def _canary() -> tuple[np.ndarray, int, int]:
    """A record whose loss gradient (norm about 5.8 at the test's model: logit 3.1, label 0) is clipped to C."""
    return np.array([3.0, -3.0, 3.0, 3.0]), 0, 0


def _private_twins(tmp_path: Path, d, d_prime, algorithm: str = "steffle", **values):
    twins = ms.Twins(d, d_prime, tmp_path)
    _start(twins, algorithm, epsilon=1.0, **values)
    replies = twins.send(msg.TRAIN, _train(algorithm, server_round=1, **{**VALUES, "epsilon": 1.0, **values}), 1)
    return twins, replies


def _same_but_the_count(first, second, what: str) -> None:
    """The replies of silos one record apart: the noised records may differ, the report only in n_j (public, listed
    under the privacy block's `not_covered`), and nothing else at all."""
    reports = [dict(r.content[msg.REPORT]) for r in (first, second)]
    assert reports[1].pop("num-examples") == reports[0].pop("num-examples") + 1 and reports[0] == reports[1]
    second.content[msg.REPORT] = first.content[msg.REPORT]  # the count set aside: every other record compared
    ms.assert_same_behaviour(first, second, NOISED, what)


def test_an_added_record_moves_each_release_by_its_own_clipped_term_only(tmp_path: Path) -> None:
    silo = _silo()
    x, y, s = _canary()
    _, (first, second) = _private_twins(tmp_path, silo, ms.append_record(silo, x, y, s))
    _same_but_the_count(first, second, "add one record")
    update = [_flat(ms.arrays_of(r, msg.UPDATE), PARAM_NAMES) for r in (first, second)]
    fair = [ms.arrays_of(r, msg.FAIR_UPDATE) for r in (first, second)]
    # the same seeded noise on both: the difference is the canary's own contribution, / m
    own_loss, own_theta, own_w = _releases(x[None].astype(np.float32), np.array([y]), np.array([s]))
    np.testing.assert_allclose(update[1] - update[0], own_loss.numpy(), atol=2e-6)
    assert np.linalg.norm(update[1] - update[0]) == pytest.approx(CLIP / M, rel=1e-4)  # clipped: its norm is C
    theta = [_flat(f, PARAM_NAMES) for f in fair]
    np.testing.assert_allclose(theta[1] - theta[0], own_theta.numpy(), atol=2e-6)
    assert np.linalg.norm(theta[1] - theta[0]) <= CLIP / M * (1 + 1e-4)
    np.testing.assert_allclose(fair[1]["w"] - fair[0]["w"], own_w.numpy(), atol=2e-6)


def test_a_replaced_record_changes_nothing_un_noised_and_the_default_mode_would(tmp_path: Path) -> None:
    """One record's features, label and attribute replaced: in record mode every reply record that differs is a
    noised one, each within twice its radius / m (C, C); in the default mode the loss gradient, sent un-noised,
    differs: what `protect = record` fixes."""
    silo = _silo()
    x, y, s = _canary()
    d_prime = ms.replace_record(silo, 0, x, y, s)
    _, (first, second) = _private_twins(tmp_path / "record", silo, d_prime)
    ms.assert_same_behaviour(first, second, NOISED, "replace one record")
    for record in (msg.UPDATE, msg.FAIR_UPDATE):
        a, b = (_flat(ms.arrays_of(r, record), PARAM_NAMES) for r in (first, second))
        assert 0 < np.linalg.norm(b - a) <= 2 * CLIP / M * (1 + 1e-4), record
    _, (plain, plain_prime) = _private_twins(tmp_path / "sensitive", silo, d_prime, protect="sensitive")
    problem = ms.behaviour_difference(plain, plain_prime, NOISED - {msg.UPDATE})
    assert problem is not None and "update" in problem and "carries no noise but differs" in problem


def test_the_loss_gradient_carries_the_noise_the_report_names(tmp_path: Path) -> None:
    features = 99  # 100 coordinates of noise on the loss gradient
    silo = _silo(features=features)
    plain = ms.Node(silo, tmp_path / "plain")
    plain.setup()
    _start(plain)
    reply = plain.send(msg.TRAIN, _train("steffle", features, server_round=1, **VALUES), 1)
    exact = _flat(ms.arrays_of(reply, msg.UPDATE), PARAM_NAMES)
    noised_node = ms.Node(silo, tmp_path / "noised")
    noised_node.setup()
    _start(noised_node, epsilon=1.0)
    reply = noised_node.send(msg.TRAIN, _train("steffle", features, server_round=1, **{**VALUES, "epsilon": 1.0}), 1)
    report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
    noise = _flat(ms.arrays_of(reply, msg.UPDATE), PARAM_NAMES) - exact
    std = report.noise_multiplier * CLIP / M  # the loss release's std on the mean: sigma C / m
    assert report.noise_multiplier > 0 and noise.size == features + 1
    # 100 coordinates: their RMS is the std within 25 % (a chi-square with 100 degrees of freedom: +-7 % is one sd)
    assert float(np.sqrt(np.mean(noise**2))) == pytest.approx(std, rel=0.25)


# -- tran -----------------------------------------------------------------------------------------------------------
def test_tran_under_protect_record_sends_nothing_un_noised_that_depends_on_a_record(tmp_path: Path) -> None:
    silo = _silo()
    x, y, s = _canary()
    _, (first, second) = _private_twins(tmp_path, silo, ms.append_record(silo, x, y, s), "tran")
    _same_but_the_count(first, second, "tran, add one record")
    update = [_flat(ms.arrays_of(r, msg.UPDATE), PARAM_NAMES) for r in (first, second)]
    assert np.linalg.norm(update[1] - update[0]) == pytest.approx(CLIP / M, rel=1e-4)
    mass = [ms.arrays_of(r, msg.FAIR_UPDATE)[tran_round.MASS] for r in (first, second)]
    assert np.linalg.norm(mass[1] - mass[0]) <= 1.0 / M * (1 + 1e-4)  # the record's soft predictions, radius 1


# -- accounting -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("algorithm", "releases"), [("steffle", 4), ("tran", 3)])
@pytest.mark.slow  # two calibrations at q = 0.25 (about 7 s each on a shared 2-core machine)
def test_the_epsilon_reported_is_dp_accountings_over_the_composed_events(
    tmp_path: Path, algorithm: str, releases: int
) -> None:
    n, m, rounds = 200, 50, 3
    node = ms.Node(_silo(n), tmp_path / "silo")
    node.setup()
    values = {**VALUES, "batch_size": m, "total_rounds": rounds, "epsilon": 2.0, "accountant": "rdp"}
    _start(node, algorithm, **values)
    for t in range(1, rounds + 1):
        reply = node.send(msg.TRAIN, _train(algorithm, **{**values, "server_round": t}), t)
        report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
    bound = privacy_state.record_values(node.context.state[privacy_state.STATE_KEY])
    assert bound["relation"] == "add_remove" and bound["parameter.protect"] == "record"
    assert bound["releases"].split(",")[0] == "loss" and len(bound["releases"].split(",")) == releases
    sigma, setup = report.noise_multiplier, float(bound["one-off"])
    q = m / n
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma / math.sqrt(releases)))
    event = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(setup), dp_accounting.SelfComposedDpEvent(step, rounds)]
    )
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(event)
    assert report.epsilon_spent == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-9)
    assert report.epsilon_spent <= 2.0 * (1 + 1e-9)


def test_the_mechanism_of_each_mode() -> None:
    def instr(**values) -> msg.TrainInstruction:
        return msg.TrainInstruction.for_algorithm("steffle", server_round=1, **{**VALUES, "epsilon": 1.0, **values})

    record = steffle_round.mechanism(N, instr())
    assert record.relation == "add_remove" and [r.name for r in record.releases] == ["loss", "theta", "w", "outputs"]
    assert record.setup[0].radius == 1.0 and record.parameters["protect"] == "record"
    balanced = steffle_round.mechanism(N, instr(group_weight="balanced"))
    assert [r.name for r in balanced.releases] == ["loss", "theta", "w"]
    assert [r.name for r in steffle_round.mechanism(N, instr(lam=0.0)).releases] == ["loss"]
    sensitive = steffle_round.mechanism(N, instr(protect="sensitive"))
    assert sensitive.relation == "replace_one" and "protect" not in sensitive.parameters
    assert sensitive.setup[0].radius == pytest.approx(math.sqrt(2) / 2)
    tran = tran_round.mechanism(N, msg.TrainInstruction.for_algorithm("tran", server_round=1, **VALUES))
    assert [r.name for r in tran.releases] == ["loss", "constraint", "mass"] and tran.relation == "add_remove"


def test_lambda_zero_still_charges_and_noises_the_loss_gradient(tmp_path: Path) -> None:
    node = ms.Node(_silo(), tmp_path / "silo")
    node.setup()
    values = {**VALUES, "epsilon": 1.0, "lam": 0.0}
    _start(node, **values)
    reply = node.send(msg.TRAIN, _train("steffle", server_round=1, **values), 1)
    report = msg.read_config(reply.content, msg.TrainReport, record=msg.REPORT)
    assert sorted(reply.content.keys()) == [msg.REPORT, msg.UPDATE]
    assert report.noise_multiplier > 0 and 0 < report.epsilon_spent <= 1.0


# -- the run configuration and the console --------------------------------------------------------------------------
BASE = {"algorithm": "steffle", "dataset": "synthetic", "rounds": 2, "epsilon": 1.0, "protect": "record"}


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"topology": "divided"}, "topology 'silos' only"),
        ({"sampling": "shuffle"}, "needs 'sampling' = 'poisson'"),
        ({"algorithm": "tran", "sampling": "shuffle"}, "needs 'sampling' = 'poisson'"),
        ({"protect": "everything"}, "protect"),
    ],
)
def test_a_run_config_the_mode_cannot_serve_is_refused_naming_the_key(values: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match="protect") as error:
        RunConfig.parse({**BASE, **values})
    assert needle in str(error.value)


def test_the_console_and_the_privacy_block_say_what_is_protected() -> None:
    from silofl.server.privacy_statement import privacy_lines

    for protect, protected, clear in (("record", "the whole record", False), ("sensitive", "the sensitive", True)):
        config = RunConfig.parse({**BASE, "protect": protect})
        block = {"epsilon_spent": 1.0, "delta": 1e-5, **steffle_entry.protection_report(config, steffle_entry.IN_CLEAR)}
        assert block["protected"].startswith(protected) and block["protect"] == protect
        text = "\n".join(privacy_lines(config.spec, config, block))
        assert ("features, label and sensitive attribute" in text) is not clear
        assert ("not protected: the features and labels" in text) is clear
        assert ("whole record" in config.spec.describe_mechanism(config)) is not clear
        assert ("(whole record)" in config.spec.display_label(config.to_json())) is not clear


# -- attacks: what a malicious server can make a silo do -----------------------------------------------------------
def _policy_node(tmp_path: Path, text: str, data=None, name: str = "silo", **config) -> ms.Node:
    policy = tmp_path / f"{name}.toml"
    policy.write_text(text)
    node = ms.Node(
        data or _silo(),
        tmp_path / name,
        policy=str(policy),
        **{"state-dir": str(tmp_path / f"{name}.state")},
        **config,
    )
    node.setup()
    return node


def test_a_record_policy_refuses_a_forged_instruction_asking_for_sensitive_only(tmp_path: Path) -> None:
    node = _policy_node(tmp_path, 'protect = "record"\nmax-epsilon-per-job = 2\n')
    values = {**VALUES, "epsilon": 1.0, "protect": "sensitive"}
    for kind, content, server_round in (
        (msg.GROUPS, ms.groups("steffle", **values), 0),
        (msg.TRAIN, _train("steffle", server_round=1, **values), 1),
    ):
        reason = ms.error_reason(node.send(kind, content, server_round))
        assert "protect = 'sensitive'" in reason and "protect = 'record'" in reason and "--protect record" in reason
    assert not lifetime_ledger.path_of(tmp_path / "silo.state").exists()  # nothing admitted, nothing charged
    assert privacy_state.STATE_KEY not in node.context.state
    _start(node, epsilon=1.0)  # the same job asking for whole records is answered
    answered = node.send(msg.TRAIN, _train("steffle", server_round=1, **{**VALUES, "epsilon": 1.0}), 1)
    assert not answered.has_error(), answered.error.reason
    policy = node_policy(node.context)
    assert policy.allows("dp-fedsgd", "silo") and not policy.allows("fedsc", "silo")
    assert not policy.allows("steffle", "silo") and policy.allows("steffle", "silo", "record")


def test_a_record_policy_refuses_a_job_without_noise(tmp_path: Path) -> None:
    node = _policy_node(tmp_path, 'protect = "record"\n')
    reason = ms.error_reason(node.send(msg.GROUPS, ms.groups("steffle", **VALUES), 0))  # epsilon = inf
    assert "no noise" in reason and "protect = 'record'" in reason


def test_a_budgeted_silo_answers_steffle_for_whole_records_by_default_and_counts_it_as_all_its_data(
    tmp_path: Path,
) -> None:
    node = _policy_node(tmp_path, "lifetime-epsilon = 10\nlifetime-delta = 1e-6\n")
    sensitive = {**VALUES, "epsilon": 1.0, "protect": "sensitive"}
    reason = ms.error_reason(node.send(msg.GROUPS, ms.groups("steffle", **sensitive), 0))
    assert "'steffle'" in reason and "steffle, tran with protect = record" in reason
    _start(node, epsilon=1.0)
    ledger = lifetime_ledger.load(tmp_path / "silo.state")
    assert [job.covers_all_data for job in ledger.jobs.values()] == [True]


def test_a_silo_refuses_to_switch_mode_mid_job(tmp_path: Path) -> None:
    node = ms.Node(_silo(), tmp_path / "silo", **{"state-dir": str(tmp_path / "state")})
    node.setup()
    _start(node, epsilon=1.0)
    first = node.send(msg.TRAIN, _train("steffle", server_round=1, **{**VALUES, "epsilon": 1.0}), 1)
    assert not first.has_error(), first.error.reason
    downgraded = _train("steffle", server_round=2, **{**VALUES, "epsilon": 1.0, "protect": "sensitive"})
    assert "'protect'" in ms.error_reason(node.send(msg.TRAIN, downgraded, 2))


def test_a_silo_refuses_whole_record_privacy_with_shuffled_epochs(tmp_path: Path) -> None:
    values = {**VALUES, "epsilon": 1.0, "sampling": "shuffle"}
    for algorithm in ("steffle", "tran"):
        node = ms.Node(_silo(), tmp_path / algorithm)
        node.setup()
        reason = ms.error_reason(node.send(msg.GROUPS, ms.groups(algorithm, **values), 0))
        assert "'sampling' = 'shuffle'" in reason and "refuses" in reason


def test_a_separate_party_refuses_whole_record_privacy(tmp_path: Path) -> None:
    silo = _silo()
    party = ms.Node(ms.sensitive_party(silo), tmp_path / "party", **{"party-secret": ms.PARTY_SECRET})
    party.setup()
    reason = ms.error_reason(party.send(msg.GROUPS, ms.groups("steffle", **{**VALUES, "epsilon": 1.0}), 0))
    assert "'protect' = 'record'" in reason and "topology silos" in reason


# -- a whole run ----------------------------------------------------------------------------------------------------
@pytest.mark.slow  # two short silofl runs (about 10 s on a shared 2-core machine)
def test_silofl_run_says_what_each_mode_protects_and_a_record_policy_holds(tmp_path: Path, capsys) -> None:
    """`silofl run steffle --protect record`: the privacy block and the console say the whole record; under a silo
    policy `protect = "record"` the same run asking for the sensitive attribute only stops before any release."""
    from silofl.server.cli import main

    flags = ["--dataset", "synthetic", "--silos", "2", "--rounds", "3", "--epsilon", "2", "--max-train-records", "400"]
    assert main(["run", "steffle", *flags, "--protect", "record", "--out", str(tmp_path / "record")]) == 0
    out = capsys.readouterr().out
    privacy = json.loads((tmp_path / "record" / "result.json").read_text())["privacy"]
    assert privacy["protected"] == "the whole record" and privacy["in_clear"] == ""
    assert privacy["relation"].startswith("add_remove") and "n_j" in privacy["not_covered"]
    assert float(privacy["epsilon_spent"]) <= 2.0 and "silofl_sigma_loss" in privacy["closed_form"]["per_silo"]["0"]
    # replacing a record costs more than adding one, less than twice (group privacy) the add/remove figure
    assert float(privacy["epsilon_spent"]) < privacy["epsilon_replace_one"] < 2 * float(privacy["epsilon_spent"])
    text = " ".join(out.split())
    assert "features, label and sensitive attribute" in text and "not protected: the features" not in text
    assert f"changing its sensitive attribute): epsilon {privacy['epsilon_replace_one']:.4g}" in text
    policy = tmp_path / "policy.toml"
    policy.write_text('protect = "record"\nmax-epsilon-per-job = 2\n')
    state = ["--silo-policy", str(policy), "--silo-state", str(tmp_path / "state")]
    code = main(["run", "steffle", *flags, *state, "--out", str(tmp_path / "sensitive")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "protect = 'record'" in err and not (tmp_path / "sensitive" / "result.json").exists()
