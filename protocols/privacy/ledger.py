"""A silo's own privacy ledger: what it has spent, and a refusal when an answer would overspend.

The silo keeps the ledger in its persistent state (Flower's ``context.state``; :meth:`PrivacyLedger.to_dict` is a flat
ConfigRecord) and charges it *before* it sends a noisy answer: under ISRL-DP (SteFFLe, Gupta et al. 2024,
Definition 2.3) every message must stay within the silo's own ``(epsilon, delta)``, whatever the server does, so the
silo, not the server, enforces the budget.

A charge is one answered round: ``steps`` Poisson-sampled steps (rate ``sampling_rate``), each releasing ``releases``
Gaussian quantities at ``noise_multiplier`` (see :func:`protocols.privacy.accountant.dp_event`). The ledger's epsilon is
the accountant's figure for the composition of everything charged, computed by the same library calls as
:func:`~protocols.privacy.accountant.epsilon_spent` and :func:`~protocols.privacy.accountant.calibrate_noise`, so a run
calibrated for ``T`` steps can charge exactly ``T`` steps.

Performance (runs of 1,000-60,000 rounds, one charge per round):

* consecutive charges with the same mechanism are merged into one :class:`LedgerEntry` (``steps`` adds up), so the
  state stays a handful of entries and ``to_dict`` stays small; charged round numbers are kept run-length encoded;
* RDP: the per-step RDP curve of each mechanism is computed once (the expensive part, ~10-40 ms) and cached; a state's
  RDP is ``sum_e steps_e * curve_e`` plus one conversion to epsilon (~0.2 ms) (:mod:`protocols.privacy.composition`);
* PLD costs 10-75 ms per evaluation. Under ``"best"`` a charge is checked with RDP first and PLD is evaluated only
  when RDP alone would refuse it (near the end of a calibrated run, where PLD is the tighter one; one search then
  certifies the rest of the run, :func:`~protocols.privacy.admission.pld_certified`). Results are cached per ledger
  state, so ``cost_after`` followed by ``charge`` of the same answer costs one evaluation.
* Under ``relation="replace_one"`` PLD is the only accountant (``"pld"`` and ``"best"`` both mean PLD; ``"rdp"`` is
  refused when the ledger is built, see :mod:`protocols.privacy.accountant`). A charge is then checked against a
  ladder of PLD evaluations of longer runs of the same mechanism (:func:`~protocols.privacy.admission.pld_ladder`):
  about ``2 log(T) / log(LADDER_RATIO)`` evaluations for a run of ``T`` charges instead of ``T``, and a returned
  figure that is exact or PLD's for a run at most ``LADDER_RATIO`` times longer. Measured at q = 256/11300, T = 1770,
  K = 2, epsilon = 1 (calibrated): 107-110 evaluations, 0.24 ms per charge on average (1.3 ms after a histogram
  entry, whose PLD makes each evaluation slower) where one exact evaluation per charge would average 6 ms (22 ms),
  and figures at most 5.1 % above the exact ones.

Releases outside the Poisson-sampled rounds, e.g. SteFFLe's setup-round histogram of group counts, are charged like a
round with ``sampling_rate=1.0`` (no sampling; one step): they become their own entry, and every epsilon is that of
the composition of all entries (one PLD convolution / one RDP sum), never a sum of epsilons. A run calibrated with
:func:`~protocols.privacy.accountant.calibrate_noise` ``(..., prior=[PriorRelease(...)])`` therefore charges its
``T`` rounds after that release, within the same budget.

This module holds the ledger's state and its rules (what is charged, in which order, against which budget, how it
is stored). The epsilon of a state is computed by :mod:`protocols.privacy.composition` (RDP and PLD engines) and the
cheap admission checks near the budget by :mod:`protocols.privacy.admission`; the names they export that callers
used from here (``composed_epsilon``, ``DP_ACCOUNTING_CHECKED``, ``LADDER_RATIO``, ...) are re-exported.
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from silofl.protocols.privacy import admission, composition
from silofl.protocols.privacy.accountant import (
    check_accountant,
    check_accountant_supports,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_relation,
    check_releases,
    check_sampling_rate,
    check_steps,
    library_accountants,
)
from silofl.protocols.privacy.admission import LADDER_RATIO
from silofl.protocols.privacy.composition import (
    DP_ACCOUNTING_CHECKED,
    RESPONSE_GRID,
    State,
    StepNoise,
    composed_epsilon,
    composed_epsilon_with_responses,
    rdp_to_epsilon,
)

__all__ = [
    "BUDGET_RELATIVE_TOLERANCE",
    "DP_ACCOUNTING_CHECKED",
    "LADDER_RATIO",
    "LEDGER_FORMAT",
    "RESPONSE_GRID",
    "BudgetExceededError",
    "LedgerEntry",
    "PrivacyLedger",
    "State",
    "StepNoise",
    "clear_caches",
    "composed_epsilon",
    "composed_epsilon_with_responses",
    "rdp_to_epsilon",
]

LEDGER_FORMAT = 1
"""Version of the :meth:`PrivacyLedger.to_dict` layout (key ``ledger_format``)."""

BUDGET_RELATIVE_TOLERANCE = 1e-9
"""A charge is admitted when its epsilon is ``<= budget * (1 + this)``: floating-point slack only, so a run calibrated
to hit its budget exactly on the last round is not refused over the last bits of a float."""

_CACHE_LIMIT = 1024
"""Figures a ledger keeps per state (``PrivacyLedger._cache``) before it starts over."""


class BudgetExceededError(RuntimeError):
    """A silo refused to answer because the answer would take its privacy spending over budget.

    Attributes name the silo, the round, the budget, what was spent before, and what the answer would have cost
    (the total epsilon after it). Nothing was charged.
    """

    def __init__(
        self, *, silo: str, round: int, budget: float, spent: float, cost: float, accountant: str, delta: float
    ) -> None:
        self.silo = silo
        self.round = round
        self.budget = budget
        self.spent = spent
        self.cost = cost
        self.accountant = accountant
        self.delta = delta
        who = f"silo {silo!r}" if silo else "this silo"
        super().__init__(
            f"{who} refuses to answer round {round}: answering would bring its privacy spending to "
            f"epsilon={cost:.6g} (accountant {accountant}, delta={delta:g}), over its budget epsilon={budget:g} "
            f"(spent before this round: {spent:.6g}). Nothing was charged. Stop requesting answers from this silo, "
            f"or lower the sampling rate / raise the noise multiplier for the remaining rounds."
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One or more consecutive answered rounds with the same mechanism.

    ``round`` is the first round merged into the entry, ``rounds`` how many were merged, ``steps`` the total number of
    Poisson-sampled steps they made (``rounds * steps per round``). Each step released ``releases`` Gaussian quantities,
    each with noise std ``noise_multiplier * its L2 sensitivity`` (under ``replace_one``: x its ball radius).
    ``sampling_rate = 1.0`` is a release on the whole data set, e.g. a one-off histogram before the sampled rounds.

    ``companion`` (``inf``: none) is a second Gaussian release made each step on its OWN Poisson sample of the same
    rate, drawn independently of the first (FedFDP's loss release, Ling et al. 2024, arXiv 2402.16028 v6, Algorithm 2
    lines 16-20; the paper reuses the gradient's batch, silofl draws its own: docs/algorithms/fedfdp.md): its noise
    multiplier. The two are not one mechanism (different samples), so each step is ``PoissonSampled(q, Gaussian(s)) o
    PoissonSampled(q, Gaussian(companion))``, composed; the accountants compose ``steps`` of each (composition is
    commutative, so the interleaving of the two within the rounds does not change the figure).
    """

    round: int
    noise_multiplier: float
    sampling_rate: float
    releases: int
    steps: int
    rounds: int = 1
    companion: float = math.inf

    @property
    def steps_per_round(self) -> int:
        """Steps made by each round of the entry."""
        return self.steps // self.rounds

    @property
    def combined_noise_multiplier(self) -> float:
        """Noise multiplier of one step's releases taken together (same arithmetic as ``accountant.dp_event``)."""
        return self.noise_multiplier / math.sqrt(self.releases)

    def accounting_key(self) -> tuple[StepNoise, float, int]:
        """What the accountants see of this entry: (combined multiplier, sampling rate, steps); with a companion
        release the multiplier is the pair (combined multiplier, companion multiplier)."""
        if math.isinf(self.companion):
            return (self.combined_noise_multiplier, self.sampling_rate, self.steps)
        return ((self.combined_noise_multiplier, self.companion), self.sampling_rate, self.steps)


