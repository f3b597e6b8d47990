"""A silo's mechanism as dp-accounting events (protocols/privacy/mechanism.py): the event the calibration, the ledger
and the report account is the run the round code makes; two messages describe the same mechanism exactly when their
bindings are equal; shapes the ledger cannot hold are refused."""

from __future__ import annotations

import math

import pytest
from dp_accounting import ComposedDpEvent, GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.pld import PLDAccountant

from silofl.protocols.privacy.accountant import (
    calibrate_noise,
    epsilon_spent,
    library_relation,
    pld_value_discretization,
)
from silofl.protocols.privacy.ledger import PrivacyLedger
from silofl.protocols.privacy.mechanism import Mechanism, Release, SetupRelease

DELTA = 1e-6


def _dp_fedsgd(batch: int = 64, clip: float = 1.0) -> Mechanism:
    return Mechanism(
        relation="add_remove",
        sampling="poisson",
        sampling_rate=batch / 1000,
        steps=40,
        releases=(Release("gradient", radius=clip),),
        parameters={"batch-size": batch},
    )


def _steffle(sampling: str = "poisson") -> Mechanism:
    epochs = sampling == "epochs"
    return Mechanism(
        relation="replace_one",
        sampling=sampling,  # type: ignore[arg-type]
        sampling_rate=1.0 if epochs else 0.05,
        steps=3 if epochs else 40,
        rounds_per_step=20 if epochs else 1,
        releases=(Release("theta", radius=1.0), Release("w", radius=None)),
        setup=(SetupRelease("group-counts", share=0.1, radius=math.sqrt(2) / 2),),
    )


def _fedfdp() -> Mechanism:
    return Mechanism(
        relation="add_remove",
        sampling="poisson",
        sampling_rate=0.05,
        steps=40,
        releases=(Release("update", radius=1.0), Release("loss", radius=None, sample="loss", ratio=2.5)),
    )


def _pld(event, relation: str, grid: float) -> float:
    accountant = PLDAccountant(neighboring_relation=library_relation(relation), value_discretization_interval=grid)
    return float(accountant.compose(event).get_epsilon(DELTA))


def test_the_event_is_the_accountants_run() -> None:
    """dp-accounting's PLD of `dp_event` is the figure the accountant gives for the same run (calibration and
    ledger): one Poisson-subsampled Gaussian per step, the histogram composed before the rounds under replace-one,
    and a companion release on its own sample composed beside the step's."""
    m = _dp_fedsgd()
    grid = pld_value_discretization(2.0, m.sampling_rate)
    assert m.dp_event(2.0) == SelfComposedDpEvent(PoissonSampledDpEvent(0.064, GaussianDpEvent(2.0)), 40)
    assert _pld(m.dp_event(2.0), "add_remove", grid) == pytest.approx(
        epsilon_spent(2.0, 0.064, 40, DELTA, accountant="pld"), rel=1e-9
    )
    s = _steffle()
    event = s.dp_event(3.0, (5.0,))
    assert event == ComposedDpEvent(
        [
            GaussianDpEvent(5.0),
            SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(3.0 / math.sqrt(2))), 40),
        ]
    )
    grid = min(pld_value_discretization(5.0, 1.0), pld_value_discretization(3.0 / math.sqrt(2), 0.05))
    want = epsilon_spent(3.0, 0.05, 40, DELTA, releases=2, relation="replace_one", prior=[(5.0,)])
    assert _pld(event, "replace_one", grid) == pytest.approx(want, rel=1e-6)
    f = _fedfdp()
    want = epsilon_spent(2.0, 0.05, 40, DELTA, accountant="pld", companion=5.0)
    grid = pld_value_discretization(2.0, 0.05)
    assert _pld(f.dp_event(2.0), "add_remove", grid) == pytest.approx(want, rel=1e-3)


@pytest.mark.slow
def test_calibration_is_the_accountants_for_the_same_run() -> None:
    s = _steffle()
    cal = s.calibrate(1.0, DELTA, "best")
    histogram = calibrate_noise(0.1, DELTA, 1.0, 1, relation="replace_one").noise_multiplier
    want = calibrate_noise(1.0, DELTA, 0.05, 40, releases=2, relation="replace_one", prior=[(histogram, 1.0, 1)])
    assert cal.setup_multipliers == (histogram,) and cal.multiplier == want.noise_multiplier
    assert cal.epsilon == want.epsilon <= 1.0
    f = _fedfdp()
    want = calibrate_noise(1.0, DELTA, 0.05, 40, companion_ratio=2.5)
    assert f.calibrate(1.0, DELTA, "best").multiplier == want.noise_multiplier
    assert _dp_fedsgd().calibrate(math.inf, DELTA, "best").multiplier == 0.0  # no budget: no noise
    fixed = Mechanism("add_remove", "none", 1.0, 10, (Release("q", radius=0.5),), fixed_multiplier=4.0)
    assert fixed.calibrate(1.0, DELTA, "rdp").multiplier == 4.0
    assert fixed.calibrate(1.0, DELTA, "rdp").epsilon == epsilon_spent(4.0, 1.0, 10, DELTA, accountant="rdp")


@pytest.mark.slow
def test_the_ledger_charges_the_same_event() -> None:
    """Charging `ledger_step` every round gives the accountant's epsilon of the whole run (the last round exact)."""
    for mechanism, relation in ((_dp_fedsgd(), "add_remove"), (_fedfdp(), "add_remove")):
        ledger = PrivacyLedger(epsilon_budget=100.0, delta=DELTA, accountant="pld", relation=relation)
        for t in range(1, mechanism.steps + 1):
            ledger.charge(round=t, **mechanism.ledger_step(2.0))
        companion = 2.0 * mechanism.companion_ratio if math.isfinite(mechanism.companion_ratio) else math.inf
        want = epsilon_spent(2.0, mechanism.sampling_rate, 40, DELTA, accountant="pld", companion=companion)
        assert ledger.spent() == pytest.approx(want, rel=1e-9)


def test_bindings_differ_exactly_when_the_mechanisms_do() -> None:
    assert _dp_fedsgd().binding() == _dp_fedsgd().binding()
    for other in (_dp_fedsgd(batch=65), _dp_fedsgd(clip=2.0)):
        assert other.binding() != _dp_fedsgd().binding()
    assert _steffle().binding() != _steffle("epochs").binding()
    changed = {k for k, v in _dp_fedsgd(batch=65).binding().items() if _dp_fedsgd().binding()[k] != v}
    assert changed == {"sampling-rate", "parameter.batch-size"}


def test_shapes_the_ledger_cannot_hold_are_refused() -> None:
    step = Release("a", radius=1.0)
    with pytest.raises(ValueError, match="at most one companion"):
        Mechanism(
            "add_remove",
            "poisson",
            0.1,
            5,
            (step, Release("b", 1.0, sample="x"), Release("c", 1.0, sample="y")),
        )
    with pytest.raises(ValueError, match="ratio 1"):
        Mechanism("add_remove", "poisson", 0.1, 5, (Release("a", 1.0, ratio=2.0),))
    with pytest.raises(ValueError, match="rate 1"):
        Mechanism("replace_one", "epochs", 0.5, 5, (step,), rounds_per_step=3)
    with pytest.raises(ValueError, match="share"):
        SetupRelease("h", share=1.0, radius=1.0)
    with pytest.raises(ValueError, match="distinct"):
        Mechanism("add_remove", "poisson", 0.1, 5, (step, step))
    with pytest.raises(ValueError, match="radius"):
        Release("a", radius=math.inf)
