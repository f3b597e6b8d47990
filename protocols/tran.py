"""Tran et al. 2021 ("Differentially Private and Fair Deep Learning: A Lagrangian Dual Approach", AAAI; "PF-LD"),
the pure math: the fairness constraints, their violation estimate, the Lagrangian and the dual update (no Flower).

Used by the SteFFLe paper as its "Tran et al. 2021" baseline (SteFFLe Section 5 and Appendix E), here adapted to silos
(`client.rounds.tran`, `strategies.tran`).

The problem (Tran et al., demographic parity: each group's mean prediction against the population's)::

    min_theta  L(theta)   s.t.   nu_{a,u}(theta) = E[F_u(x) | s = a] - E[F_u(x)] = 0   for every group a, label u

with ``F(x) = softmax(logits)`` the model's soft predictions (as in the paper's Lagrangian, which uses the model's
output probabilities, not the argmax). Its Lagrangian with one multiplier per constraint, ``lambda >= 0``::

    L_lambda(theta) = L(theta) + sum_{a,u} lambda_{a,u} |nu_{a,u}(theta)|

is minimised in theta by (sub)gradient steps and maximised in lambda by dual ascent with step ``s``::

    lambda_{a,u} <- lambda_{a,u} + s * |nu_{a,u}(theta)|

(so every multiplier only grows while its constraint is violated; the paper's Lagrangian dual scheme).

Decisions (the paper's centralised algorithm needs these to run on silos under sensitive-attribute DP):

- **Group means through the prior.** ``E[F_u | s = a] = E[[s = a] F_u] / p(a)``. The batch's own group sizes depend on
  every sampled record's attribute (a ratio of two sums, with no per-record bound); with the group prior ``p`` (public,
  from the silos' noised group counts, as in SteFFLe) the constraint is a MEAN of per-record terms::

      nu_{a,u} = E_i[ ([s_i = a] / p(a) - 1) F_u(x_i) ],

  so each record's contribution to a released sum is bounded, and the released sums are unbiased for every silo size.
- **Blocks**, as in :mod:`protocols.fairness_prior`: ``"dp"`` has one block over all records; ``"eo"`` (equalized
  odds) one block per true label ``y`` with the prior ``P_{S|Y=y}``, i.e. ``nu_{y,a,u} = E[[y_i = y] ([s_i = a] /
  p(a|y) - 1) F_u(x_i)] = p(y) (E[F_u | s = a, y] - E[F_u | y])`` (each block weighted by ``p(y)``, like ERMI's blocks,
  so that the average is over all records); ``"eopp"`` the positive label's block only. Multipliers, violations and
  the group mass have the layout of SteFFLe's ``W``, :func:`protocols.fairness_prior.w_shape`.
- **The sign of |nu|.** ``d |nu| / d theta = sign(nu) d nu / d theta``. The silo may not compute ``sign(nu)`` from its
  own attributes (one record's attribute could flip it and with it every record's contribution), so the sign comes
  from the server's noised estimate of the previous round (post-processing): the silo receives the SIGNED multipliers
  ``c = lambda (.) sign(nu_hat)`` and differentiates ``sum c (.) nu``.
- **lambda inside the clipped gradient.** Record i's gradient of ``sum c (.) nu`` is ``J_F(x_i)^T a_i`` with the
  cotangent ``a_iu = c_{b_i, s_i, u} / p_{b_i}(s_i) - sum_a c_{b_i, a, u}`` (:func:`constraint_cotangents`); it is
  clipped to norm ``C`` as a whole (DP-SGD on the constraint term of the Lagrangian, the paper's primal clipping), so
  its noise does not grow with lambda; a large lambda saturates at ``C`` per record instead.
- **Binary labels.** For ``l = 2`` the constraints of label 0 are those of label 1 with the opposite sign
  (``F_0 = 1 - F_1``); both are kept (no special case), which doubles the effective multiplier.

The module docstring of :mod:`client.rounds.tran` says which of these quantities depend on the sensitive attribute and
how each is noised.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import TabularModel, all_finite, clipped_row_sum, linear_stack_clipped_sum

__all__ = [
    "clipped_constraint_gradient_sum",
    "constraint_cotangents",
    "constraint_term",
    "dual_step",
    "group_mass_sum",
    "lagrangian",
    "signed_multipliers",
    "soft_parity_gap",
    "violations",
]


def _check_prior(prior: object) -> GroupPrior:
    if not isinstance(prior, GroupPrior):
        raise TypeError(f"prior must be a GroupPrior (protocols.fairness_prior), got {type(prior).__name__}")
    return prior


def _blocks(prior: GroupPrior) -> tuple[int, int, int]:
    assert prior.num_labels is not None  # set by GroupPrior.__post_init__
    return prior.blocks(), prior.num_groups, prior.num_labels


def _check_table(name: str, value: np.ndarray | torch.Tensor, prior: GroupPrior) -> None:
    shape = tuple(value.shape)
    if shape != prior.w_shape():
        raise ValueError(
            f"{name} must have shape {prior.w_shape()} for notion {prior.notion!r} (k={prior.num_groups}, "
            f"l={prior.num_labels}): one entry per constraint, laid out like protocols.fairness_prior.w_shape; "
            f"got {shape}"
        )


def _index(name: str, values: object, size: int, n: int | None) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or values.ndim != 1:
        raise ValueError(f"{name} must be a 1-D torch integer tensor, got {type(values).__name__}")
    if n is not None and values.shape[0] != n:
        raise ValueError(f"{name} must have one entry per record ({n}), got {values.shape[0]}")
    if values.is_floating_point() or values.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer indices, got dtype {values.dtype}")
    values = values.long()
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= size):
        raise ValueError(f"{name} must lie in [0, {size - 1}], got [{int(values.min())}, {int(values.max())}]")
    return values


def _layout(prior: GroupPrior, labels: torch.Tensor | None, n: int, dtype: torch.dtype):
    """Per record: its block ``b_i`` and whether it takes part (``"eopp"``: only the positive label's records)."""
    _, _, num_labels = _blocks(prior)
    if prior.notion == "dp":
        return torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=dtype)
    if labels is None:
        raise ValueError(f"labels (the true y_i) are required for notion {prior.notion!r}")
    labels = _index("labels", labels, num_labels, n)
    if prior.notion == "eo":
        return labels, torch.ones(n, dtype=dtype)
    return torch.zeros(n, dtype=torch.long), (labels == num_labels - 1).to(dtype)


