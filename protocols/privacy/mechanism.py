"""A silo's mechanism for one run, described completely: its Gaussian releases as dp-accounting events, and every
parameter their sensitivity depends on (pure; no Flower, no torch).

Every private algorithm of silofl makes, per accounted step, one or more Gaussian releases of sums of per-record
contributions that lie in a ball around 0 (the contribution of a record that is not used), possibly after one
unsampled release before the rounds. A :class:`Mechanism` says exactly that and nothing more:

* ``relation``: the neighbouring relation (``add_remove`` records, ``replace_one`` a record's sensitive attribute);
* ``sampling_rate`` and ``steps``: each step is a Poisson sample of rate q (1: every record, or one batch of a
  shuffled epoch, accounted without amplification: ``rounds_per_step`` rounds share one step), ``steps`` of them;
* ``releases``: what a step releases. Releases computed on the same sample (same ``sample`` name) are one Gaussian
  mechanism of combined multiplier ``sigma / sqrt(K)`` (:func:`protocols.privacy.accountant.combined_noise_multiplier`);
  a release on another, independent Poisson sample of the same rate is a second mechanism composed with the first
  (FedFDP's loss release at ``ratio`` 2.5 x the calibrated multiplier);
* ``setup``: unsampled releases before the rounds, each calibrated alone for its ``share`` of the budget (SteFFLe's
  group-count histogram), then composed with the rounds;
* ``parameters``: everything else the sensitivity depends on (batch size, clip, domain diameter, trust, the run seed
  of shuffled epochs, ...).

:meth:`Mechanism.dp_event` is the run as one ``ComposedDpEvent``; the calibration (:meth:`Mechanism.calibrate`), the
silo's ledger (:meth:`Mechanism.ledger_step`) and the privacy report account that same event. A silo binds its
mechanism at its first private answer (``client.round_privacy``) and refuses any later message whose mechanism, built
from that message, differs in any field: nothing the noise or the accounting depends on is read from a later round's
instruction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the accountants (dp-accounting) are imported when a silo first calibrates or charges: a deployed
    # ClientApp is a fresh process per message, and a message that is refused or non-private needs neither
    import dp_accounting

    from silofl.protocols.privacy.accountant import Calibration

Sampling = Literal["poisson", "none", "epochs"]
SAMPLINGS: tuple[str, ...] = ("poisson", "none", "epochs")
#: The sample of a step's main releases (every release but a companion on its own sample).
STEP_SAMPLE = "step"
Scalar = float | int | str


@dataclass(frozen=True)
class Release:
    """One Gaussian release per step.

    ``radius``: the norm bound of one record's contribution to the released sum (add/remove: its L2 sensitivity;
    replace-one: the radius of the ball around 0 it lies in); the noise std is ``multiplier x ratio x radius``.
    ``None``: a bound the silo sets itself each round from its own earlier releases (FedFDP's adaptive loss bound),
    not from the server. ``sample``: the Poisson sample it is computed on (:data:`STEP_SAMPLE`, or another name for a
    release on its own independent sample). ``ratio``: its noise multiplier relative to the calibrated one.
    """

    name: str
    radius: float | None
    sample: str = STEP_SAMPLE
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.radius is not None and not (math.isfinite(self.radius) and self.radius > 0):
            raise ValueError(f"release {self.name!r}: radius must be finite and > 0, got {self.radius!r}")
        if not (self.ratio > 0):
            raise ValueError(f"release {self.name!r}: ratio must be > 0 (inf: reveals nothing), got {self.ratio!r}")


@dataclass(frozen=True)
class SetupRelease:
    """One unsampled Gaussian release before the rounds, calibrated alone for ``share`` x the budget and composed
    with the rounds (SteFFLe's and Tran's group-count histogram: radius sqrt(2)/2 under replace-one)."""

    name: str
    share: float
    radius: float

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"setup release {self.name!r}: share must be in (0, 1), got {self.share!r}")


@dataclass(frozen=True)
class Calibrated:
    """What :meth:`Mechanism.calibrate` chose: the per-release noise multiplier of the steps, that of each setup
    release, and the accountant's epsilon for the whole run at those multipliers."""

    multiplier: float
    setup_multipliers: tuple[float, ...]
    epsilon: float


@dataclass(frozen=True)
class Mechanism:
    """A silo's run of Gaussian releases (module docstring)."""

    relation: str
    sampling: Sampling
    sampling_rate: float
    steps: int
    releases: tuple[Release, ...]
    setup: tuple[SetupRelease, ...] = ()
    #: shuffled epochs: rounds per accounted step (B_j); 1 otherwise
    rounds_per_step: int = 1
    #: the algorithm fixes its noise multiplier itself (DP-mu2-FL's sqrt(T) / rho); None: calibrated for the budget
    fixed_multiplier: float | None = None
    #: what else the sensitivity depends on, by name (kebab-case, as the run option that sets it)
    parameters: Mapping[str, Scalar] = field(default_factory=dict)
    #: each release's radius is already the distance between two neighbours' values when one record is replaced
    #: (DP-mu2-FL's 2 S / b, accounted at rate 1 as a Gaussian of that sensitivity), not the radius of a ball around 0
    #: (:meth:`replace_one_events`)
    radius_is_distance: bool = False

    def __post_init__(self) -> None:
        if self.relation not in ("add_remove", "replace_one"):
            raise ValueError(f"relation must be add_remove or replace_one, got {self.relation!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not 0.0 < self.sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")
        if self.sampling != "poisson" and self.sampling_rate != 1.0:
            raise ValueError(f"{self.sampling} sampling is accounted at rate 1 (no amplification)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not self.releases:
            raise ValueError("a mechanism makes at least one release per step")
        names = [r.name for r in self.releases] + [s.name for s in self.setup]
        if len(set(names)) != len(names):
            raise ValueError(f"release names must be distinct, got {names}")
        if self.rounds_per_step < 1 or (self.sampling != "epochs" and self.rounds_per_step != 1):
            raise ValueError("rounds_per_step is the batches of one shuffled epoch (>= 1), and 1 for other sampling")
        main = self.on_sample(STEP_SAMPLE)
        if not main or any(r.ratio != 1.0 for r in main):
            raise ValueError("the step's own sample carries the calibrated releases, each at ratio 1")
        others = [r for r in self.releases if r.sample != STEP_SAMPLE]
        if len(others) > 1:
            raise ValueError("at most one companion release on its own sample (what the silo's ledger composes)")
        if len(self.setup) > 1:
            raise ValueError("at most one setup release (what the silo's ledger holds at round 0)")

    # -- shape ---------------------------------------------------------------------------------------------------------

    def on_sample(self, sample: str) -> tuple[Release, ...]:
        """The releases computed on `sample`."""
        return tuple(r for r in self.releases if r.sample == sample)

    @property
    def releases_per_step(self) -> int:
        """K: the calibrated releases of one step, on its own sample (one mechanism of multiplier sigma / sqrt(K))."""
        return len(self.on_sample(STEP_SAMPLE))

    @property
    def companion_ratio(self) -> float:
        """The multiplier ratio of the release on its own sample (``inf``: none)."""
        others = [r for r in self.releases if r.sample != STEP_SAMPLE]
        return others[0].ratio if others else math.inf

    # -- events --------------------------------------------------------------------------------------------------------

    def step_event(self, multiplier: float) -> dp_accounting.DpEvent:
        """One accounted step at per-release multiplier `multiplier`: per sample, ``PoissonSampled(q, Gaussian(...))``
        of the sample's releases combined (``Gaussian`` alone at rate 1); several samples composed."""
        import dp_accounting

        from silofl.protocols.privacy import accountant as acc

        events = []
        for sample in dict.fromkeys(r.sample for r in self.releases):
            ratios = [r.ratio for r in self.on_sample(sample)]
            if len(set(ratios)) == 1:  # K releases at one multiplier: sigma / sqrt(K), as `accountant.dp_event` has it
                combined = multiplier * ratios[0] / math.sqrt(len(ratios))
            else:
                combined = acc.combined_noise_multiplier([multiplier * r for r in ratios])
            gaussian = dp_accounting.GaussianDpEvent(combined)
            q = self.sampling_rate
            events.append(gaussian if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian))
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)

    def dp_event(self, multiplier: float, setup_multipliers: tuple[float, ...] = ()) -> dp_accounting.DpEvent:
        """The whole run: the setup releases (each a ``Gaussian`` at its multiplier), then ``steps`` steps."""
        import dp_accounting

        if len(setup_multipliers) != len(self.setup):
            raise ValueError(f"{len(self.setup)} setup multipliers needed, got {len(setup_multipliers)}")
        parts = [dp_accounting.GaussianDpEvent(s) for s in setup_multipliers]
        parts.append(dp_accounting.SelfComposedDpEvent(self.step_event(multiplier), self.steps))
        return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)

    def ledger_step(self, multiplier: float) -> dict[str, float | int]:
        """What the silo's ledger charges for one step (`PrivacyLedger.charge` keywords): the same event."""
        return {
            "noise_multiplier": multiplier,
            "sampling_rate": self.sampling_rate,
            "releases": self.releases_per_step,
            "companion": math.inf if math.isinf(self.companion_ratio) else self.companion_ratio * multiplier,
        }

    def replace_one_events(
        self, multiplier: float, setup_multipliers: tuple[float, ...] = ()
    ) -> tuple[tuple[float | tuple[float, ...], float, int], ...]:
        """The whole run as ledger states under *replacing one record* (``replace_one``): what a silo's lifetime
        ledger composes across its jobs (`client.lifetime_ledger`), as ``(multiplier, sampling rate, steps)`` keys of
        :mod:`protocols.privacy.ledger` (a companion release makes the multiplier a pair).

        Every release of silofl is a sum of per-record contributions in a ball of radius R around 0 (the
        contribution of an absent or unsampled record; module docstring). Replacing a record moves its contribution
        within that ball, which is dp-accounting's ``REPLACE`` adjacency at the same multiplier: so an ``add_remove``
        mechanism's events hold under ``replace_one`` as they are, and so do SteFFLe's (its relation already). A
        release whose radius is the replacement distance itself (:attr:`radius_is_distance`, at rate 1 only) is a
        Gaussian of that sensitivity, i.e. ``REPLACE`` at twice the multiplier (at rate 1 ``REPLACE`` at radius R is a
        Gaussian of sensitivity 2 R)."""
        if self.radius_is_distance and self.sampling_rate != 1.0:
            raise ValueError("a release whose radius is the replacement distance is accounted at rate 1 only")
        factor = 2.0 if self.radius_is_distance else 1.0
        step = self.ledger_step(multiplier)
        combined = factor * float(step["noise_multiplier"]) / math.sqrt(int(step["releases"]))
        companion = float(step["companion"])
        key: float | tuple[float, ...] = combined if math.isinf(companion) else (combined, factor * companion)
        setup = tuple((factor * s, 1.0, 1) for s in setup_multipliers)
        return (*setup, (key, self.sampling_rate, self.steps))

    # -- calibration ---------------------------------------------------------------------------------------------------

    def calibrate(self, budget: float, delta: float, accountant: str) -> Calibrated:
        """The smallest multiplier whose run (setup releases included, one composition) stays within `budget` at
        `delta` by `accountant`; a fixed multiplier is only accounted. ``budget = inf``: no noise (multiplier 0)."""
        from silofl.protocols.privacy import accountant as acc

        if self.fixed_multiplier is not None:
            multiplier = self.fixed_multiplier
            eps = (
                acc.epsilon_spent(
                    multiplier,
                    self.sampling_rate,
                    self.steps,
                    delta,
                    releases=self.releases_per_step,
                    accountant=accountant,
                    relation=self.relation,
                    companion=math.inf if math.isinf(self.companion_ratio) else self.companion_ratio * multiplier,
                )
                if multiplier > 0
                else math.inf
            )
            return Calibrated(multiplier, (), eps)
        if math.isinf(budget):
            return Calibrated(0.0, tuple(0.0 for _ in self.setup), math.inf)
        setup = tuple(
            _calibrate(s.share * budget, delta, 1.0, 1, 1, accountant, self.relation, ()).noise_multiplier
            for s in self.setup
        )
        cal = _calibrate(
            budget,
            delta,
            self.sampling_rate,
            self.steps,
            self.releases_per_step,
            accountant,
            self.relation,
            tuple((s, 1.0, 1) for s in setup),
            self.companion_ratio,
        )
        return Calibrated(cal.noise_multiplier, setup, cal.epsilon)

    # -- binding -------------------------------------------------------------------------------------------------------

    def binding(self) -> dict[str, Scalar]:
        """Every field as flat scalars (a silo's ConfigRecord): two messages describe the same mechanism exactly when
        their bindings are equal, key by key."""
        out: dict[str, Scalar] = {
            "relation": self.relation,
            "sampling": self.sampling,
            "sampling-rate": self.sampling_rate,
            "steps": self.steps,
            "rounds-per-step": self.rounds_per_step,
            "fixed-multiplier": -1.0 if self.fixed_multiplier is None else self.fixed_multiplier,
            "releases": ",".join(r.name for r in self.releases),
            "setup": ",".join(s.name for s in self.setup),
        }
        for r in self.releases:
            out[f"release.{r.name}.radius"] = -1.0 if r.radius is None else r.radius
            out[f"release.{r.name}.sample"] = r.sample
            out[f"release.{r.name}.ratio"] = -1.0 if math.isinf(r.ratio) else r.ratio
        for s in self.setup:
            out[f"setup.{s.name}.share"] = s.share
            out[f"setup.{s.name}.radius"] = s.radius
        for name, value in self.parameters.items():
            out[f"parameter.{name}"] = value
        return out


_CALIBRATIONS: dict[tuple, Calibration] = {}


def _calibrate(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    releases: int,
    accountant: str,
    relation: str,
    prior: tuple[tuple[float, float, int], ...],
    companion_ratio: float = math.inf,
) -> Calibration:
    """`calibrate_noise` is a pure function of its arguments (0.2-1 s): simulated silos of equal size share it."""
    from silofl.protocols.privacy import accountant as acc

    key = (epsilon, delta, sampling_rate, steps, releases, accountant, relation, prior, companion_ratio)
    cached = _CALIBRATIONS.get(key)
    if cached is None:
        if len(_CALIBRATIONS) >= 64:
            _CALIBRATIONS.clear()
        cached = acc.calibrate_noise(
            epsilon,
            delta,
            sampling_rate,
            steps,
            releases=releases,
            accountant=accountant,
            relation=relation,
            prior=list(prior),
            companion_ratio=companion_ratio,
        )
        _CALIBRATIONS[key] = cached
    return cached


def clear_caches() -> None:
    """Forget the calibrations this process cached (a benchmark's run then pays what a fresh process pays)."""
    _CALIBRATIONS.clear()