def clear_caches() -> None:
    """Forget every epsilon figure kept between ledgers (RDP curves, PLDs: :mod:`~protocols.privacy.composition`;
    certificates, ladders: :mod:`~protocols.privacy.admission`).

    The caches are per process and outlive the runs that fill them (a sweep's next run with the same mechanism
    evaluates nothing again); a benchmark calls this before each run it times, so that every run pays what a run in
    a fresh process pays. Figures do not change: every cached value is recomputed the same way."""
    composition.clear_caches()
    admission.clear_caches()


# --------------------------------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class PrivacyLedger:
    """A silo's privacy spending over a run, enforced by the silo itself.

    Args:
        epsilon_budget: the silo's total epsilon (``inf`` = no limit, spending is still tracked).
        delta: the silo's delta; all epsilons are at this delta.
        accountant: ``"rdp"``, ``"pld"`` or ``"best"`` (the smaller of both); use the one the noise was calibrated with.
        entries: merged charges, oldest first (normally left empty and filled by :meth:`charge`).
        round_runs: the charged round numbers, run-length encoded as ``(first round, count)`` pairs.
        relation: the neighbouring relation, ``"add_remove"`` (default) or ``"replace_one"`` (privacy of the
            sensitive attributes; PLD only, so ``accountant="rdp"`` is refused); use the one the noise was calibrated
            with.
    """

    epsilon_budget: float
    delta: float
    accountant: str = "best"
    entries: list[LedgerEntry] = field(default_factory=list)
    round_runs: list[tuple[int, int]] = field(default_factory=list)
    relation: str = "add_remove"
    _cache: dict[tuple[str, State], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.epsilon_budget = check_epsilon(self.epsilon_budget, name="epsilon_budget")
        self.delta = check_delta(self.delta)
        self.accountant = check_accountant(self.accountant)
        self.relation = check_relation(self.relation)
        check_accountant_supports(self.accountant, self.relation)
        self.entries = list(self.entries)
        self.round_runs = [(int(start), int(count)) for start, count in self.round_runs]
        self._check_consistent()

    def _check_consistent(self) -> None:
        """Entries and round runs must describe the same rounds, in increasing order.

        Walks the runs and the entries side by side (O(entries + runs), not O(rounds): a silo's ledger is rebuilt
        from its state on every message of runs of thousands of rounds)."""
        previous_end = -1
        for start, count in self.round_runs:
            if count < 1 or start <= previous_end:
                raise ValueError(
                    f"round_runs must be (first round, count >= 1) pairs in increasing, non-overlapping order; "
                    f"got {self.round_runs}"
                )
            previous_end = start + count - 1
        total = sum(count for _, count in self.round_runs)
        if sum(entry.rounds for entry in self.entries) != total:
            raise ValueError(f"entries cover {sum(e.rounds for e in self.entries)} rounds but round_runs list {total}")
        run, run_offset = 0, 0  # the round at `position` is round_runs[run][0] + run_offset
        for index, entry in enumerate(self.entries):
            check_noise_multiplier(entry.noise_multiplier, name=f"entries[{index}].noise_multiplier", allow_inf=False)
            check_noise_multiplier(entry.companion, name=f"entries[{index}].companion")
            check_sampling_rate(entry.sampling_rate, name=f"entries[{index}].sampling_rate")
            check_releases(entry.releases, name=f"entries[{index}].releases")
            check_steps(entry.rounds, name=f"entries[{index}].rounds")
            check_steps(entry.steps, name=f"entries[{index}].steps", minimum=entry.rounds)
            if entry.steps % entry.rounds:
                raise ValueError(
                    f"entries[{index}]: steps ({entry.steps}) must be a multiple of rounds ({entry.rounds})"
                )
            if run == len(self.round_runs):
                raise ValueError(f"entries[{index}] starts after the last round that round_runs list")
            first = self.round_runs[run][0] + run_offset
            if entry.round != first:
                raise ValueError(f"entries[{index}].round is {entry.round} but round_runs say {first}")
            run_offset += entry.rounds  # advance `position` by the entry's rounds, across as many runs as it spans
            while run < len(self.round_runs) and run_offset >= self.round_runs[run][1]:
                run_offset -= self.round_runs[run][1]
                run += 1

    def copy(self) -> PrivacyLedger:
        """An independent copy of this (valid) ledger, without re-validating it: charging one leaves the other as it
        was. The epsilon cache is shared: its figures depend only on the state, the delta and the relation."""
        clone = copy.copy(self)
        clone.entries = list(self.entries)
        clone.round_runs = list(self.round_runs)
        return clone

    # -- reading ------------------------------------------------------------------------------------------------------

    @property
    def last_round(self) -> int | None:
        """The last charged round, ``None`` before the first charge."""
        if not self.round_runs:
            return None
        start, count = self.round_runs[-1]
        return start + count - 1

    def rounds(self) -> list[int]:
        """Every charged round, in order."""
        return [start + offset for start, count in self.round_runs for offset in range(count)]

    def spent(self) -> float:
        """Epsilon (at ``delta``, by the ledger's accountant) of everything charged so far; cached per state."""
        return self._epsilon(self._state(self.entries))

    def remaining(self) -> float:
        """Budget left (``inf`` for an unlimited budget); never negative."""
        if math.isinf(self.epsilon_budget):
            return math.inf
        return max(self.epsilon_budget - self.spent(), 0.0)

    def cost_after(
        self,
        noise_multiplier: float,
        sampling_rate: float,
        releases: int = 1,
        steps: int = 1,
        companion: float = math.inf,
    ) -> float:
        """Epsilon spent if one more round with this mechanism were charged (nothing is charged)."""
        candidate = self._with_charge(self._next_round(), noise_multiplier, sampling_rate, releases, steps, companion)
        return self._epsilon(self._state(candidate))

    def history(self, max_points: int | None = None) -> list[tuple[int, float]]:
        """``(round, epsilon spent after it)`` for the charged rounds, by the ledger's accountant.

        Each point is one epsilon evaluation: ~0.2 ms with RDP, 10-75 ms with PLD (``"pld"`` and ``"best"``). For long
        runs pass ``max_points`` to evaluate at most that many rounds, evenly spread; the last round is always included.
        """
        if max_points is not None:
            check_steps(max_points, name="max_points")
        rounds = self.rounds()
        if not rounds:
            return []
        wanted = range(len(rounds))
        if max_points is not None and max_points < len(rounds):
            wanted = np.unique(np.linspace(0, len(rounds) - 1, max_points).round().astype(int)).tolist()
        wanted_set = set(wanted)
        points: list[tuple[int, float]] = []
        position = 0
        for index, entry in enumerate(self.entries):
            prefix = self.entries[:index]
            for done in range(1, entry.rounds + 1):
                if position in wanted_set:
                    partial = replace(entry, steps=entry.steps_per_round * done, rounds=done)
                    state = self._state([*prefix, partial])
                    points.append((rounds[position], self._epsilon(state, remember=False)))
                position += 1
        return points

    # -- charging -----------------------------------------------------------------------------------------------------

    def charge(
        self,
        *,
        round: int,
        noise_multiplier: float,
        sampling_rate: float,
        releases: int = 1,
        steps: int = 1,
        silo: str = "",
        companion: float = math.inf,
    ) -> float:
        """Charge one answered round, or refuse it. Returns the epsilon spent after the charge.

        ``companion`` (``inf``: none): the noise multiplier of a second release of the round made on its own,
        independent Poisson sample of the same rate (see :class:`LedgerEntry`).

        Raises:
            BudgetExceededError: the answer would take the spending over ``epsilon_budget`` (beyond a relative
                ``BUDGET_RELATIVE_TOLERANCE``); nothing is charged.
            ValueError: ``round`` was already charged (an answer is never paid twice), or is not after the last
                charged round (rounds are charged in order), or a mechanism argument is invalid.

        The returned figure is ``spent()`` for ``"rdp"`` and ``"pld"`` under ``add_remove``. For ``"best"`` it is the
        figure that admitted the charge: RDP's while RDP alone keeps the silo within budget (no PLD evaluation: ~0.2 ms
        per round), and ``min(RDP, PLD)`` once PLD is needed, where the PLD figure may come from a certificate: the
        epsilon of a longer run of the same mechanism that PLD showed to be within budget (see
        :func:`~protocols.privacy.admission.pld_certified`). Under ``replace_one`` it is PLD's figure for a run at most
        one ladder step longer (:func:`~protocols.privacy.admission.pld_ladder`). It is an upper bound on the true
        epsilon either way, so under ``"best"`` it can step down when the check switches to PLD; use
        ``spent()``/``history()`` for the tight curve.
        """
        round_number = self._check_round(round)
        candidate = self._with_charge(round_number, noise_multiplier, sampling_rate, releases, steps, companion)
        state = self._state(candidate)
        limit = self.epsilon_budget * (1.0 + BUDGET_RELATIVE_TOLERANCE)
        if self.relation == "replace_one":  # PLD is the only accountant ("pld" or "best")
            figure = admission.pld_ladder(state, self.delta, limit, self.relation)
        elif self.accountant == "best":
            figure = self._cached("rdp", state)
            if figure > limit:
                figure = min(figure, admission.pld_certified(state, self.delta, limit))
        else:
            figure = self._cached(self.accountant, state)
        if figure > limit:
            raise BudgetExceededError(
                silo=silo,
                round=round_number,
                budget=self.epsilon_budget,
                spent=self.spent(),
                cost=figure,
                accountant=self.accountant,
                delta=self.delta,
            )
        self.entries = candidate
        self._add_round(round_number)
        return figure

    def _check_round(self, round_number: object) -> int:
        number = check_steps(round_number, name="round", minimum=0)
        last = self.last_round
        if last is not None and number <= last:
            if self._was_charged(number):
                raise ValueError(
                    f"round {number} was already charged; a silo pays once per answer (re-sent message or a bug)"
                )
            raise ValueError(f"round {number} comes before the last charged round {last}; charge rounds in order")
        return number

    def _was_charged(self, round_number: int) -> bool:
        starts = [start for start, _ in self.round_runs]
        index = bisect.bisect_right(starts, round_number) - 1
        return index >= 0 and round_number < self.round_runs[index][0] + self.round_runs[index][1]

    def _next_round(self) -> int:
        last = self.last_round
        return 0 if last is None else last + 1

    def _with_charge(
        self,
        round_number: int,
        noise_multiplier: float,
        sampling_rate: float,
        releases: int,
        steps: int,
        companion: float = math.inf,
    ) -> list[LedgerEntry]:
        """The entries after charging this round (merged into the last entry when the mechanism is the same)."""
        sigma = check_noise_multiplier(noise_multiplier, allow_inf=False)
        q = check_sampling_rate(sampling_rate)
        k = check_releases(releases)
        count = check_steps(steps)
        second = check_noise_multiplier(companion, name="companion")
        entries = list(self.entries)
        if entries:
            last = entries[-1]
            same = (last.noise_multiplier, last.sampling_rate, last.releases, last.steps_per_round, last.companion) == (
                sigma,
                q,
                k,
                count,
                second,
            )
            if same:
                entries[-1] = replace(last, steps=last.steps + count, rounds=last.rounds + 1)
                return entries
        entries.append(LedgerEntry(round_number, sigma, q, k, count, 1, second))
        return entries

    def _add_round(self, round_number: int) -> None:
        if self.round_runs:
            start, count = self.round_runs[-1]
            if round_number == start + count:
                self.round_runs[-1] = (start, count + 1)
                return
        self.round_runs.append((round_number, 1))

    # -- epsilon ------------------------------------------------------------------------------------------------------

    @staticmethod
    def _state(entries: list[LedgerEntry]) -> State:
        return tuple(entry.accounting_key() for entry in entries)

    def _epsilon(self, state: State, *, remember: bool = True) -> float:
        return min(self._cached(kind, state, remember) for kind in library_accountants(self.accountant, self.relation))

    def _cached(self, kind: str, state: State, remember: bool = True) -> float:
        key = (kind, state)
        if key in self._cache:
            return self._cache[key]
        value = (
            composition.rdp_epsilon(state, self.delta)
            if kind == "rdp"
            else composition.pld_epsilon(state, self.delta, self.relation)
        )
        if remember:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = value
        return value

    # -- persistence --------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, float | int | str | list[float] | list[int]]:
        """Flat dict of scalars and lists of scalars: fits a Flower ``ConfigRecord`` and strict JSON.

        An infinite budget is stored as the string ``"inf"`` (strict JSON has no infinity).
        """
        out: dict[str, float | int | str | list[float] | list[int]] = {
            "ledger_format": LEDGER_FORMAT,
            "epsilon_budget": "inf" if math.isinf(self.epsilon_budget) else self.epsilon_budget,
            "delta": self.delta,
            "accountant": self.accountant,
            "relation": self.relation,
            "entry_round": [entry.round for entry in self.entries],
            "entry_noise_multiplier": [entry.noise_multiplier for entry in self.entries],
            "entry_sampling_rate": [entry.sampling_rate for entry in self.entries],
            "entry_releases": [entry.releases for entry in self.entries],
            "entry_steps": [entry.steps for entry in self.entries],
            "entry_rounds": [entry.rounds for entry in self.entries],
            "round_run_start": [start for start, _ in self.round_runs],
            "round_run_length": [count for _, count in self.round_runs],
        }
        if any(math.isfinite(entry.companion) for entry in self.entries):
            # -1.0: no companion release (a ConfigRecord list holds one type, and strict JSON has no infinity)
            out["entry_companion"] = [-1.0 if math.isinf(e.companion) else e.companion for e in self.entries]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output (also a ``ConfigRecord``); errors name the bad key.

        A dict without ``relation`` (written before relations existed) loads as ``"add_remove"``.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a privacy ledger dict must be a mapping, got {type(d).__name__}")
        required = (
            "ledger_format",
            "epsilon_budget",
            "delta",
            "accountant",
            "entry_round",
            "entry_noise_multiplier",
            "entry_sampling_rate",
            "entry_releases",
            "entry_steps",
            "entry_rounds",
            "round_run_start",
            "round_run_length",
        )
        missing = [key for key in required if key not in d]
        if missing:
            raise ValueError(f"privacy ledger dict is missing {', '.join(missing)}; was it written by to_dict()?")
        if d["ledger_format"] != LEDGER_FORMAT:
            raise ValueError(f"ledger_format {d['ledger_format']!r} is not supported (expected {LEDGER_FORMAT})")
        budget = d["epsilon_budget"]
        if budget == "inf":
            budget = math.inf
        columns = {key: _as_list(d, key) for key in required[4:10]}
        lengths = {len(values) for values in columns.values()}
        if len(lengths) != 1:
            raise ValueError(
                "privacy ledger dict: the entry_* lists must have equal lengths, got "
                + ", ".join(f"{key}={len(values)}" for key, values in columns.items())
            )
        companions = _as_list(d, "entry_companion") if "entry_companion" in d else [-1.0] * len(columns["entry_round"])
        if len(companions) != len(columns["entry_round"]):
            raise ValueError("privacy ledger dict: entry_companion must have one value per entry")
        entries = [
            LedgerEntry(
                round=int(r),
                noise_multiplier=float(sigma),
                sampling_rate=float(q),
                releases=int(k),
                steps=int(steps),
                rounds=int(rounds),
                companion=math.inf if float(second) < 0 else float(second),
            )
            for r, sigma, q, k, steps, rounds, second in zip(*columns.values(), companions, strict=True)
        ]
        starts, lengths_ = _as_list(d, "round_run_start"), _as_list(d, "round_run_length")
        if len(starts) != len(lengths_):
            raise ValueError("privacy ledger dict: round_run_start and round_run_length must have equal lengths")
        return cls(
            epsilon_budget=budget,
            delta=d["delta"],
            accountant=d["accountant"],
            entries=entries,
            round_runs=list(zip(starts, lengths_, strict=True)),
            relation=d.get("relation", "add_remove"),
        )


def _as_list(d: Mapping[str, object], key: str) -> list:
    value = d[key]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"privacy ledger dict: {key} must be a list, got {type(value).__name__}")
    return list(value)
