"""SteFFLe's fairness objective (DP-FERMI, Lowy et al. ICLR 2023): the per-sample min-max form ``psi_i`` of ERMI
(Appendix C, Theorem C.1 eq. (6)), its mean over a batch, the inner maximiser ``W*`` and the ERMI value it reaches
(Definition 3.1; Appendix B eq. (5) for equalized odds). The notions and their blocks are `prior`'s.

With soft statistics ``p(u) = mean_i F_u(x_i)`` and ``p(u, r) = mean_i [s_i = r] F_u(x_i)``, ``mean_i psi_i`` is a
strongly concave quadratic in ``W`` maximised by ``W*_ru = p(u, r) / (sqrt(p_S(r)) p(u))`` at the value
``ERMI = sum_{u,r} p(u, r)^2 / (p(u) p_S(r)) - 1`` (Definition 3.1 with the soft predictions), which is 0 exactly when
the predictions are independent of ``s`` and ``p_S`` is the batch's group frequency.

:func:`ermi_value` returns the per-block ERMI ``(blocks,)``; :func:`block_weights` returns the weights ``n_b / n`` such
that ``(block_weights * ermi_value).sum() == ermi_objective(F, groups, optimal_w(...))``.

Empty blocks (no sample of block ``b`` in the batch) and columns with ``sum_i F_iu = 0`` leave ``W*`` at 0 there (the
objective does not depend on those entries) and give ``ERMI_b = 0`` (undefined, weight 0).
"""

from __future__ import annotations

import torch

from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.steffle import checks
from silofl.protocols.steffle.layout import block_layout, cotangents, probs_tensor

__all__ = ["block_weights", "ermi_objective", "ermi_value", "optimal_w", "psi"]


def psi(
    F: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample ``psi_i (n,)`` of eq. (6) (Theorem C.1, entry-wise), differentiable in ``F`` and ``W``.

    ``psi_i = -sum_{r,u} W_ru^2 F_iu + 2 p(s_i)^(-1/2) sum_u W_{s_i,u} F_iu - 1`` with the block and group
    distribution of sample ``i``'s notion (``"eo"``: ``W[y_i]`` and ``P_{S|Y=y_i}``); ``"eopp"`` samples with
    ``y_i != l - 1`` give ``psi_i = 0`` (`prior`'s module docstring). ``labels`` are required for ``"eo"``/``"eopp"``.
    """
    prior, F, groups, labels = checks.batch(prior, F, groups, labels)
    W = checks.w(W, prior, F.dtype)
    block, active, inv_sqrt = block_layout(prior, labels, F.shape[0], F.dtype, groups)
    a = cotangents(groups, W, prior, block, active, inv_sqrt)
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
    prior, F, groups, labels = checks.batch(prior, F, groups, labels)
    block, active, _ = block_layout(prior, labels, F.shape[0], F.dtype, groups)
    weights = torch.nn.functional.one_hot(block, prior.blocks()).to(F.dtype) * active.unsqueeze(1)  # (n, blocks)
    member = torch.nn.functional.one_hot(groups, prior.num_groups).to(F.dtype)  # (n, k)
    joint = torch.einsum("nb,nk,nl->bkl", weights, member, F)
    probs = probs_tensor(prior, F.dtype)
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
    prior = checks.prior(prior)
    groups = checks.indices("groups", groups, prior.num_groups, None)
    n = groups.shape[0]
    labels = checks.labels(labels, prior, n)
    block, active, _ = block_layout(prior, labels, n, dtype, groups)
    sizes = (torch.nn.functional.one_hot(block, prior.blocks()).to(dtype) * active.unsqueeze(1)).sum(dim=0)
    return sizes / n if n else sizes
