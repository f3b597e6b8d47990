"""Tests for protocols.privacy.ledger: refusals, double charges, persistence, agreement with the accountant."""

from __future__ import annotations

import ast
import importlib.metadata
import itertools
import json
import math
import re
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from silofl.protocols.privacy.accountant import (
    PriorRelease,
    calibrate_noise,
    dp_event,
    epsilon_spent,
    pld_value_discretization,
)
from silofl.protocols.privacy.ledger import (
    DP_ACCOUNTING_CHECKED,
    LADDER_RATIO,
    BudgetExceededError,
    LedgerEntry,
    PrivacyLedger,
)

DELTA = 1e-6


def test_refuses_past_budget_with_a_clear_error_and_charges_nothing() -> None:
    ledger = PrivacyLedger(epsilon_budget=1.0, delta=DELTA, accountant="rdp")
    answered = 0
    with pytest.raises(BudgetExceededError) as caught:
        for round_number in range(1, 1000):
            ledger.charge(round=round_number, noise_multiplier=2.0, sampling_rate=0.05, silo="hospital-a")
            answered += 1
    before = ledger.to_dict()
    spent = ledger.spent()
    error = caught.value
    assert 0 < answered < 999
    assert error.silo == "hospital-a" and error.round == answered + 1
    assert error.budget == 1.0 and error.spent == spent <= 1.0 < error.cost
    assert error.cost == epsilon_spent(2.0, 0.05, answered + 1, DELTA, accountant="rdp")
    message = str(error)
    assert "hospital-a" in message and "budget epsilon=1" in message and "Nothing was charged" in message
    assert f"{error.cost:.6g}" in message and f"{spent:.6g}" in message
    # The refused round is not recorded: a retry is refused again, with the same figures.
    with pytest.raises(BudgetExceededError):
        ledger.charge(round=answered + 1, noise_multiplier=2.0, sampling_rate=0.05)
    assert ledger.to_dict() == before
    assert ledger.spent() == spent
    # A cheaper answer (more noise) still fits.
    ledger.charge(round=answered + 1, noise_multiplier=50.0, sampling_rate=0.05)


def test_double_charge_and_out_of_order_rounds_are_errors() -> None:
    ledger = PrivacyLedger(epsilon_budget=10.0, delta=DELTA, accountant="rdp")
    for round_number in (1, 2, 5):
        ledger.charge(round=round_number, noise_multiplier=2.0, sampling_rate=0.1)
    before = ledger.to_dict()
    with pytest.raises(ValueError, match="round 2 was already charged"):
        ledger.charge(round=2, noise_multiplier=2.0, sampling_rate=0.1)
    with pytest.raises(ValueError, match="round 5 was already charged"):
        ledger.charge(round=5, noise_multiplier=2.0, sampling_rate=0.1)
    with pytest.raises(ValueError, match="before the last charged round 5"):
        ledger.charge(round=3, noise_multiplier=2.0, sampling_rate=0.1)
    assert ledger.to_dict() == before
    assert ledger.rounds() == [1, 2, 5]


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["rdp", "pld", "best"])
def test_calibrated_run_charges_exactly_its_steps(accountant: str) -> None:
    target, q, steps = 2.0, 0.05, 40
    calibration = calibrate_noise(target, DELTA, q, steps, accountant=accountant, tolerance=1e-5)
    sigma = calibration.noise_multiplier
    # Precondition of the test: one step more does exceed the target.
    assert epsilon_spent(sigma, q, steps + 1, DELTA, accountant=accountant) > target
    ledger = PrivacyLedger(epsilon_budget=target, delta=DELTA, accountant=accountant)
    for round_number in range(1, steps + 1):
        ledger.charge(round=round_number, noise_multiplier=sigma, sampling_rate=q)
    assert ledger.spent() == calibration.epsilon
    with pytest.raises(BudgetExceededError):
        ledger.charge(round=steps + 1, noise_multiplier=sigma, sampling_rate=q)
    assert ledger.entries == [LedgerEntry(1, sigma, q, 1, steps, steps)]


def test_budget_hit_exactly_on_the_last_round_is_allowed() -> None:
    q, steps = 0.05, 30
    exact = epsilon_spent(1.3, q, steps, DELTA, accountant="rdp")
    ledger = PrivacyLedger(epsilon_budget=exact, delta=DELTA, accountant="rdp")
    for round_number in range(steps):
        ledger.charge(round=round_number, noise_multiplier=1.3, sampling_rate=q)
    assert ledger.spent() == exact


