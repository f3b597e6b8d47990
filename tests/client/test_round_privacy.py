"""A silo's round privacy (client/round_privacy.py) through the real ClientApp: the mechanism and the instruction are
bound at the first private answer, and a later message that changes anything the noise or the accounting depends on
is refused before anything is charged; the ledger charges the bound mechanism's event."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from silofl.client import privacy_state
from silofl.protocols import messages as msg
from silofl.protocols.privacy.accountant import library_relation, pld_value_discretization
from tests.silo_driver import FAIRNESS, SiloDriver

SPEC = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0, max_train_records=200)


def _driver(algorithm: str, **fields) -> SiloDriver:
    driver = SiloDriver(algorithm, spec=SPEC, **fields)
    driver.setup()
    assert not driver.groups().has_error()
    return driver


@pytest.mark.parametrize("algorithm", ["steffle", "tran"])
def test_a_prior_changed_mid_run_is_refused_before_anything_is_charged(algorithm: str) -> None:
    """The W radius (SteFFLe) and the group weights follow from the prior: a server that sends another prior after
    the silo calibrated would change what one record's release can move. Bound at its first round."""
    driver = _driver(algorithm)
    driver.report(driver.train(1))
    before = driver.ledger().rounds()
    other = {**FAIRNESS[algorithm], "prior": np.array([0.1, 0.9], np.float32)}
    refused = driver.train(2, fairness=other)
    assert refused.has_error() and "changed 'prior'" in refused.error.reason
    assert driver.ledger().rounds() == before
    driver.report(driver.train(2))  # the bound prior is answered as before


@pytest.mark.parametrize(
    ("change", "field"),
    [({"clip": 2.0}, "clip"), ({"batch_size": 65}, "batch-size"), ({"total_rounds": 11}, "total-rounds")],
)
def test_an_instruction_changed_mid_run_is_refused_naming_the_field(change: dict, field: str) -> None:
    driver = _driver("steffle")
    driver.report(driver.train(1))
    refused = driver.train(2, **change)
    assert refused.has_error() and f"changed '{field}'" in refused.error.reason
    assert driver.ledger().rounds() == [0, 1]


def test_the_ledger_charges_the_bound_mechanisms_event() -> None:
    """After the run, the ledger's epsilon is dp-accounting's PLD of the calibrated mechanism's own event (the
    histogram, then T Poisson-subsampled steps of two releases), and within the silo's budget."""
    from silofl.client.rounds.steffle import mechanism

    driver = _driver("steffle", total_rounds=6)
    reports = [driver.report(driver.train(t)) for t in range(1, 7)]
    cal = driver.calibration()
    assert driver.info is not None
    event = mechanism(driver.info.n_train, driver.instruction(1)).dp_event(cal["noise-multiplier"], (cal["one-off"],))
    grid = min(
        pld_value_discretization(cal["one-off"], 1.0),
        pld_value_discretization(cal["noise-multiplier"] / math.sqrt(2), cal["sampling-rate"]),
    )
    accountant = PLDAccountant(neighboring_relation=library_relation("replace_one"), value_discretization_interval=grid)
    want = accountant.compose(event).get_epsilon(1e-6)
    assert driver.ledger().spent() == pytest.approx(want, rel=1e-6)
    assert reports[-1].epsilon_spent == pytest.approx(want, rel=1e-6) and want <= 1.0 * (1 + 1e-9)


def test_the_bound_instruction_is_every_field_but_the_per_round_ones() -> None:
    driver = _driver("steffle")
    driver.report(driver.train(1))
    bound = dict(driver.context.state[privacy_state.INSTRUCTION_KEY])
    assert bound["batch_size"] == 64 and bound["clip"] == driver.instruction(1).clip
    assert not set(msg.PER_ROUND_FIELDS) & set(bound)
    driver.report(driver.train(2, lr=0.01))  # a learning-rate schedule is the server's to change