# ---------------------------------------------------------------------------------------------------------------------
# Violations (the server's side: numpy, float64)


def violations(mass: np.ndarray, prior: GroupPrior) -> np.ndarray:
    """``nu[b, a, u] = mass[b, a, u] / p_b(a) - sum_a' mass[b, a', u]`` from the group mass (shape ``w_shape``).

    ``mass[b, a, u]`` estimates ``E_i[[b_i = b] [s_i = a] F_u(x_i)]`` (:func:`group_mass_sum` / records); then
    ``mass / p_b(a)`` estimates ``E[F_u | s = a]`` (times ``p(y)`` for ``"eo"``) and the column sum ``E[F_u]``. With
    the batch's own group frequencies as ``p`` this is exact on the batch (tests).
    """
    prior = _check_prior(prior)
    _check_table("mass", mass, prior)
    blocks, k, l_ = _blocks(prior)
    m = np.asarray(mass, dtype=np.float64).reshape(blocks, k, l_)
    p = prior.block_probs()[:, :, None]  # (blocks, k, 1)
    nu = m / p - m.sum(axis=1, keepdims=True)
    return nu.reshape(prior.w_shape())


def signed_multipliers(lam: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """``c = lambda (.) sign(nu)``: the weights of ``sum c (.) nu``, whose gradient is that of ``sum lambda |nu|``."""
    lam, nu = np.asarray(lam, dtype=np.float64), np.asarray(nu, dtype=np.float64)
    if lam.shape != nu.shape:
        raise ValueError(f"lambda {lam.shape} and nu {nu.shape} must have the same shape")
    return lam * np.sign(nu)


def dual_step(lam: np.ndarray, nu: np.ndarray, step: float) -> np.ndarray:
    """Dual ascent ``lambda + s |nu|`` (Tran et al.'s multiplier update; ``lambda`` stays >= 0)."""
    if not math.isfinite(step) or step < 0:
        raise ValueError(f"the dual step s must be a finite number >= 0, got {step!r}")
    lam, nu = np.asarray(lam, dtype=np.float64), np.asarray(nu, dtype=np.float64)
    if lam.shape != nu.shape:
        raise ValueError(f"lambda {lam.shape} and nu {nu.shape} must have the same shape")
    if (lam < 0).any():
        raise ValueError("multipliers must be >= 0 (one per inequality |nu| <= 0)")
    return lam + step * np.abs(nu)


def lagrangian(loss: float, nu: np.ndarray, lam: np.ndarray) -> float:
    """``L(theta) + sum lambda |nu|``: the value the primal step descends and the dual step ascends."""
    return float(loss + (np.asarray(lam, dtype=np.float64) * np.abs(np.asarray(nu, dtype=np.float64))).sum())


def soft_parity_gap(nu: np.ndarray, prior: GroupPrior) -> float:
    """``max_{b,u} (max_a nu - min_a nu)``: for ``"dp"`` the largest gap ``|E[F_u|a] - E[F_u|a']|`` between two
    groups, i.e. the demographic parity violation of the soft predictions (of one-hot predictions: exactly the
    metric of :mod:`protocols.fairness_metrics`)."""
    prior = _check_prior(prior)
    _check_table("nu", nu, prior)
    blocks, k, l_ = _blocks(prior)
    table = np.asarray(nu, dtype=np.float64).reshape(blocks, k, l_)
    return float((table.max(axis=1) - table.min(axis=1)).max())


# ---------------------------------------------------------------------------------------------------------------------
# The silo's side (torch): group mass and the per-record constraint gradients


def group_mass_sum(
    F: torch.Tensor, groups: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``sum_i [b_i = b] [s_i = a] F_u(x_i)`` in the multiplier layout. Record i adds ``F(x_i)`` to ONE (block, group)
    row, so its contribution has L2 norm ``||F(x_i)||_2 <= 1`` whatever its attribute (0 if it is not sampled).

    A record whose ``F(x_i)`` is not finite (``softmax`` of logits that overflowed under huge parameters from the
    server) is left out: it contributes exactly 0, inside that ball, where a NaN would make the noised mass NaN
    exactly when the record is there. The rows are copied only when such a record is there."""
    prior = _check_prior(prior)
    blocks, k, l_ = _blocks(prior)
    if not isinstance(F, torch.Tensor) or F.ndim != 2 or F.shape[1] != l_:
        raise ValueError(f"F must be a (n, {l_}) tensor of soft predictions, got {getattr(F, 'shape', F)}")
    n = F.shape[0]
    groups = _index("groups", groups, k, n)
    block, active = _layout(prior, labels, n, F.dtype)
    if not all_finite(F):
        keep = torch.isfinite(F).all(dim=1)
        F, groups, block, active = F[keep], groups[keep], block[keep], active[keep]
    place = torch.nn.functional.one_hot(block, blocks).to(F.dtype) * active.unsqueeze(1)  # (n, blocks)
    member = torch.nn.functional.one_hot(groups, k).to(F.dtype)  # (n, k)
    return torch.einsum("nb,nk,nl->bkl", place, member, F).reshape(prior.w_shape())


def constraint_cotangents(
    groups: torch.Tensor, c: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``a_i (n, l)``: ``a_iu = c_{b_i, s_i, u} / p_{b_i}(s_i) - sum_a c_{b_i, a, u}`` (0 for inactive records).

    Record i's term of ``sum c (.) nu`` is ``<a_i, F(x_i)>`` (module docstring), so its theta-gradient is
    ``J_F(x_i)^T a_i``. The first part depends on ``s_i``; the second does not. Dtype of ``c``.
    """
    prior = _check_prior(prior)
    _check_table("c", c, prior)
    blocks, k, l_ = _blocks(prior)
    groups = _index("groups", groups, k, None)
    n = groups.shape[0]
    block, active = _layout(prior, labels, n, c.dtype)
    cb = c.reshape(blocks, k, l_)
    p = torch.from_numpy(prior.block_probs().copy()).to(c.dtype)  # (blocks, k)
    own = cb[block, groups] / p[block, groups].unsqueeze(1)  # (n, l)
    return (own - cb.sum(dim=1)[block]) * active.unsqueeze(1)


def constraint_term(
    F: torch.Tensor, groups: torch.Tensor, c: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``mean_i <a_i, F(x_i)>`` = ``sum c (.) nu_hat`` with ``nu_hat`` the batch estimate of :func:`violations`;
    differentiable in ``F``. Raises for an empty batch."""
    if F.shape[0] == 0:
        raise ValueError("the constraint term of an empty batch is undefined (n == 0)")
    a = constraint_cotangents(groups, c.to(F.dtype), prior, labels)
    return (a * F).sum(dim=1).mean()


def clipped_constraint_gradient_sum(
    model: nn.Module,
    x: torch.Tensor,
    groups: torch.Tensor,
    c: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_i clip(J_F(x_i)^T a_i, C)`` as a flat ``(P,)`` vector in ``parameter_spec`` order (zeros if ``n = 0``).

    Each record's whole gradient is scaled by ``min(1, C / norm)``, so it lies in the ball of radius ``C`` around 0
    (what an unsampled record contributes) whatever its attribute: the replace-one geometry the accountant assumes.
    A record whose gradient, or its norm, is not finite (huge parameters or multipliers from the server) contributes
    exactly 0, the centre of that ball (`protocols.models.clip_factors`).
    Stacks of Linear layers (:class:`~protocols.models.TabularModel`) take one backward pass
    (:func:`~protocols.models.linear_stack_clipped_sum`); other models ``torch.func``'s ``vmap(grad)``.
    """
    if not math.isfinite(clip) or clip <= 0:
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    params = {name: p.detach() for name, p in model.named_parameters()}
    dtype = next(iter(params.values())).dtype
    if x.shape[0] == 0:
        return torch.zeros(sum(p.numel() for p in params.values()), dtype=dtype)
    # the cotangents where the groups and c are (the CPU), then to the device of x and the model (`protocols.devices`)
    a = constraint_cotangents(groups, c.detach().to(dtype), prior, labels).to(x.device)
    x = x.to(dtype)
    if isinstance(model, TabularModel):
        return linear_stack_clipped_sum(model, x, lambda logits: (a * torch.softmax(logits, dim=1)).sum(), clip)

    def one_record(p: dict[str, torch.Tensor], xi: torch.Tensor, ai: torch.Tensor) -> torch.Tensor:
        return (ai * torch.softmax(functional_call(model, p, (xi.unsqueeze(0),)), dim=1)[0]).sum()

    n = x.shape[0]
    rows = [g.reshape(n, -1) for g in vmap(grad(one_record), in_dims=(None, 0, 0))(params, x, a).values()]
    norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(r, dim=1) for r in rows], dim=1), dim=1)
    return clipped_row_sum(rows, norms, clip)