def test_identical_consecutive_charges_merge() -> None:
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="rdp")
    for round_number in range(1, 101):
        ledger.charge(round=round_number, noise_multiplier=1.0, sampling_rate=0.01, releases=2, steps=3)
    for round_number in (103, 104, 110):  # gaps (silo not sampled) still merge: accounting ignores round numbers
        ledger.charge(round=round_number, noise_multiplier=1.0, sampling_rate=0.01, releases=2, steps=3)
    ledger.charge(round=111, noise_multiplier=1.0, sampling_rate=0.01, releases=2, steps=1)  # another mechanism
    assert ledger.entries == [LedgerEntry(1, 1.0, 0.01, 2, 309, 103), LedgerEntry(111, 1.0, 0.01, 2, 1, 1)]
    assert ledger.round_runs == [(1, 100), (103, 2), (110, 2)]
    assert ledger.rounds() == [*range(1, 101), 103, 104, 110, 111]
    assert len(ledger.to_dict()["round_run_start"]) == 3


def test_spent_agrees_with_the_library_for_mixed_entries() -> None:
    charges = [(1.0, 0.02, 1, 2)] * 5 + [(3.0, 0.2, 3, 1)] * 4 + [(20.0, 1.0, 1, 1)] * 3
    ledgers = {name: PrivacyLedger(math.inf, DELTA, accountant=name) for name in ("rdp", "pld", "best")}
    for round_number, (sigma, q, releases, steps) in enumerate(charges):
        for ledger in ledgers.values():
            ledger.charge(round=round_number, noise_multiplier=sigma, sampling_rate=q, releases=releases, steps=steps)
    event = dp_accounting.ComposedDpEvent(
        [dp_event(1.0, 0.02, 10, 1), dp_event(3.0, 0.2, 4, 3), dp_event(20.0, 1.0, 3, 1)]
    )
    rdp = RdpAccountant().compose(event).get_epsilon(DELTA)
    grid = min(pld_value_discretization(s, q) for s, q in [(1.0, 0.02), (3.0 / math.sqrt(3), 0.2), (20.0, 1.0)])
    pld = PLDAccountant(value_discretization_interval=grid).compose(event).get_epsilon(DELTA)
    assert ledgers["rdp"].spent() == rdp
    assert ledgers["pld"].spent() == pytest.approx(pld, rel=1e-12)
    assert ledgers["best"].spent() == pytest.approx(min(rdp, pld), rel=1e-12)
    assert len(ledgers["rdp"].entries) == 3


def test_companion_releases_agree_with_the_library_and_round_trip() -> None:
    """A second release per round on its own Poisson sample (FedFDP's loss release): the ledger's figure is the
    library's for the composed events, after a plain entry too; the companion survives to_dict / from_dict."""
    charges = [(1.0, 0.05, 1.0)] * 3 + [(2.0, 0.05, 5.0)] * 6
    ledgers = {name: PrivacyLedger(math.inf, DELTA, accountant=name) for name in ("rdp", "pld", "best")}
    for round_number, (sigma, q, companion) in enumerate(charges):
        second = math.inf if round_number < 3 else companion
        for ledger in ledgers.values():
            ledger.charge(round=round_number, noise_multiplier=sigma, sampling_rate=q, companion=second)
    event = dp_accounting.ComposedDpEvent([dp_event(1.0, 0.05, 3), dp_event(2.0, 0.05, 6), dp_event(5.0, 0.05, 6)])
    rdp = RdpAccountant().compose(event).get_epsilon(DELTA)
    grid = min(pld_value_discretization(s, 0.05) for s in (1.0, 2.0, 5.0))
    pld = PLDAccountant(value_discretization_interval=grid).compose(event).get_epsilon(DELTA)
    assert ledgers["rdp"].spent() == pytest.approx(rdp, rel=1e-12)
    assert ledgers["pld"].spent() == pytest.approx(pld, rel=1e-12)
    assert ledgers["best"].spent() == pytest.approx(min(rdp, pld), rel=1e-12)
    assert [e.companion for e in ledgers["pld"].entries] == [math.inf, 5.0]
    alone = PrivacyLedger(math.inf, DELTA, accountant="pld")
    alone.charge(round=0, noise_multiplier=2.0, sampling_rate=0.05, companion=5.0)
    assert alone.spent() == epsilon_spent(2.0, 0.05, 1, DELTA, accountant="pld", companion=5.0)
    stored = json.loads(json.dumps(ledgers["best"].to_dict()))
    again = PrivacyLedger.from_dict(stored)
    assert again.entries == ledgers["best"].entries and again.spent() == ledgers["best"].spent()
    assert PrivacyLedger.from_dict({k: v for k, v in stored.items() if k != "entry_companion"}).entries[
        1
    ].companion == (math.inf)  # a dict written before companions: none


