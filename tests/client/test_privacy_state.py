"""client.privacy_state with shuffled epochs, on the real ClientApp of a SteFFLe silo: one unsampled release per
epoch, charged at the epoch's first round before anything of it is computed; the ledger equals the accountant's
composition; refusals past the budget and of a round asked again; the pending mark and the journal
(client.answer_journal)."""

from __future__ import annotations

import pytest

from silofl.client import answer_journal, privacy_state
from silofl.client.algorithms import steffle as steffle_algo
from silofl.protocols import messages as msg
from silofl.protocols.privacy.accountant import calibrate_noise, epsilon_spent
from tests.silo_driver import SiloDriver

#: 100 records per silo in batches of 32: B = 4 batches per epoch (the last of 4 records).
SPEC = msg.DataSpec(dataset="synthetic", num_silos=2, seed=0, max_train_records=100)
SHUFFLE = {"sampling": "shuffle", "batch_size": 32, "epsilon": 1.0, "delta": 1e-6}


def _silo(total_rounds: int, **node_config) -> SiloDriver:
    driver = SiloDriver("steffle", spec=SPEC, node_config=node_config, total_rounds=total_rounds, **SHUFFLE)
    driver.setup()
    assert not driver.groups().has_error()
    return driver


def _composition(driver: SiloDriver, epochs: int) -> float:
    """The accountant's epsilon of the histogram and `epochs` unsampled releases of the silo's two vectors."""
    cal = driver.calibration()
    return epsilon_spent(
        cal["noise-multiplier"], 1.0, epochs, 1e-6, releases=2, relation="replace_one", prior=[(cal["one-off"],)]
    )


def test_the_ledger_after_k_epochs_is_the_composition_of_k_unsampled_gaussians_after_the_histogram() -> None:
    driver = _silo(total_rounds=10)  # B = 4: epochs 1 and 2 whole, epoch 3 partial (rounds 9 and 10)
    reports = [driver.report(driver.train(t)) for t in range(1, 11)]
    cal = driver.calibration()
    assert (cal["sampling"], cal["sampling-rate"], cal["steps"], cal["rounds-per-step"]) == ("epochs", 1.0, 3, 4)
    expected = calibrate_noise(1.0, 1e-6, 1.0, 3, releases=2, relation="replace_one", prior=[(cal["one-off"],)])
    assert cal["noise-multiplier"] == expected.noise_multiplier  # calibrated for E = 3 unsampled steps
    ledger = driver.ledger()
    assert ledger.rounds() == [0, 1, 5, 9]  # the histogram, then each epoch at its first round
    assert [(e.sampling_rate, e.releases, e.steps) for e in ledger.entries] == [(1.0, 1, 1), (1.0, 2, 3)]
    assert ledger.spent() == pytest.approx(_composition(driver, 3), rel=1e-12)
    assert reports[-1].epsilon_spent == ledger.spent()  # the last epoch reports the exact figure
    assert 0.99 < reports[-1].epsilon_spent <= 1.0 * (1 + 1e-9)  # the target, hit by the calibration
    for k, last in ((1, 4), (2, 8)):  # within epoch k every report is the figure charged at its first round
        figures = {r.epsilon_spent for r in reports[last - 4 : last]}
        assert len(figures) == 1
        assert _composition(driver, k) <= figures.pop() <= _composition(driver, k + 1)
    assert all(r.sampling_rate == pytest.approx(32 / 100) for r in reports)  # the batch's share of the records


def test_the_epoch_is_charged_before_its_first_round_computes_anything(monkeypatch) -> None:
    driver = _silo(total_rounds=8)
    seen: dict[int, list[int]] = {}
    real = steffle_algo.fairness_gradients

    def watch(*args, **kwargs):
        ledger = driver.ledger()
        seen[len(seen) + 1] = ledger.rounds()
        return real(*args, **kwargs)

    monkeypatch.setattr(steffle_algo, "fairness_gradients", watch)
    for t in range(1, 9):
        driver.report(driver.train(t))
    assert seen[1] == [0, 1] and seen[5] == [0, 1, 5]  # charged before the round's sensitive division ran
    assert all(seen[t] == [0, 1] for t in (2, 3, 4)) and all(seen[t] == [0, 1, 5] for t in (6, 7, 8))


