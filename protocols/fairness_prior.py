"""The group-fairness notions, the layout of their per-(block, group, label) tables (:func:`w_shape`) and the group
prior the fairness objectives are written with (:class:`GroupPrior`, with the group-balanced variant of issue 20).

Shared by SteFFLe's ERMI (`protocols.steffle`, whose ascent variable ``W`` has the layout :func:`w_shape`) and Tran et
al.'s constraints (`protocols.tran`: its constraints and multipliers have the same layout): the servers build the
prior from the silos' noised (group, label) counts (:meth:`GroupPrior.from_counts`, floored at :data:`PRIOR_FLOOR`)
and the silos check the one they receive (`client.group_fairness.group_prior`, at least :data:`MIN_SILO_PRIOR`).

Fairness notions and the W layout (the papers leave them open; decided here):

- ``"dp"`` demographic parity: ``W`` is ``(k, l)`` and every sample uses it with ``P_S``.
- ``"eo"`` equalized odds: ``W`` is ``(l, k, l)``, block ``W[y]`` is the ``W^(y)`` of label ``y`` and is used with
  ``P_{S|Y=y}`` by the samples with ``y_i = y`` only. ``ermi_objective`` AVERAGES OVER ALL n SAMPLES, so block ``y``
  enters with weight ``n_y / n = p(y)``; its maximum is ``sum_y p(y) ERMI_y = eq. (5)`` (the ``-1`` of eq. (5) is the
  ``sum_y p(y) * (-1)`` of the blocks). Averaging over all samples is what keeps a minibatch mean an unbiased estimate
  of the full objective under uniform (Poisson) sampling and keeps every record's contribution to a batch sum bounded
  in the same way as for ``"dp"`` (one record touches one block).
- ``"eopp"`` equal opportunity: eq. (5) restricted to the positive label ``l - 1`` (the papers define no positive label
  for ``l > 2``; the last one is taken). ``W`` is ``(k, l)``, the single block ``W^(l-1)``, laid out like ``"dp"`` so
  that the server's projection, noise and messages treat both single-block notions alike. Samples with
  ``y_i != l - 1`` have ``psi_i = 0`` (no ``-1`` either) and zero gradients, and the average is still over all n, so
  the maximum is ``p(y = l-1) ERMI_{l-1}``: the ``y = l - 1`` term of eq. (5) (with its share of the ``-1``).

Group-balanced ERMI (``GroupPrior(..., balanced=True)``; issue 20). ERMI is a chi-square (mutual-information-like)
average over the groups, each group weighted by its share ``p_S(r)``: at ``W*`` its gradient pushes group ``r``'s
prediction rate with a force proportional to ``p_S(r)`` times its gap to the overall rate. With a binary attribute of
shares 1/3 and 2/3 that matches the max-over-groups violation; with a many-valued attribute whose gaps sit in small
groups (Adult's race: the largest gap is between a group of 3% of the records and one of 10% or 1%, beside a group of
85%) it hardly moves them: at lambda 0 the papers' ERMI of race is about 0.011 against 0.054 for sex, at a similar
violation (0.22 and 0.19). The balanced objective is the ERMI of the group-balanced distribution, where every group
has mass ``1/k``: each sample is weighted by ``omega_i = (1/k) / p_b(s_i)`` (``p_b`` the real prior of its block)
and ``psi`` uses the uniform prior ``1/k`` in place of ``p_b``::

    psi_i^bal = omega_i * ( - sum_{r,u} W_ru^2 F_u(x_i) + 2 sqrt(k) sum_u W_{s_i,u} F_u(x_i) - 1 )

The objective and its gradients (`objective`, `gradients`, `theta`, through `layout`) then compute the same quantities
with ``omega_i`` folded into the sample's activity (its ``[i active]`` factor) and ``1/k`` in place of the prior:
``W*_ru = J_ru / (k^(-1/2) M_u)`` with the weighted soft joint ``J_ru = sum_{i: s_i = r} omega_i F_iu`` and ``M_u =
sum_r J_ru``; ``ermi_value`` divides by the weighted block size ``sum_i omega_i`` and ``block_weights`` returns it
over ``n``, so that ``block_weights * ermi_value`` is still the maximum of ``ermi_objective`` over ``W``. In
expectation the weighted statistics are the group-balanced ones (``E[omega_i [s_i = r]] = 1/k``), and the maximum is
``sum_{u,r} (1/k) p(u|r)^2 / q(u) - 1`` with ``q(u) = mean_r p(u|r)``: zero exactly when the predictions are
independent of ``s``, as before, but every group counts alike.
A record's s-dependent W-gradient then lies in a ball of radius ``2 sqrt(k) max omega = 2 / (sqrt(k) rho)`` instead
of ``2 / sqrt(rho)`` (:meth:`GroupPrior.w_gradient_bound`), and its -2 W F term depends on ``s`` through ``omega_i``.

What was measured (docs/RESULTS.md, "SteFFLe on a many-valued attribute": Adult's race, five groups, two near 1%; the
Credit Card's raw EDUCATION code, seven groups, four of 0.05-0.9%; 3 silos, 3 seeds, 40 epochs): the balanced
objective helps where the gaps sit in small groups of about 1-10% (race, with per-group W noise and W step 0.005: the
violation over the groups with >= 100 test records -56% at epsilon 3, -18% at epsilon 1) and does nothing useful
where some groups are tiny (EDUCATION: weights ``omega`` up to ~290 put the objective on groups of a handful of
records). What helps on both is less noise in ``W``: each group's row noised at its own radius (``w-noise
per-group``) and a smaller W step (W relaxes to its target through its -2 W F term in about 1 / (2 step lambda F_u)
rounds, averaging the noised W-gradients over them). With the papers' prior, per-group noise and W step 0.02 (the
defaults since 2026-11-25) lower the min-support violation on race by 21% / 2% and on EDUCATION by 29% / 4%
(epsilon 3 / 1); W step 0.005 by 22% / 5% and 37% / 9%, but it follows the model too slowly for short runs. The
papers' setup (isotropic noise at the smallest group's radius 2/sqrt(rho), 63 on EDUCATION, W step 0.1) raises the
violation with lambda on EDUCATION.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FAIRNESS_NOTIONS", "MIN_SILO_PRIOR", "PRIOR_FLOOR", "GroupPrior", "w_shape"]

FAIRNESS_NOTIONS: tuple[str, ...] = ("dp", "eo", "eopp")  # demographic parity, equalized odds, equal opportunity

#: Smallest group probability the server's prior holds (`GroupPrior.from_counts(..., floor=PRIOR_FLOOR)` in the
#: strategies): noised counts of a tiny group can come out <= 0, and p_S(r)^(-1/2) enters both the objective and the
#: W-noise radius 2 / sqrt(rho).
PRIOR_FLOOR = 1e-3
#: Smallest group probability a silo accepts in a server's prior (ten times below PRIOR_FLOOR, for float32 rounding of
#: the message and any honest variation): the W radius 2 / sqrt(rho) (2 / (sqrt(k) rho) balanced) and the noise it
#: scales grow without bound as rho -> 0, and a server could otherwise make them overflow.
MIN_SILO_PRIOR = 1e-4
_PRIOR_SUM_ATOL = 1e-6


def _check_notion(notion: object) -> str:
    if notion not in FAIRNESS_NOTIONS:
        raise ValueError(f"notion must be one of {FAIRNESS_NOTIONS}, got {notion!r}")
    return str(notion)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def w_shape(notion: str, num_groups: int, num_labels: int) -> tuple[int, ...]:
    """Shape of the ascent variable ``W``: ``(k, l)`` for ``"dp"`` and ``"eopp"``, ``(l, k, l)`` for ``"eo"``.

    ``"eo"`` stacks one ``k x l`` block per label (``W[y] = W^(y)``); ``"eopp"`` has the single block of the positive
    label ``l - 1`` and shares ``"dp"``'s layout (module docstring).
    """
    notion = _check_notion(notion)
    k = _check_int("num_groups", num_groups, 1)
    l_ = _check_int("num_labels", num_labels, 2)
    return (l_, k, l_) if notion == "eo" else (k, l_)


@dataclass(frozen=True, eq=False)
class GroupPrior:
    """``P_S`` (dp) or ``P_{S|Y=y}`` for each label y (eo/eopp): the global group frequencies the objective uses.

    ``probs`` is ``(k,)`` for ``"dp"`` and ``(l, k)`` with rows ``P_{S|Y=y}`` for ``"eo"`` and ``"eopp"`` (``"eopp"``
    uses only row ``l - 1``). Every row must sum to 1 and every entry must be ``> 0``: ``p_S(r)^(-1/2)`` enters
    ``psi`` and the privacy analysis needs ``p_S >= rho > 0`` (Theorem 3.3); :attr:`rho` is the smallest entry the
    objective actually uses. ``num_labels`` is required for ``"dp"`` (``probs (k,)`` does not carry it) and inferred
    from ``probs`` otherwise. ``probs`` is stored as a read-only float64 copy. Two priors are equal when their notion,
    label count and probabilities are.
    """

    notion: str
    probs: np.ndarray
    num_labels: int | None = None
    #: The group-balanced objective (module docstring): samples weighted by ``(1/k) / p_b(s_i)``, ``psi`` with the
    #: uniform prior ``1/k``. False (the papers' ERMI) unless asked.
    balanced: bool = False

    def __post_init__(self) -> None:
        notion = _check_notion(self.notion)
        if not isinstance(self.balanced, (bool, np.bool_)):
            raise ValueError(f"balanced must be a bool, got {self.balanced!r}")
        object.__setattr__(self, "balanced", bool(self.balanced))
        try:
            probs = np.array(self.probs, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"probs must be a numeric array, got {type(self.probs).__name__}: {exc}") from exc
        if notion == "dp":
            if probs.ndim != 1:
                raise ValueError(f"probs for 'dp' must be 1-D (num_groups,) = P_S, got shape {probs.shape}")
            if self.num_labels is None:
                raise ValueError("num_labels is required for 'dp' (probs (k,) does not carry it); pass num_labels=l")
            num_labels = _check_int("num_labels", self.num_labels, 2)
        else:
            if probs.ndim != 2:
                raise ValueError(
                    f"probs for {notion!r} must be 2-D (num_labels, num_groups) with rows P_(S|Y=y), "
                    f"got shape {probs.shape}"
                )
            num_labels = _check_int("probs.shape[0] (num_labels)", probs.shape[0], 2)
            if self.num_labels is not None and self.num_labels != num_labels:
                raise ValueError(
                    f"num_labels={self.num_labels!r} does not match probs.shape[0]={num_labels}; omit num_labels"
                )
        if probs.shape[-1] < 1:
            raise ValueError(f"probs needs at least one group, got shape {probs.shape}")
        if not np.all(np.isfinite(probs)):
            raise ValueError("probs contains NaN or inf values")
        if np.any(probs <= 0):
            raise ValueError(
                f"every group probability must be > 0 (p_S^(-1/2) enters psi), got minimum {probs.min()!r}; "
                "build the prior with GroupPrior.from_counts(..., floor=rho) to floor empty or noised groups"
            )
        sums = probs.sum(axis=-1)
        if not np.allclose(sums, 1.0, rtol=0.0, atol=_PRIOR_SUM_ATOL):
            raise ValueError(f"each row of probs must sum to 1, got sums {np.atleast_1d(sums).tolist()}")
        probs.setflags(write=False)
        object.__setattr__(self, "probs", probs)
        object.__setattr__(self, "num_labels", num_labels)

    @classmethod
    def from_counts(cls, notion: str, counts: np.ndarray, *, floor: float = 0.0, balanced: bool = False) -> GroupPrior:
        """Prior from ``counts (k, l)``: records by (group, label), summed over silos (possibly DP-noised).

        ``"dp"`` uses the row sums (``p_S(r) = n_r / n``); ``"eo"`` normalises each label's column
        (``P_{S|Y=y}(r) = n_{r,y} / n_y``) into row ``y`` of ``probs``; ``"eopp"`` builds the same ``(l, k)`` table
        (only row ``l - 1`` is used by the objective).

        DP-noised counts can be zero, negative or non-integral. Negative entries are clipped to 0 before normalising.
        With ``floor > 0`` every probability below ``floor`` is then set to ``floor`` and the others are scaled down
        proportionally so the row still sums to 1 (repeated until no entry falls below ``floor``; the ratios between
        unfloored entries are kept): every entry ends ``>= floor``, so :attr:`rho` ``>= floor``. ``floor`` must
        satisfy ``k * floor <= 1``. With ``floor = 0`` an empty group raises (its probability would be 0).
        ``balanced`` selects the group-balanced objective (module docstring).
        """
        notion = _check_notion(notion)
        try:
            table = np.array(counts, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"counts must be a numeric array, got {type(counts).__name__}: {exc}") from exc
        if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 2:
            raise ValueError(
                f"counts must be 2-D (num_groups, num_labels) with num_labels >= 2, got shape {table.shape}"
            )
        if not np.all(np.isfinite(table)):
            raise ValueError("counts contains NaN or inf values")
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor):
            raise ValueError(f"floor must be a finite number, got {floor!r}")
        k, l_ = table.shape
        if floor < 0 or floor * k > 1:
            raise ValueError(f"floor must lie in [0, 1/num_groups] = [0, {1 / k}], got {floor!r}")
        table = np.clip(table, 0.0, None)
        rows = table.sum(axis=1, keepdims=True).T if notion == "dp" else table.T  # (1, k) or (l, k)
        totals = rows.sum(axis=1)
        if np.any(totals <= 0):
            what = "all counts" if notion == "dp" else f"the counts of label(s) {np.flatnonzero(totals <= 0).tolist()}"
            raise ValueError(f"{what} sum to <= 0 after clipping negatives; a prior needs records in every label")
        probs = np.stack([_floor_row(row / row.sum(), float(floor)) for row in rows])
        if notion == "dp":
            return cls(notion, probs[0], num_labels=l_, balanced=balanced)
        return cls(notion, probs, balanced=balanced)

    @property
    def num_groups(self) -> int:
        """``k``, the number of sensitive groups."""
        return int(self.probs.shape[-1])

    def blocks(self) -> int:
        """Number of ``W`` blocks: 1 for ``"dp"`` and ``"eopp"``, ``l`` for ``"eo"``."""
        assert self.num_labels is not None  # set by __post_init__
        return self.num_labels if self.notion == "eo" else 1

    def w_shape(self) -> tuple[int, ...]:
        """:func:`w_shape` for this prior's notion, ``k`` and ``l``."""
        assert self.num_labels is not None
        return w_shape(self.notion, self.num_groups, self.num_labels)

    def block_probs(self) -> np.ndarray:
        """``(blocks, k)``: the group distribution each ``W`` block is used with (``P_S``, ``P_{S|Y=y}``, ...)."""
        if self.notion == "dp":
            return self.probs[None, :]
        if self.notion == "eo":
            return self.probs
        return self.probs[-1:, :]

    @property
    def rho(self) -> float:
        """Smallest group probability the objective uses (the ``rho`` of Theorem 3.3's sensitivity bounds)."""
        return float(self.block_probs().min())

    def objective_probs(self) -> np.ndarray:
        """``(blocks, k)``: the group distribution ``psi`` is written with: :meth:`block_probs`, or ``1/k`` when
        balanced."""
        probs = self.block_probs()
        return np.full(probs.shape, 1.0 / self.num_groups) if self.balanced else probs

    def sample_weights(self) -> np.ndarray | None:
        """``(blocks, k)``: the weight ``omega = (1/k) / p_b(r)`` of a sample of group ``r`` in block ``b`` when
        balanced; None (every weight 1) otherwise."""
        return (1.0 / self.num_groups) / self.block_probs() if self.balanced else None

    def w_row_bounds(self) -> np.ndarray:
        """``(blocks, k)``: the largest L2 norm of one record's s-dependent W-gradient, which lies in row ``(b, r)``
        of ``W`` for a record of group ``r`` in block ``b``: ``2 / sqrt(p_b(r))``, or ``2 sqrt(k) omega = 2 / (sqrt(k)
        p_b(r))`` when balanced. Its maximum is :meth:`w_gradient_bound`."""
        probs = self.block_probs()
        if self.balanced:
            return 2.0 * math.sqrt(self.num_groups) * ((1.0 / self.num_groups) / probs)
        return 2.0 / np.sqrt(probs)

    def w_gradient_bound(self) -> float:
        """Largest L2 norm of one record's s-dependent W-gradient ``2 omega_i e_{s_i} F_i^T / sqrt(p(s_i))``
        (``||F_i||_2 <= 1``): ``2 / sqrt(rho)``, or ``2 sqrt(k) / (k rho) = 2 / (sqrt(k) rho)`` when balanced."""
        if not self.balanced:
            return 2.0 / math.sqrt(self.rho)
        return 2.0 * math.sqrt(self.num_groups) * (1.0 / self.num_groups) / self.rho

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupPrior):
            return NotImplemented
        return (
            self.notion == other.notion
            and self.balanced == other.balanced
            and self.num_labels == other.num_labels
            and self.probs.shape == other.probs.shape
            and bool(np.array_equal(self.probs, other.probs))
        )

    def __hash__(self) -> int:
        return hash((self.notion, self.balanced, self.num_labels, self.probs.shape, self.probs.tobytes()))


def _floor_row(p: np.ndarray, floor: float) -> np.ndarray:
    """Raise entries of a probability vector to ``>= floor`` and rescale the rest so it still sums to 1."""
    if floor <= 0:
        return p
    fixed = np.zeros(p.shape, dtype=bool)
    out = p.copy()
    for _ in range(p.shape[0]):  # each pass fixes at least one more entry at the floor, or stops
        low = (out < floor) & ~fixed
        if not low.any():
            break
        fixed |= low
        free_mass = 1.0 - floor * fixed.sum()
        free = p[~fixed]
        out = np.full(p.shape, floor)
        if free.size:
            out[~fixed] = free / free.sum() * free_mass if free.sum() > 0 else free_mass / free.size
    return out