@pytest.mark.slow
def test_single_entry_equals_epsilon_spent_bit_for_bit() -> None:
    for name in ("rdp", "pld"):
        ledger = PrivacyLedger(math.inf, DELTA, accountant=name)
        for round_number in range(25):
            ledger.charge(round=round_number, noise_multiplier=0.9, sampling_rate=0.03, releases=2, steps=4)
        assert ledger.spent() == epsilon_spent(0.9, 0.03, 100, DELTA, releases=2, accountant=name)


def test_cost_after_does_not_charge_and_predicts_the_charge() -> None:
    ledger = PrivacyLedger(epsilon_budget=5.0, delta=DELTA, accountant="pld")
    ledger.charge(round=1, noise_multiplier=1.0, sampling_rate=0.1)
    predicted = ledger.cost_after(1.0, 0.1)
    assert ledger.rounds() == [1] and ledger.entries[0].steps == 1
    assert predicted > ledger.spent()
    assert ledger.charge(round=2, noise_multiplier=1.0, sampling_rate=0.1) == predicted


def test_best_charge_returns_an_upper_bound_of_spent() -> None:
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="best")
    returned = ledger.charge(round=1, noise_multiplier=1.0, sampling_rate=0.1, steps=10)
    assert returned == epsilon_spent(1.0, 0.1, 10, DELTA, accountant="rdp")  # RDP admits it: no PLD needed
    assert ledger.spent() == epsilon_spent(1.0, 0.1, 10, DELTA, accountant="best") <= returned


def test_history_tracks_every_round() -> None:
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="rdp")
    for round_number in (2, 3, 4, 8):
        ledger.charge(round=round_number, noise_multiplier=1.2, sampling_rate=0.1, steps=2)
    ledger.charge(round=9, noise_multiplier=0.8, sampling_rate=0.1)
    history = ledger.history()
    assert [r for r, _ in history] == [2, 3, 4, 8, 9]
    assert history[0][1] == epsilon_spent(1.2, 0.1, 2, DELTA, accountant="rdp")
    assert history[2][1] == epsilon_spent(1.2, 0.1, 6, DELTA, accountant="rdp")
    assert all(a[1] < b[1] for a, b in itertools.pairwise(history))
    assert history[-1][1] == ledger.spent()
    sparse = ledger.history(max_points=2)
    assert sparse == [history[0], history[-1]]
    assert PrivacyLedger(1.0, DELTA).history() == []


def test_round_trip_through_dict_json_and_flower_config_record() -> None:
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="best")
    for round_number, sigma in [(1, 1.0), (2, 1.0), (4, 1.0), (5, 2.5), (6, 2.5)]:
        ledger.charge(round=round_number, noise_multiplier=sigma, sampling_rate=0.1, releases=2)
    data = ledger.to_dict()
    assert all(
        isinstance(value, (int, float, str)) or (isinstance(value, list) and len({type(v) for v in value}) <= 1)
        for value in data.values()
    )
    restored = PrivacyLedger.from_dict(json.loads(json.dumps(data, allow_nan=False)))
    assert restored == ledger
    assert restored.spent() == ledger.spent()
    finite = PrivacyLedger(epsilon_budget=3.0, delta=DELTA, accountant="rdp")
    assert PrivacyLedger.from_dict(finite.to_dict()) == finite

    config_record = pytest.importorskip("flwr.app").ConfigRecord
    record = config_record(data)
    assert PrivacyLedger.from_dict(dict(record)) == ledger