def test_a_silo_refuses_the_epochs_past_its_budget() -> None:
    driver = _silo(total_rounds=4)  # one epoch announced: the budget pays for one
    for t in range(1, 5):
        driver.report(driver.train(t))
    before = dict(driver.context.state[privacy_state.LEDGER_KEY])
    for t in (5, 6):  # epoch 2 is never paid for: its first round and the next are refused
        refused = driver.train(t)
        assert refused.has_error() and "BudgetExceededError" in refused.error.reason
        assert f"refuses to answer round {t}" in refused.error.reason and "silo 0" in refused.error.reason
    assert dict(driver.context.state[privacy_state.LEDGER_KEY]) == before


def test_an_operator_cap_means_more_noise_and_the_silo_stays_within_it(tmp_path) -> None:
    policy = tmp_path / "policy.toml"  # a budgeted silo answers SteFFLe (its g is in the clear) only if listed
    policy.write_text('algorithms = ["steffle"]\n')
    capped = _silo(total_rounds=8, **{"epsilon-budget": 0.5, "policy": str(policy)})
    free = _silo(total_rounds=8)
    spent = [capped.report(capped.train(t)).epsilon_spent for t in range(1, 9)]
    assert capped.report(free.train(1)).noise_multiplier < capped.calibration()["noise-multiplier"]
    assert 0.49 < spent[-1] <= 0.5 * (1 + 1e-9)
    assert capped.train(9).has_error()


def test_each_round_is_answered_once_and_in_order() -> None:
    driver = _silo(total_rounds=8)
    for t in (1, 2, 3):
        driver.report(driver.train(t))
    for t, needle in ((3, "round 3 was already answered"), (2, "round 2 comes before the last answered round")):
        refused = driver.train(t)  # a second answer would put the batch's records twice in the epoch
        assert refused.has_error() and needle in refused.error.reason
    assert driver.ledger().rounds() == [0, 1]
    driver.report(driver.train(7))  # a server may skip rounds: epoch 2 is paid for at the first round it asks
    assert driver.ledger().rounds() == [0, 1, 7]
    assert driver.train(5).has_error()
    reseeded = driver.train(8, seed=1)  # another permutation mid-epoch could put a record in two of its batches
    assert reseeded.has_error() and "changed 'seed' from 0 to 1" in reseeded.error.reason
    resized = driver.train(8, batch_size=31)  # B stays 4: the boundaries of the epoch's batches would move
    assert resized.has_error() and "changed 'batch-size' from 32 to 31" in resized.error.reason
    assert driver.ledger().rounds() == [0, 1, 7]  # refused before anything was charged


def test_a_pending_round_is_answered_once_and_then_replayed(tmp_path, monkeypatch) -> None:
    """With a state-dir: a silo that went down after admitting a round (mid-epoch and an epoch's first) but before
    releasing it answers it when asked again without a second charge; the answer is then journaled and replayed."""
    state = {privacy_state.STATE_DIR_KEY: str(tmp_path / "silo")}
    driver = _silo(total_rounds=8, **state)
    driver.report(driver.train(1))
    real_answered = answer_journal.answered

    def dies_before_release(context, kind, server_round, digest, content):
        if kind == "train" and server_round in (2, 5):
            raise RuntimeError(f"the silo lost power after admitting round {server_round}")
        real_answered(context, kind, server_round, digest, content)

    monkeypatch.setattr(answer_journal, "answered", dies_before_release)
    assert driver.train(2).has_error()
    assert privacy_state.PENDING_KEY in driver.context.state
    monkeypatch.setattr(answer_journal, "answered", real_answered)
    restarted = SiloDriver("steffle", spec=SPEC, node_config=state, total_rounds=8, **SHUFFLE)
    restarted.info = driver.info
    answer = restarted.train(2)
    restarted.report(answer)
    assert restarted.ledger().rounds() == [0, 1]  # round 2 was admitted once, before the crash
    assert restarted.train(2).content[msg.FAIR_UPDATE]["w"].data == answer.content[msg.FAIR_UPDATE]["w"].data
    for t in (3, 4):
        restarted.report(restarted.train(t))
    monkeypatch.setattr(answer_journal, "answered", dies_before_release)
    assert restarted.train(5).has_error()  # epoch 2 charged, its first answer never released
    monkeypatch.setattr(answer_journal, "answered", real_answered)
    assert restarted.ledger().rounds() == [0, 1, 5]
    restarted.report(restarted.train(5))
    assert restarted.ledger().rounds() == [0, 1, 5]  # answered now, not charged twice
    assert privacy_state.PENDING_KEY not in restarted.context.state
