"""The FERMI fairness term: ERMI, its min-max form ``psi_i`` and per-sample gradients (pure math, no Flower).

Source: the DP-FERMI paper (Lowy, Gupta, Razaviyayn, "Stochastic Differentially Private and Fair Learning", ICLR 2023),
with its matrix forms written entry-wise below: Definition 3.1 (ERMI), Appendix B eq. (5) (the equalized-odds ERMI),
Appendix C Theorem C.1 eq. (6) (the min-max form and ``psi_i``) and Lemma D.1 (its gradients), used by Algorithm 1 lines
5-6 of DP-FERMI and by the sensitive division of SteFFLe's Algorithm 1 (Gupta et al. 2024, line 8).

Notation. ``F (n, l)``: the model's soft predictions ``F(x_i; theta) = softmax(logits)`` (rows on the simplex; for the
binary logistic model ``F = (1 - sigmoid(z), sigmoid(z))``, so ``l = 2`` and the FULL ``k x l`` W of the papers is used,
never the authors' released code's 1x1 reduction). ``s_i in [0, k)`` the sensitive group, ``y_i in [0, l)`` the label,
``p_S`` the global group frequencies (:class:`GroupPrior`). Per sample (eq. (6), Theorem C.1 written entry-wise)::

    psi_i(theta, W) = - sum_{r,u} W_ru^2 F_u(x_i) + 2 p_S(s_i)^(-1/2) sum_u W_{s_i,u} F_u(x_i) - 1
                    = <a_i, F(x_i)> - 1,   a_iu = - sum_r W_ru^2 + 2 W_{s_i,u} / sqrt(p_S(s_i))

``psi_i`` is linear in ``F(x_i)`` for fixed ``W``, so ``d psi_i / d theta = J_F(x_i)^T a_i`` (Lemma D.1, theta part) and
``d psi_i / d W_ru = -2 W_ru F_u(x_i) + 2 [s_i = r] F_u(x_i) / sqrt(p_S(r))`` (Lemma D.1, W part).

With soft statistics ``p(u) = mean_i F_u(x_i)`` and ``p(u, r) = mean_i [s_i = r] F_u(x_i)``, ``mean_i psi_i`` is a
strongly concave quadratic in ``W`` maximised by ``W*_ru = p(u, r) / (sqrt(p_S(r)) p(u))`` at the value
``ERMI = sum_{u,r} p(u, r)^2 / (p(u) p_S(r)) - 1`` (Definition 3.1 with the soft predictions), which is 0 exactly when
the predictions are independent of ``s`` and ``p_S`` is the batch's group frequency.

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

:func:`ermi_value` returns the per-block ERMI ``(blocks,)``; :func:`block_weights` returns the weights ``n_b / n`` such
that ``(block_weights * ermi_value).sum() == ermi_objective(F, groups, optimal_w(...))``.

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

Every function below then computes the same quantities with ``omega_i`` folded into the sample's activity (its
``[i active]`` factor) and ``1/k`` in place of the prior: ``W*_ru = J_ru / (k^(-1/2) M_u)`` with the weighted soft
joint ``J_ru = sum_{i: s_i = r} omega_i F_iu`` and ``M_u = sum_r J_ru``; ``ermi_value`` divides by the weighted block
size ``sum_i omega_i`` and :func:`block_weights` returns it over ``n``, so that ``block_weights * ermi_value`` is
still the maximum of :func:`ermi_objective` over ``W``. In expectation the weighted statistics are the group-balanced
ones (``E[omega_i [s_i = r]] = 1/k``), and the maximum is ``sum_{u,r} (1/k) p(u|r)^2 / q(u) - 1`` with ``q(u) =
mean_r p(u|r)``: zero exactly when the predictions are independent of ``s``, as before, but every group counts alike.
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

Empty blocks (no sample of block ``b`` in the batch) and columns with ``sum_i F_iu = 0`` leave ``W*`` at 0 there (the
objective does not depend on those entries) and give ``ERMI_b = 0`` (undefined, weight 0).

Dtypes: float32 in, float32 out; float64 works throughout (tests). ``W`` and the prior are cast to ``F``'s (or the
model's) dtype.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from silofl.protocols.models import (
    TabularModel,
    all_finite,
    clipped_row_sum,
    head_clipped_sum,
    linear_stack_clipped_sum,
)

__all__ = [
    "FAIRNESS_NOTIONS",
    "GroupPrior",
    "block_weights",
    "clipped_psi_theta_sum",
    "ermi_objective",
    "ermi_value",
    "optimal_w",
    "output_block_sums_checked",
    "probability_rows",
    "project_frobenius",
    "psi",
    "psi_logit_grads",
    "psi_output_cotangents",
    "psi_output_cotangents_checked",
    "psi_theta_gradients",
    "psi_w_gradients",
    "psi_w_sensitive_sum_checked",
    "w_output_term",
    "w_shape",
]

FAIRNESS_NOTIONS: tuple[str, ...] = ("dp", "eo", "eopp")  # demographic parity, equalized odds, equal opportunity

#: Smallest group probability the server's prior holds (`GroupPrior.from_counts(..., floor=PRIOR_FLOOR)` in the
#: strategies): noised counts of a tiny group can come out <= 0, and p_S(r)^(-1/2) enters both the objective and the
#: W-noise radius 2 / sqrt(rho).
PRIOR_FLOOR = 1e-3
#: Smallest group probability a silo accepts in a server's prior (ten times below PRIOR_FLOOR, for float32 rounding of
#: the message and any honest variation): the W radius 2 / sqrt(rho) (2 / (sqrt(k) rho) balanced) and the noise it
#: scales grow without bound as rho -> 0, and a server could otherwise make them overflow.
MIN_SILO_PRIOR = 1e-4
_SIMPLEX_ATOL = 1e-4  # float32 softmax rows sum to 1 within ~1e-7; this only catches inputs that are not probabilities
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


# ---------------------------------------------------------------------------------------------------------------------
# Validation and the per-sample block layout


def _check_prior(prior: object) -> GroupPrior:
    if not isinstance(prior, GroupPrior):
        raise TypeError(f"prior must be a GroupPrior, got {type(prior).__name__}")
    return prior


def _check_F(F: object, prior: GroupPrior) -> torch.Tensor:
    if not isinstance(F, torch.Tensor):
        raise TypeError(f"F must be a torch tensor (n, num_labels), got {type(F).__name__}")
    if F.ndim != 2 or F.shape[1] != prior.num_labels:
        raise ValueError(
            f"F must be 2-D (n, num_labels={prior.num_labels}) soft predictions, got shape {tuple(F.shape)}"
        )
    if not F.is_floating_point():
        raise ValueError(f"F must be a floating tensor (softmax of the logits), got dtype {F.dtype}")
    if F.shape[0]:
        values = F.detach()
        if not bool(torch.isfinite(values).all()):
            raise ValueError("F contains NaN or inf values")
        if bool((values < -_SIMPLEX_ATOL).any()) or bool((values > 1 + _SIMPLEX_ATOL).any()):
            raise ValueError("F must hold probabilities in [0, 1]; pass softmax(logits), not the logits")
        worst = float((values.sum(dim=1) - 1).abs().max())
        if worst > _SIMPLEX_ATOL:
            raise ValueError(f"every row of F must sum to 1 (softmax of the logits); worst row is off by {worst:.3g}")
    return F


def probability_rows(F: torch.Tensor) -> torch.Tensor:
    """``(n,)`` bool: the rows of ``F (n, l)`` that :func:`psi_w_gradients` accepts as soft predictions (finite,
    entries in ``[0, 1]`` and summing to 1, within the same tolerance), row by row.

    For soft predictions that come from outside (a separate sensitive party receives ``F`` from the server): the
    bound ``2 / sqrt(p(s_i))`` on a record's s-dependent W term holds only for ``||F_i||_2 <= 1``, so a row that is
    not a probability vector must contribute 0, not an unbounded term (and not an error, which would depend on the
    records the party holds and keeps)."""
    values = F.detach()
    in_range = ((values >= -_SIMPLEX_ATOL) & (values <= 1 + _SIMPLEX_ATOL)).all(dim=1)  # False for NaN
    return in_range & ((values.sum(dim=1) - 1).abs() <= _SIMPLEX_ATOL)


def _check_index(name: str, values: object, size: int, n: int | None) -> torch.Tensor:
    """Validate 1-D integer indices in ``[0, size)`` (``n`` entries unless ``n is None``); returns them as int64."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch integer tensor (n,), got {type(values).__name__}")
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per sample), got shape {tuple(values.shape)}")
    if n is not None and values.shape[0] != n:
        raise ValueError(f"{name} must have one entry per sample ({n}), got {values.shape[0]}")
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer indices, got dtype {values.dtype}")
    values = values.long()
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= size):
        raise ValueError(
            f"{name} must lie in [0, {size - 1}], got values in [{int(values.min())}, {int(values.max())}]; "
            "encode categories as 0-based indices"
        )
    return values


