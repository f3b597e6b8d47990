"""The permanent randomized response of a sensitive party's test groups (`protocols.randomized_response`): its draw
law and its debiasing, its charge in the lifetime ledger against dp-accounting by hand, once per secret and eps, its
secret in the state folder, and what a server forging the grouped evaluation's messages gets."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import NeighboringRelation, dp_event
from dp_accounting.pld import pld_privacy_accountant
from flwr.app import Context, RecordDict

from client import lifetime_ledger, noised_evaluation
from protocols import messages as msg
from protocols import randomized_response as rr
from protocols.silo_policy import SiloPolicy
from strategies.party_evaluation import debiased_counts

SECRET = bytes(range(32))


def test_the_draw_is_permanent_and_follows_the_randomized_response_law() -> None:
    """Same secret, ids and eps: the same answers; the true group comes out with probability e^eps / (e^eps + k - 1)
    and each other one with 1 / (e^eps + k - 1) (checked on 60,000 records, 5 standard errors); another secret or
    another eps draws anew."""
    rng = np.random.default_rng(0)
    n, k, eps = 60_000, 3, 1.0
    ids, groups = np.arange(n) * 7 + 11, rng.integers(0, k, n)
    out = rr.permanent_groups(SECRET, ids, groups, eps, k)
    assert np.array_equal(out, rr.permanent_groups(SECRET, ids, groups, eps, k))
    assert np.array_equal(out[::-1], rr.permanent_groups(SECRET, ids[::-1], groups[::-1], eps, k))  # per id
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    assert abs((out == groups).mean() - keep) < 5 * math.sqrt(keep * (1 - keep) / n)
    other = (groups + 1) % k
    each = 1 / (math.exp(eps) + k - 1)
    assert abs((out == other).mean() - each) < 5 * math.sqrt(each * (1 - each) / n)
    assert (out != rr.permanent_groups(bytes(32), ids, groups, eps, k)).mean() > 0.2
    assert (out != rr.permanent_groups(SECRET, ids, groups, 2.0, k)).mean() > 0.1
    assert rr.secret_fingerprint(SECRET, 1.0, k) != rr.secret_fingerprint(SECRET, 2.0, k)
    with pytest.raises(ValueError, match="groups must be in"):
        rr.permanent_groups(SECRET, ids[:2], np.array([0, k]), eps, k)


def test_debiasing_recovers_the_counts_in_expectation() -> None:
    """E[counts by randomized group] = M counts: debiasing M counts gives the counts back exactly (any label and
    prediction axes), and the server's estimate sums each source's debiased counts, rounded and clipped at 0."""
    k, eps = 4, 0.7
    true = np.arange(k * 2 * 2, dtype=np.float64).reshape(k, 2, 2) * 10
    p = rr.noise_parameter(eps, k)
    matrix = (1 - p) * np.eye(k) + p / k
    expected = np.tensordot(matrix, true, axes=1)
    np.testing.assert_allclose(rr.debias(expected, eps), true, atol=1e-9)
    two = np.stack(
        [
            expected,
            np.tensordot((1 - rr.noise_parameter(2.0, k)) * np.eye(k) + rr.noise_parameter(2.0, k) / k, true, axes=1),
        ]
    )
    np.testing.assert_allclose(debiased_counts(np.rint(two * 1e6).astype(np.int64), [eps, 2.0]), 2e6 * true, atol=8)
    assert (debiased_counts(np.array([[[[0, 5], [0, 0]], [[9, 0], [0, 0]]]]), [0.1]) >= 0).all()


def test_the_response_is_pure_epsilon_dp_and_composes_with_evaluations_as_dp_accounting_says(tmp_path: Path) -> None:
    """The response's p is the eps-DP one (dp-accounting's RandomizedResponseDpEvent at p: epsilon eps at delta 0);
    the lifetime ledger charges it once per fingerprint, composes it with the noised evaluations as dp-accounting's
    PLD accountant composes the same events (replace one), and refuses one past lifetime-epsilon, unchanged."""
    k, eps = 2, 1.5
    p = rr.noise_parameter(eps, k)
    accountant = pld_privacy_accountant.PLDAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_event.RandomizedResponseDpEvent(p, k))
    assert accountant.get_epsilon(1e-12) == pytest.approx(eps, rel=1e-3)

    policy = SiloPolicy.model_validate({"lifetime-epsilon": 4.0, "lifetime-delta": 1e-6})
    charge = dict(fingerprint="f1", noise_parameter=p, groups=k, who="party")
    multiplier = noised_evaluation.evaluation_multiplier(policy)
    for r in (1, 2, 3):
        lifetime_ledger.charge_evaluation(tmp_path, policy, multiplier=multiplier, run_id=5, server_round=r, who="x")
    assert lifetime_ledger.charge_randomized_response(tmp_path, policy, **charge)
    assert not lifetime_ledger.charge_randomized_response(tmp_path, policy, **charge)  # the same answers again
    ledger = lifetime_ledger.load(tmp_path)
    assert ledger.randomized_responses == {"f1": (p, k)}
    by_hand = pld_privacy_accountant.PLDAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    by_hand.compose(dp_event.GaussianDpEvent(multiplier), 3)
    by_hand.compose(dp_event.RandomizedResponseDpEvent(p, k))
    assert ledger.evaluation_epsilon(1e-6) == pytest.approx(by_hand.get_epsilon(1e-6), rel=1e-3)
    with pytest.raises(msg.MessageError, match=r"lifetime-epsilon = 4.*randomized response.*refuses"):
        lifetime_ledger.charge_randomized_response(
            tmp_path, policy, **{**charge, "fingerprint": "f2", "noise_parameter": rr.noise_parameter(3.0, k)}
        )
    assert lifetime_ledger.load(tmp_path).randomized_responses == {"f1": (p, k)}


def test_a_deployed_partys_secret_is_created_once_in_its_state_folder(tmp_path: Path) -> None:
    """Deployed (its own data folder), the secret is 32 bytes from the OS in its state folder, owner-only, the same
    on every later call (so the answers stay the same across restarts); a damaged file is refused, naming it."""
    state = tmp_path / "state"
    context = Context(
        run_id=9,
        node_id=1,
        node_config={"data-path": str(tmp_path / "data"), "state-dir": str(state)},
        state=RecordDict(),
        run_config={},
    )
    first = noised_evaluation.response_secret(context, party_id=0)
    path = state / noised_evaluation.RESPONSE_SECRET_FILE
    assert len(first) == 32 and path.read_bytes() == first and path.stat().st_mode & 0o777 == 0o600
    assert noised_evaluation.response_secret(context, party_id=0) == first
    path.write_bytes(b"short")
    with pytest.raises(msg.MessageError, match="randomized-response secret"):
        noised_evaluation.response_secret(context, party_id=0)