def test_from_dict_errors_name_the_problem() -> None:
    data = PrivacyLedger(1.0, DELTA).to_dict()
    with pytest.raises(ValueError, match="missing entry_steps"):
        PrivacyLedger.from_dict({k: v for k, v in data.items() if k != "entry_steps"})
    with pytest.raises(ValueError, match="ledger_format"):
        PrivacyLedger.from_dict(data | {"ledger_format": 99})
    with pytest.raises(ValueError, match="equal lengths"):
        PrivacyLedger.from_dict(data | {"entry_steps": [3]})
    with pytest.raises(ValueError, match="epsilon_budget"):
        PrivacyLedger.from_dict(data | {"epsilon_budget": -1.0})


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(1.0, delta=0.0)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyLedger(1.0, DELTA, accountant="moments")
    with pytest.raises(ValueError, match="round_runs"):
        PrivacyLedger(1.0, DELTA, entries=[LedgerEntry(1, 1.0, 0.1, 1, 1)], round_runs=[])
    with pytest.raises(ValueError, match="multiple of rounds"):
        PrivacyLedger(1.0, DELTA, entries=[LedgerEntry(1, 1.0, 0.1, 1, 3, 2)], round_runs=[(1, 2)])
    ledger = PrivacyLedger(1.0, DELTA)
    with pytest.raises(ValueError, match="sampling_rate"):
        ledger.charge(round=1, noise_multiplier=1.0, sampling_rate=0.0)
    with pytest.raises(ValueError, match="round"):
        ledger.charge(round=-1, noise_multiplier=1.0, sampling_rate=0.1)


def test_no_noise_is_refused_under_a_finite_budget() -> None:
    ledger = PrivacyLedger(epsilon_budget=100.0, delta=DELTA)
    with pytest.raises(BudgetExceededError, match="epsilon=inf"):
        ledger.charge(round=1, noise_multiplier=0.0, sampling_rate=0.1)
    unlimited = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA)
    assert unlimited.charge(round=1, noise_multiplier=0.0, sampling_rate=0.1) == math.inf
    assert unlimited.remaining() == math.inf


def test_two_thousand_rdp_charges_collapse_into_one_entry() -> None:
    """Identical rounds are stored as one entry with its run of rounds, so a long run's ledger stays small and
    cheap to account (the time per charge is a benchmark's matter, not a test's)."""
    q = 256 / 12000
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=1e-9, accountant="rdp")
    for round_number in range(1, 2001):
        ledger.charge(round=round_number, noise_multiplier=1.0, sampling_rate=q)
    assert len(ledger.entries) == 1 and ledger.round_runs == [(1, 2000)]


def test_pld_certificate_keeps_long_calibrated_runs_cheap_and_within_budget(monkeypatch) -> None:
    """Near the end of a run calibrated with "best", PLD certifies the rest of the run in a few evaluations."""
    from silofl.protocols.privacy import admission, composition
    from silofl.protocols.privacy.accountant import calibrate_noise

    steps, q, delta, eps = 400, 0.05, 1e-6, 1.0
    cal = calibrate_noise(eps, delta, q, steps, accountant="best")
    calls = []
    real = composition.pld_epsilon
    monkeypatch.setattr(composition, "pld_epsilon", lambda s, *rest: calls.append(s) or real(s, *rest))
    admission._CERTIFICATES.clear()
    ledger = PrivacyLedger(epsilon_budget=eps, delta=delta, accountant="best")
    figures = [ledger.charge(round=r, noise_multiplier=cal.noise_multiplier, sampling_rate=q) for r in range(steps)]
    assert max(figures) <= eps * (1 + 1e-9)
    assert len(calls) <= 30  # one search, not one PLD evaluation per remaining round
    assert ledger.spent() <= eps * (1 + 1e-9)
    # every reported figure is an upper bound on the exact spending after that round
    exact = dict(ledger.history(max_points=8))
    for round_number, value in exact.items():
        assert figures[round_number] >= value - 1e-12


def test_vectorized_rdp_conversion_equals_dp_accounting() -> None:
    from dp_accounting.rdp import compute_epsilon

    from silofl.protocols.privacy.composition import rdp_curve, rdp_to_epsilon

    for sigma, q, steps, delta in [
        (1.0, 0.01, 1000, 1e-5),
        (5.0, 0.02, 2000, 1e-9),
        (0.6, 0.5, 3, 1e-3),
        (50.0, 0.001, 1, 1e-6),
    ]:
        orders, curve = rdp_curve(sigma, q)
        assert rdp_to_epsilon(orders, steps * curve, delta) == pytest.approx(
            compute_epsilon(orders, steps * curve, delta)[0], rel=1e-12, abs=1e-15
        )