def _check_labels(labels: object, prior: GroupPrior, n: int) -> torch.Tensor | None:
    assert prior.num_labels is not None
    if labels is None:
        if prior.notion != "dp":
            raise ValueError(f"labels (the true y_i) are required for notion {prior.notion!r}")
        return None
    return _check_index("labels", labels, prior.num_labels, n)


def _check_w(W: object, prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch tensor of shape {prior.w_shape()}, got {type(W).__name__}")
    if tuple(W.shape) != prior.w_shape():
        raise ValueError(
            f"W must have shape {prior.w_shape()} for notion {prior.notion!r} (k={prior.num_groups}, "
            f"l={prior.num_labels}), got {tuple(W.shape)}"
        )
    if not W.is_floating_point():
        raise ValueError(f"W must be a floating tensor, got dtype {W.dtype}")
    if not bool(torch.isfinite(W.detach()).all()):
        raise ValueError("W contains NaN or inf values")
    return W.to(dtype)


def _probs_tensor(prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    """The ``(blocks, k)`` table ``psi`` uses (:meth:`GroupPrior.objective_probs`) as a tensor (copied: the stored
    array is read-only)."""
    return torch.from_numpy(prior.objective_probs().copy()).to(dtype)


@functools.lru_cache(maxsize=64)
def _weight_table(prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    """The balanced objective's sample weights ``(blocks, k)`` in ``dtype`` (read-only by convention)."""
    weights = prior.sample_weights()
    assert weights is not None
    return torch.from_numpy(weights).to(dtype)


@functools.lru_cache(maxsize=64)
def _inv_sqrt_table(prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    """``p_b(r)^(-1/2)`` ``(blocks, k)`` in ``dtype``, built once per (prior, dtype): a GroupPrior is immutable and the
    server sends the same one every round. Read-only by convention (every caller only indexes it)."""
    return _probs_tensor(prior, dtype).rsqrt()


def _layout(
    prior: GroupPrior, labels: torch.Tensor | None, n: int, dtype: torch.dtype, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: its W block index ``b_i (n,)``, whether it contributes ``active_i (n,)`` (0/1 in ``dtype``; times
    the sample weight ``omega_i`` for a balanced prior), and the table ``p_b(r)^(-1/2)`` ``(blocks, k)`` of the
    objective's prior in ``dtype``."""
    inv_sqrt = _inv_sqrt_table(prior, dtype)
    if prior.notion == "dp":
        block, active = torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=dtype)
    else:
        assert labels is not None and prior.num_labels is not None
        if prior.notion == "eo":
            block, active = labels, torch.ones(n, dtype=dtype)
        else:
            block, active = torch.zeros(n, dtype=torch.long), (labels == prior.num_labels - 1).to(dtype)
    if prior.balanced:
        active = active * _weight_table(prior, dtype)[block, groups]
    return block, active, inv_sqrt


def _blocks_view(W: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    """``W`` as ``(blocks, k, l)`` (a view)."""
    assert prior.num_labels is not None
    return W.reshape(prior.blocks(), prior.num_groups, prior.num_labels)


def _cotangents(
    groups: torch.Tensor,
    W: torch.Tensor,
    prior: GroupPrior,
    block: torch.Tensor,
    active: torch.Tensor,
    inv_sqrt: torch.Tensor,
) -> torch.Tensor:
    """``a_i (n, l)``: ``a_iu = -sum_r W^(b_i)_ru^2 + 2 W^(b_i)_{s_i,u} p_{b_i}(s_i)^(-1/2)``; 0 for inactive rows."""
    Wb = _blocks_view(W, prior)
    col_sq = (Wb * Wb).sum(dim=1)  # (blocks, l): sum_r W_ru^2
    a = -col_sq[block] + 2.0 * Wb[block, groups] * inv_sqrt[block, groups].unsqueeze(1)
    return a * active.unsqueeze(1)


# ---------------------------------------------------------------------------------------------------------------------
# The objective, its maximiser and its value


def psi(
    F: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample ``psi_i (n,)`` of eq. (6) (Theorem C.1, entry-wise), differentiable in ``F`` and ``W``.

    ``psi_i = -sum_{r,u} W_ru^2 F_iu + 2 p(s_i)^(-1/2) sum_u W_{s_i,u} F_iu - 1`` with the block and group
    distribution of sample ``i``'s notion (``"eo"``: ``W[y_i]`` and ``P_{S|Y=y_i}``); ``"eopp"`` samples with
    ``y_i != l - 1`` give ``psi_i = 0`` (module docstring). ``labels`` are required for ``"eo"``/``"eopp"``.
    """
    prior = _check_prior(prior)
    F = _check_F(F, prior)
    n = F.shape[0]
    groups = _check_index("groups", groups, prior.num_groups, n)
    labels = _check_labels(labels, prior, n)
    W = _check_w(W, prior, F.dtype)
    block, active, inv_sqrt = _layout(prior, labels, n, F.dtype, groups)
    a = _cotangents(groups, W, prior, block, active, inv_sqrt)
    return (a * F).sum(dim=1) - active


def ermi_objective(
    F: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``mean_i psi_i`` over ALL n samples: the lambda-free fairness term of eq. (6). Raises for an empty batch."""
    values = psi(F, groups, W, prior, labels)
    if values.shape[0] == 0:
        raise ValueError("the ERMI objective of an empty batch is undefined (n == 0)")
    return values.mean()


def _soft_joint(
    F: torch.Tensor, groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per block: ``J[b, r, u] = sum_{i in b, s_i=r} F_iu``, the block sizes ``n_b (blocks,)``, and ``p_b (blocks, k)``.

    Validates the inputs.
    """
    prior = _check_prior(prior)
    F = _check_F(F, prior)
    n = F.shape[0]
    groups = _check_index("groups", groups, prior.num_groups, n)
    labels = _check_labels(labels, prior, n)
    block, active, _ = _layout(prior, labels, n, F.dtype, groups)
    weights = torch.nn.functional.one_hot(block, prior.blocks()).to(F.dtype) * active.unsqueeze(1)  # (n, blocks)
    member = torch.nn.functional.one_hot(groups, prior.num_groups).to(F.dtype)  # (n, k)
    joint = torch.einsum("nb,nk,nl->bkl", weights, member, F)
    probs = _probs_tensor(prior, F.dtype)
    return joint, weights.sum(dim=0), probs


def optimal_w(
    F: torch.Tensor, groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """The inner maximiser of eq. (6): ``W*_ru = p(yhat=u, s=r) / (sqrt(p_S(r)) p(yhat=u))`` per block.

    ``p(yhat=u, s=r)`` and ``p(yhat=u)`` are the soft frequencies over the block's samples (``F`` averaged, not the
    argmax). Entries of a column with ``sum_i F_iu = 0`` or of an empty block are 0 (the objective does not depend on
    them). Shape :func:`w_shape`.
    """
    joint, _, probs = _soft_joint(F, groups, prior, labels)
    marginal = joint.sum(dim=1, keepdim=True)  # (blocks, 1, l)
    denom = probs.sqrt().unsqueeze(2) * marginal
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    w = torch.where(marginal > 0, joint / safe, torch.zeros_like(joint))
    return w.reshape(prior.w_shape())


def ermi_value(
    F: torch.Tensor, groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-block ERMI ``(blocks,)``: ``sum_{u,r} p(u,r)^2 / (p(u) p_b(r)) - 1`` (Definition 3.1; eq. (5)'s inner sum).

    Block ``b``'s probabilities are soft frequencies over its samples (``"dp"``: all; ``"eo"``: ``y_i = b``; ``"eopp"``:
    ``y_i = l - 1``) and ``p_b`` is the prior's group distribution for the block. An empty block gives 0. The maximum of
    :func:`ermi_objective` over ``W`` is ``(block_weights(...) * ermi_value(...)).sum()``; for ``"eo"`` that is eq. (5).
    """
    joint, sizes, probs = _soft_joint(F, groups, prior, labels)
    marginal = joint.sum(dim=1, keepdim=True)
    denom = marginal * probs.unsqueeze(2)
    ratio = torch.where(marginal > 0, joint**2 / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0)
    safe_sizes = torch.where(sizes > 0, sizes, torch.ones_like(sizes))
    return torch.where(sizes > 0, ratio.sum(dim=(1, 2)) / safe_sizes - 1.0, torch.zeros_like(sizes))


def block_weights(
    groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``(blocks,)`` weights ``n_b / n`` with which each block enters :func:`ermi_objective` (all zeros if ``n = 0``).

    ``"dp"``: ``[1]``; ``"eo"``: the batch's label frequencies ``p(y)`` (eq. (5)); ``"eopp"``: ``[p(y = l - 1)]``.
    """
    prior = _check_prior(prior)
    groups = _check_index("groups", groups, prior.num_groups, None)
    n = groups.shape[0]
    labels = _check_labels(labels, prior, n)
    block, active, _ = _layout(prior, labels, n, dtype, groups)
    sizes = (torch.nn.functional.one_hot(block, prior.blocks()).to(dtype) * active.unsqueeze(1)).sum(dim=0)
    return sizes / n if n else sizes


# ---------------------------------------------------------------------------------------------------------------------
# Per-sample gradients


def psi_w_gradients(
    F: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample ``d psi_i / d W``, shape ``(n, *W.shape)``, in closed form (Lemma D.1, W part), no loop.

    ``d psi_i / d W^(b)_ru = [b = b_i] (-2 W^(b)_ru F_iu + 2 [s_i = r] F_iu / sqrt(p_b(r)))``; zero for inactive
    ``"eopp"`` samples. Computed from ``F`` as given (detach it first if it carries a graph you do not want).
    """
    prior = _check_prior(prior)
    F = _check_F(F, prior)
    n = F.shape[0]
    groups = _check_index("groups", groups, prior.num_groups, n)
    labels = _check_labels(labels, prior, n)
    W = _check_w(W, prior, F.dtype)
    block, active, inv_sqrt = _layout(prior, labels, n, F.dtype, groups)
    Wb = _blocks_view(W, prior)
    member = torch.nn.functional.one_hot(groups, prior.num_groups).to(F.dtype)  # (n, k)
    scale = (member * inv_sqrt[block]).unsqueeze(2)  # (n, k, 1): [s_i = r] p_b(r)^(-1/2)
    own = (-2.0 * Wb[block] + 2.0 * scale) * F.unsqueeze(1)  # (n, k, l): gradient w.r.t. sample i's own block
    place = torch.nn.functional.one_hot(block, prior.blocks()).to(F.dtype) * active.unsqueeze(1)  # (n, blocks)
    grads = place[:, :, None, None] * own.unsqueeze(1)  # (n, blocks, k, l)
    return grads.reshape(n, *prior.w_shape())


def psi_output_cotangents(
    groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``a_i (n, l)`` with ``a_iu = -sum_r W_ru^2 + 2 W_{s_i,u} / sqrt(p_S(s_i))`` (in sample i's block).

    ``psi_i = <a_i, F(x_i)> - 1``, so ``d psi_i / d theta = J_F(x_i)^T a_i`` (Lemma D.1, theta part): the sensitive
    division sends nothing but these to a vector-Jacobian product. Zero rows for inactive ``"eopp"`` samples. Dtype of
    ``W``.
    """
    prior = _check_prior(prior)
    groups = _check_index("groups", groups, prior.num_groups, None)
    n = groups.shape[0]
    labels = _check_labels(labels, prior, n)
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch tensor of shape {prior.w_shape()}, got {type(W).__name__}")
    W = _check_w(W, prior, W.dtype)
    block, active, inv_sqrt = _layout(prior, labels, n, W.dtype, groups)
    return _cotangents(groups, W, prior, block, active, inv_sqrt)


# Checked-input kernels: the silo's hot path. A silo calls them once per round with inputs already checked where they
# entered it: W by `protocols.messages.check_arrays` (shape, dtype, finite values) at the message boundary, the prior
# as a GroupPrior (validated when built), groups and labels from its own training data (int64 indices in range,
# checked when the data was loaded) and F = softmax(model(x)) computed by the silo itself. The public functions above
# re-check every argument on every call (~0.1 ms per call for a batch of 256); these do not, and give the same values
# bit for bit (same elementwise operations in the same order, same reductions; tests compare them).


def psi_output_cotangents_checked(
    groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`psi_output_cotangents` (Lemma D.1, theta part: ``a_iu = -sum_r W_ru^2 + 2 W_{s_i,u} / sqrt(p_S(s_i))``)
    for checked inputs: ``groups`` (and ``labels`` for ``"eo"``/``"eopp"``) int64 in range, ``W`` of the prior's
    :func:`w_shape`, floating and finite. Dtype of ``W``."""
    inv_sqrt = _inv_sqrt_table(prior, W.dtype)
    if prior.notion == "dp" and not prior.balanced:  # one block, every sample active: no block index, no 1.0 factor
        Wb = _blocks_view(W, prior)
        col_sq = (Wb * Wb).sum(dim=1)  # (1, l): sum_r W_ru^2
        return -col_sq[0] + 2.0 * Wb[0][groups] * inv_sqrt[0][groups].unsqueeze(1)
    block, active, _ = _layout(prior, labels, groups.shape[0], W.dtype, groups)
    return _cotangents(groups, W, prior, block, active, inv_sqrt)


def psi_w_sensitive_sum_checked(
    F: torch.Tensor, groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``sum_i d psi_i / d W`` at ``W = 0``, shape :func:`w_shape`: the s-dependent term of Lemma D.1's W part,
    ``2 [b = b_i] [s_i = r] F_iu / sqrt(p_b(r))`` summed over the batch, which SteFFLe's sensitive division releases.

    Equal bit for bit to ``psi_w_gradients(F, groups, torch.zeros(w_shape), prior, labels).sum(dim=0)`` (at ``W = 0``
    its ``-2 W_ru F_iu`` term is ``-0.0``, which adds nothing), for checked inputs as
    :func:`psi_output_cotangents_checked`'s and ``F (n, l)`` the silo's own soft predictions.

    A record whose row of ``F`` is not finite (``softmax`` of logits that overflowed under huge parameters from the
    server) is left out: it contributes exactly 0, the centre of the ball of radius ``R_W`` its term lies in whatever
    its ``s_i`` (a NaN lies in no ball, and the noised sum would be NaN exactly when that record is there). One check
    of ``F`` (`protocols.models.all_finite`); the rows are copied only when such a record is there."""
    if not all_finite(F):
        keep = torch.isfinite(F).all(dim=1)
        F, groups = F[keep], groups[keep]
        labels = None if labels is None else labels[keep]
    n = F.shape[0]
    inv_sqrt = _inv_sqrt_table(prior, F.dtype)
    member = torch.nn.functional.one_hot(groups, prior.num_groups).to(F.dtype)  # (n, k)
    if prior.notion == "dp" and not prior.balanced:  # one block, every sample active: no placement (a factor 1.0)
        return ((2.0 * (member * inv_sqrt[0])).unsqueeze(2) * F.unsqueeze(1)).sum(dim=0)
    block, active, _ = _layout(prior, labels, n, F.dtype, groups)
    own = (2.0 * (member * inv_sqrt[block]).unsqueeze(2)) * F.unsqueeze(1)  # (n, k, l)
    place = torch.nn.functional.one_hot(block, prior.blocks()).to(F.dtype) * active.unsqueeze(1)  # (n, blocks)
    return (place[:, :, None, None] * own.unsqueeze(1)).reshape(n, *prior.w_shape()).sum(dim=0)


def output_block_sums_checked(F: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None) -> torch.Tensor:
    """``(blocks, l)``: each W block's sum of the soft predictions of its records, ``sum_{i in b} F_i``, what the
    s-independent part of the W-gradient, ``-2 W (.) F_i`` in record i's block, is made of (:func:`w_output_term`).

    SteFFLe's silo releases it under whole-record privacy (`protect` = record) in place of that part: record i
    contributes ``F_i`` to row ``b_i`` only (``"dp"``: every record to row 0; ``"eo"``: row ``y_i``; ``"eopp"``: row 0
    for the positive label's records, nothing for the others), a vector of norm ``||F_i||_2 <= 1`` whatever the server
    sends. The term ``-2 W (.) F_i`` itself has a norm up to ``2 ||W||`` and W is the server's.

    A record whose row of ``F`` is not finite contributes exactly 0, the centre of the unit ball its term lies in (as
    :func:`psi_w_sensitive_sum_checked`). For the group-balanced prior the blocks are as for the papers' (no weights:
    the balanced objective's base term is computed from the s-dependent release instead)."""
    if not all_finite(F):
        keep = torch.isfinite(F).all(dim=1)
        F = F[keep]
        labels = None if labels is None else labels[keep]
    assert prior.num_labels is not None
    out = torch.zeros(prior.blocks(), prior.num_labels, dtype=F.dtype)
    if prior.notion == "dp":
        out[0] = F.sum(dim=0)
    elif prior.notion == "eo":
        assert labels is not None
        out.index_add_(0, labels, F)
    else:
        assert labels is not None
        out[0] = F[labels == prior.num_labels - 1].sum(dim=0)
    return out


def w_output_term(W: torch.Tensor, outputs: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    """``-2 W (.) outputs`` block by block (``W`` of :func:`w_shape`, ``outputs (blocks, l)``): with ``outputs`` the
    mean of :func:`output_block_sums_checked` over a batch it is the batch mean of the s-independent part of the
    W-gradient, ``-2 W_ru F_iu`` in record i's block (Lemma D.1). Post-processing of a released ``outputs``."""
    blocks = _blocks_view(W, prior)
    return (-2.0 * blocks * outputs.to(W.dtype).unsqueeze(1)).reshape(W.shape)


def _model_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached parameters in ``state_dict`` order; the flat layout of :func:`protocols.models.parameter_spec`."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    if list(params) != list(model.state_dict().keys()):
        raise ValueError(
            "the model's state_dict must hold exactly its parameters in the same order (no buffers), so that flat "
            f"gradients follow parameter_spec; parameters {list(params)}, state_dict {list(model.state_dict())}"
        )
    return params


def _check_x(x: object, n: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch tensor (n, num_features), got {type(x).__name__}")
    if x.ndim != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating tensor (n, num_features), got shape {tuple(x.shape)}, {x.dtype}")
    if x.shape[0] != n:
        raise ValueError(f"x has {x.shape[0]} rows but groups has {n}; pass one group per record")
    return x


def _theta_inputs(
    model: nn.Module, x: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: Any
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Validated ``(params, x, a)`` for the theta-gradient routes; ``a`` detached, in the model's dtype, on ``x``'s
    device (a silo's `device`: the cotangents are computed where ``groups`` and ``W`` are, the CPU, then moved)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    params = _model_params(model)
    prior = _check_prior(prior)
    groups = _check_index("groups", groups, prior.num_groups, None)
    x = _check_x(x, groups.shape[0])
    dtype = next(iter(params.values())).dtype
    a = psi_output_cotangents(groups, W.detach() if isinstance(W, torch.Tensor) else W, prior, labels)
    return params, x.to(dtype), a.to(dtype=dtype, device=x.device)


def _softmax_output(logits: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    if logits.shape[-1] != prior.num_labels:
        raise ValueError(
            f"the model returns {logits.shape[-1]} logits per record but the prior has num_labels={prior.num_labels}"
        )
    return torch.softmax(logits, dim=-1)


def psi_theta_gradients(
    model: nn.Module,
    x: torch.Tensor,
    groups: torch.Tensor,
    W: torch.Tensor,
    prior: GroupPrior,
    labels: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-sample ``d psi_i / d theta`` as ``{name: (n, *param_shape)}`` (parameter order), via ``torch.func``.

    ``vmap(grad(<a_i, softmax(model(x_i))>))`` over the samples with ``a_i`` from :func:`psi_output_cotangents`
    (``W`` held fixed: the theta step of Algorithm 1 line 5). The model's ``.grad`` fields are left untouched.
    """
    params, x, a = _theta_inputs(model, x, groups, W, prior, labels)

    def one_record(p: dict[str, torch.Tensor], xi: torch.Tensor, ai: torch.Tensor) -> torch.Tensor:
        F_i = _softmax_output(functional_call(model, p, (xi.unsqueeze(0),)), prior)[0]
        return (ai * F_i).sum()

    if x.shape[0] == 0:
        return {name: p.new_zeros((0, *p.shape)) for name, p in params.items()}
    return vmap(grad(one_record), in_dims=(None, 0, 0))(params, x, a)


def _check_clip(clip: object) -> float:
    if isinstance(clip, bool) or not isinstance(clip, (int, float)):
        raise TypeError(f"clip must be a number, got {type(clip).__name__}")
    if not math.isfinite(clip) or clip <= 0:
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    return float(clip)


def clipped_psi_theta_sum(
    model: nn.Module,
    x: torch.Tensor,
    groups: torch.Tensor,
    W: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_i clip(d psi_i / d theta, C)`` as a flat ``(P,)`` vector in ``parameter_spec`` order; zeros if ``n = 0``.

    The sensitive division's theta release (SteFFLe Algorithm 1 line 8, clipped by silofl): each per-sample gradient is
    scaled by ``min(1, C / ||g_i||)``, so one record moves the sum by at most ``C`` in L2 norm; the caller averages and
    adds noise. A record whose gradient, or its norm, is not finite contributes exactly 0
    (`protocols.models.clip_factors`): huge parameters or a huge ``W`` from the server can overflow a record's term for
    one value of ``s_i`` and not the other, and 0 lies in the ball of radius ``C`` around 0 whatever ``s_i`` is, where a
    NaN lies in none.

    For :class:`protocols.models.TabularModel` (a stack of Linear layers) the per-sample gradients come from ONE
    backward pass of ``sum_i <a_i, F(x_i)>`` (``a_i`` detached) w.r.t. the layer outputs: record i's term depends only
    on its own outputs, so the backward pass yields every ``delta_i``, and a Linear layer's per-sample gradients are
    ``delta_i h_i^T`` and ``delta_i`` with squared norm ``|delta_i|^2 (|h_i|^2 + 1)`` (the same trick as
    ``client.gradients``' loss path, which explains why it beats ``vmap``). Other models take the ``torch.func`` route
    (:func:`psi_theta_gradients`). Tests check the two routes agree.
    """
    clip = _check_clip(clip)
    params, x, a = _theta_inputs(model, x, groups, W, prior, labels)
    if x.shape[0] == 0:
        return torch.zeros(sum(p.numel() for p in params.values()), dtype=next(iter(params.values())).dtype)
    if isinstance(model, TabularModel):
        return _linear_stack_clipped_sum(model, x, a, prior, clip)
    n = x.shape[0]
    rows = [g.reshape(n, -1) for g in psi_theta_gradients(model, x, groups, W, prior, labels).values()]
    norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(r, dim=1) for r in rows], dim=1), dim=1)
    return clipped_row_sum(rows, norms, clip)


def _linear_stack_clipped_sum(
    model: TabularModel, x: torch.Tensor, a: torch.Tensor, prior: GroupPrior, clip: float
) -> torch.Tensor:
    """:func:`clipped_psi_theta_sum` for a TabularModel: d psi_i / d theta = J_F^T a_i is the gradient of
    ``<a_i, F(x_i)>`` (``a_i`` fixed), through the vmap-free route (`protocols.models.linear_stack_clipped_sum`);
    for logistic regression without a backward pass, from :func:`psi_logit_grads` (`protocols.models.head_clipped_sum`,
    the same bits)."""
    if model.hidden is None:
        return head_clipped_sum(model, x, lambda logits: psi_logit_grads(a, _softmax_output(logits, prior)), clip)
    return linear_stack_clipped_sum(model, x, lambda logits: (a * _softmax_output(logits, prior)).sum(), clip)


def psi_logit_grads(a: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
    """``d psi_i / d logits_i (n, l)`` for ``F = softmax(logits)`` (Lemma D.1, theta part, through the softmax):
    ``F_iu (a_iu - <a_i, F_i>)``, the softmax's vector-Jacobian product of the cotangents ``a_i``
    (:func:`psi_output_cotangents`). Computed by the kernel torch's autograd runs for it, so a route that uses this
    gives autograd's bits."""
    return torch._softmax_backward_data(a, F, -1, F.dtype)


def project_frobenius(W: torch.Tensor, radius: float) -> torch.Tensor:
    """``Proj_{||W||_F <= D}(W)`` (SteFFLe Algorithm 1 line 11; DP-FERMI Algorithm 1 line 6): a new tensor.

    Inside the ball ``W`` is returned unchanged (a copy); outside it is scaled to norm ``radius``. For ``"eo"`` the
    ball is on the whole ``(l, k, l)`` tensor, so every block, and every entry, also has norm ``<= D`` (the bound
    ``|W_rj| <= D`` that Theorem 3.3's sensitivities assume).
    """
    if not isinstance(W, torch.Tensor) or not W.is_floating_point():
        raise TypeError(f"W must be a floating torch tensor, got {type(W).__name__}")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not math.isfinite(radius) or radius <= 0:
        raise ValueError(f"radius must be a finite number > 0, got {radius!r}")
    if not bool(torch.isfinite(W).all()):
        raise ValueError("W contains NaN or inf values")
    norm = float(torch.linalg.vector_norm(W))
    if norm <= radius:
        return W.clone()
    return W * (radius / norm)