# --------------------------------------------------------------------------------------------------------------------
# replace_one (privacy of the sensitive attribute) and a prior un-sampled release
# --------------------------------------------------------------------------------------------------------------------


def _count_pld_evaluations(monkeypatch: pytest.MonkeyPatch) -> list:
    from silofl.protocols.privacy import admission, composition

    calls: list = []
    real = composition.pld_epsilon
    monkeypatch.setattr(composition, "pld_epsilon", lambda s, *rest: calls.append(s) or real(s, *rest))
    admission._LADDERS.clear()
    admission._CERTIFICATES.clear()
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
def test_calibrated_run_after_a_histogram_charges_its_steps_cheaply(monkeypatch, relation: str) -> None:
    target, q, steps, histogram = 2.0, 0.05, 300, PriorRelease(8.0)
    cal = calibrate_noise(target, DELTA, q, steps, 2, relation=relation, prior=[histogram], tolerance=1e-5)
    sigma = cal.noise_multiplier
    # Precondition of the test: one round more does exceed the target.
    assert epsilon_spent(sigma, q, steps + 1, DELTA, 2, relation=relation, prior=[histogram]) > target
    calls = _count_pld_evaluations(monkeypatch)
    ledger = PrivacyLedger(epsilon_budget=target, delta=DELTA, accountant="best", relation=relation)
    ledger.charge(round=0, noise_multiplier=8.0, sampling_rate=1.0)  # the setup round's histogram
    figures = {
        r: ledger.charge(round=r, noise_multiplier=sigma, sampling_rate=q, releases=2) for r in range(1, steps + 1)
    }
    assert max(figures.values()) <= target * (1 + 1e-9)
    # a ladder of PLD evaluations for the run (71 measured under replace_one, 10 under add_remove), not one per round
    ladder = 2 * (5 + math.log(steps / 10) / math.log(LADDER_RATIO)) + math.log2(steps / 10)
    assert len(calls) <= ladder < steps / 3
    with pytest.raises(BudgetExceededError):
        ledger.charge(round=steps + 1, noise_multiplier=sigma, sampling_rate=q, releases=2)
    assert ledger.entries == [LedgerEntry(0, 8.0, 1.0, 1, 1, 1), LedgerEntry(1, sigma, q, 2, steps, steps)]
    assert ledger.spent() == pytest.approx(cal.epsilon, rel=1e-12)
    # every reported figure bounds the exact spending after its round (and, under replace_one, stays close to it)
    for round_number, exact in ledger.history(max_points=8)[1:]:
        assert exact - 1e-12 <= figures[round_number]
        if relation == "replace_one":
            assert figures[round_number] <= exact * LADDER_RATIO


def test_histogram_and_rounds_compose_to_more_than_the_rounds_alone() -> None:
    sigma, q, steps = 3.0, 0.05, 50
    with_histogram = PrivacyLedger(math.inf, DELTA, accountant="pld", relation="replace_one")
    rounds_only = PrivacyLedger(math.inf, DELTA, accountant="pld", relation="replace_one")
    histogram_only = PrivacyLedger(math.inf, DELTA, accountant="pld", relation="replace_one")
    with_histogram.charge(round=0, noise_multiplier=6.0, sampling_rate=1.0)
    histogram_only.charge(round=0, noise_multiplier=6.0, sampling_rate=1.0)
    for round_number in range(1, steps + 1):
        with_histogram.charge(round=round_number, noise_multiplier=sigma, sampling_rate=q)
        rounds_only.charge(round=round_number, noise_multiplier=sigma, sampling_rate=q)
    both, rounds, histogram = with_histogram.spent(), rounds_only.spent(), histogram_only.spent()
    assert rounds < both < rounds + histogram  # one composition, not a sum of epsilons
    assert both == epsilon_spent(sigma, q, steps, DELTA, accountant="pld", relation="replace_one", prior=[(6.0,)])


def test_replace_one_spent_agrees_with_the_library_for_mixed_entries() -> None:
    ledger = PrivacyLedger(math.inf, DELTA, accountant="pld", relation="replace_one")
    ledger.charge(round=0, noise_multiplier=20.0, sampling_rate=1.0, releases=3)
    for round_number in range(1, 11):
        ledger.charge(round=round_number, noise_multiplier=1.5, sampling_rate=0.02, releases=2)
    event = dp_accounting.ComposedDpEvent([dp_event(20.0, 1.0, 1, 3), dp_event(1.5, 0.02, 10, 2)])
    grid = min(pld_value_discretization(20.0 / math.sqrt(3), 1.0), pld_value_discretization(1.5 / math.sqrt(2), 0.02))
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    library = PLDAccountant(relation, value_discretization_interval=grid).compose(event).get_epsilon(DELTA)
    assert ledger.spent() == pytest.approx(library, rel=1e-12)
    assert ledger.spent() > PrivacyLedger.from_dict(ledger.to_dict() | {"relation": "add_remove"}).spent()


def test_relation_round_trips_and_old_dicts_load_as_add_remove() -> None:
    ledger = PrivacyLedger(epsilon_budget=4.0, delta=DELTA, accountant="pld", relation="replace_one")
    ledger.charge(round=0, noise_multiplier=10.0, sampling_rate=1.0)
    ledger.charge(round=1, noise_multiplier=2.0, sampling_rate=0.1, releases=2)
    data = ledger.to_dict()
    assert data["relation"] == "replace_one"
    restored = PrivacyLedger.from_dict(json.loads(json.dumps(data, allow_nan=False)))
    assert restored == ledger and restored.relation == "replace_one"
    assert restored.spent() == ledger.spent()
    config_record = pytest.importorskip("flwr.app").ConfigRecord
    assert PrivacyLedger.from_dict(dict(config_record(data))) == ledger
    old = {key: value for key, value in data.items() if key != "relation"}
    assert PrivacyLedger.from_dict(old).relation == "add_remove"
    with pytest.raises(ValueError, match="relation must be one of"):
        PrivacyLedger.from_dict(data | {"relation": "swap"})


def test_rdp_ledger_under_replace_one_is_refused() -> None:
    with pytest.raises(ValueError, match="accountant='rdp' cannot account relation='replace_one'"):
        PrivacyLedger(1.0, DELTA, accountant="rdp", relation="replace_one")
    data = PrivacyLedger(1.0, DELTA, accountant="rdp").to_dict()
    with pytest.raises(ValueError, match="cannot account relation='replace_one'"):
        PrivacyLedger.from_dict(data | {"relation": "replace_one"})


# --------------------------------------------------------------------------------------------------------------------
# The dp-accounting API the ledger relies on (public only) and the versions it was checked against
# --------------------------------------------------------------------------------------------------------------------


def _release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as ``"0.6.0"`` or ``"0.7.0rc1"`` (a pre-release counts as it)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    assert match, f"unparseable version {version!r}"
    major, minor, patch = match.groups(default="0")
    return int(major), int(minor), int(patch)


def test_dp_accounting_version_is_one_the_ledger_was_checked_against() -> None:
    installed = importlib.metadata.version("dp-accounting")
    low, high = DP_ACCOUNTING_CHECKED
    assert _release(low) <= _release(installed) < _release(high), (
        f"dp-accounting {installed} is installed, but protocols/privacy/composition.py was checked against "
        f">={low},<{high} (DP_ACCOUNTING_CHECKED). The ledger's engines re-implement the library's RDP -> epsilon "
        f"conversion (rdp_to_epsilon vs rdp.compute_epsilon) and PLDAccountant's composition, and read "
        f"RdpAccountant.orders / .rdp, so that a silo admits exactly the steps calibrate_noise chose. Re-run "
        f"tests/protocols/privacy/test_ledger.py and tests/protocols/privacy/test_accountant.py on {installed}, "
        f"read its changelog for rdp_privacy_accountant and pld, then widen DP_ACCOUNTING_CHECKED and the "
        f"dp-accounting bound in pyproject.toml."
    )


@pytest.mark.parametrize(("sigma", "q"), [(1.0, 0.01), (0.6, 0.5), (20.0, 1.0)])
def test_rdp_curve_is_the_library_curve_through_public_properties(sigma: float, q: float) -> None:
    from silofl.protocols.privacy.composition import rdp_curve

    for name in ("orders", "rdp"):
        assert isinstance(getattr(RdpAccountant, name, None), property), (
            f"dp_accounting.rdp.RdpAccountant.{name} is no longer a public property "
            f"(dp-accounting {importlib.metadata.version('dp-accounting')}); "
            f"protocols/privacy/composition.py:rdp_curve reads the RDP curve through it. Find the library's new "
            f"public way to get (orders, rdp), and re-check DP_ACCOUNTING_CHECKED."
        )
    orders, curve = rdp_curve(sigma, q)
    steps = 37
    library = RdpAccountant().compose(dp_event(sigma, q, steps))
    # Bit for bit: the ledger's per-step curve times its steps is what the library accumulates for the same steps.
    assert orders.dtype == curve.dtype == np.float64
    assert np.array_equal(orders, library.orders)
    assert np.array_equal(steps * curve, library.rdp)
    assert not orders.flags.writeable and not curve.flags.writeable


def test_ledger_and_accountant_use_no_private_dp_accounting_names() -> None:
    """No ``obj._name`` on anything but ``self`` / ``cls``, and no underscore name imported from dp_accounting."""
    root = Path(__file__).resolve().parents[3] / "protocols" / "privacy"
    found = []
    for name in (
        "ledger.py",
        "composition.py",
        "admission.py",
        "accountant.py",
        "checks.py",
        "events.py",
        "epsilon.py",
        "calibration.py",
    ):
        path = root / name
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            private = []
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}):
                    private.append(ast.unparse(node))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dp_accounting"):
                private += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            found += [f"{path.name}:{node.lineno}: {name}" for name in private]
    assert not found, f"private attributes / names of other objects (use dp-accounting's public API): {found}"


def test_entries_spanning_gaps_in_the_charged_rounds_round_trip_and_bad_ones_are_refused() -> None:
    """Consecutive charges with one mechanism merge into one entry even across skipped rounds; the consistency check
    walks entries and round runs side by side (it used to expand every round number)."""
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="rdp")
    for round_number, sigma in [(0, 4.0), (2, 1.0), (3, 1.0), (7, 1.0), (8, 2.0), (10, 2.0)]:
        ledger.charge(round=round_number, noise_multiplier=sigma, sampling_rate=0.1)
    assert ledger.round_runs == [(0, 1), (2, 2), (7, 2), (10, 1)] and [e.round for e in ledger.entries] == [0, 2, 8]
    assert PrivacyLedger.from_dict(ledger.to_dict()) == ledger
    data = ledger.to_dict()
    with pytest.raises(ValueError, match=r"entries\[2\].round is 7 but round_runs say 8"):
        PrivacyLedger.from_dict(data | {"entry_round": [0, 2, 7]})
    with pytest.raises(ValueError, match="entries cover"):
        PrivacyLedger.from_dict(data | {"round_run_length": [1, 2, 2, 2]})
    overlong = [LedgerEntry(0, 4.0, 1.0, 1, 1), LedgerEntry(1, 1.0, 0.1, 1, 6, 6), LedgerEntry(9, 2.0, 0.1, 1, 1)]
    with pytest.raises(ValueError, match="starts after the last round"):  # the round counts add up, their places not
        PrivacyLedger(math.inf, DELTA, entries=[*overlong, LedgerEntry(9, 2.0, 0.1, 1, 1, -2)], round_runs=[(0, 6)])


def test_copy_is_independent_of_its_original() -> None:
    ledger = PrivacyLedger(epsilon_budget=5.0, delta=DELTA, accountant="best")
    ledger.charge(round=1, noise_multiplier=1.0, sampling_rate=0.1)
    clone = ledger.copy()
    assert clone == ledger and clone.spent() == ledger.spent()
    clone.charge(round=2, noise_multiplier=1.0, sampling_rate=0.1)
    assert ledger.rounds() == [1] and ledger.entries == [LedgerEntry(1, 1.0, 0.1, 1, 1, 1)]
    assert clone.rounds() == [1, 2] and clone.spent() > ledger.spent()


@pytest.mark.slow
@pytest.mark.parametrize("relation", ["add_remove", "replace_one"])
def test_figures_do_not_depend_on_the_module_caches(relation: str) -> None:
    """clear_caches() (benchmarks call it before each timed run) changes no figure: every cached PLD, prefix and
    RDP curve is recomputed the same way."""
    from silofl.protocols.privacy.ledger import clear_caches

    def figures() -> list[float]:
        ledger = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA, accountant="best", relation=relation)
        out = [ledger.charge(round=0, noise_multiplier=6.0, sampling_rate=1.0)]
        out += [ledger.charge(round=r, noise_multiplier=2.0, sampling_rate=0.05, releases=2) for r in range(1, 40)]
        return [*out, ledger.spent(), *(eps for _, eps in ledger.history(max_points=5))]

    clear_caches()
    cold = figures()
    assert figures() == cold
    clear_caches()
    assert figures() == cold
