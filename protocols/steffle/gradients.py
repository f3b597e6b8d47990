"""SteFFLe's per-sample fairness gradients in ``W`` and the output cotangents of its theta-gradient (DP-FERMI, Lowy et
al. ICLR 2023, Appendix D Lemma D.1), in closed form, and the checked-input kernels of the silo's hot path (the
s-dependent W release of SteFFLe's Algorithm 1 line 8, Gupta et al. 2024, and the block sums of its s-independent part).

``psi_i = <a_i, F(x_i)> - 1`` is linear in ``F(x_i)`` for fixed ``W``, so ``d psi_i / d theta = J_F(x_i)^T a_i`` with
the cotangents ``a_i`` of :func:`psi_output_cotangents` (Lemma D.1, theta part; `theta` takes it through the model)
and ``d psi_i / d W_ru = -2 W_ru F_u(x_i) + 2 [s_i = r] F_u(x_i) / sqrt(p_S(r))`` (Lemma D.1, W part).
"""

from __future__ import annotations

import torch

from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import all_finite
from silofl.protocols.steffle import checks
from silofl.protocols.steffle.layout import block_layout, blocks_view, cotangents, inv_sqrt_table

__all__ = [
    "output_block_sums_checked",
    "psi_output_cotangents",
    "psi_output_cotangents_checked",
    "psi_w_gradients",
    "psi_w_sensitive_sum_checked",
    "w_output_term",
]


def psi_w_gradients(
    F: torch.Tensor, groups: torch.Tensor, W: torch.Tensor, prior: GroupPrior, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample ``d psi_i / d W``, shape ``(n, *W.shape)``, in closed form (Lemma D.1, W part), no loop.

    ``d psi_i / d W^(b)_ru = [b = b_i] (-2 W^(b)_ru F_iu + 2 [s_i = r] F_iu / sqrt(p_b(r)))``; zero for inactive
    ``"eopp"`` samples. Computed from ``F`` as given (detach it first if it carries a graph you do not want).
    """
    prior, F, groups, labels = checks.batch(prior, F, groups, labels)
    n = F.shape[0]
    W = checks.w(W, prior, F.dtype)
    block, active, inv_sqrt = block_layout(prior, labels, n, F.dtype, groups)
    Wb = blocks_view(W, prior)
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
    prior = checks.prior(prior)
    groups = checks.indices("groups", groups, prior.num_groups, None)
    n = groups.shape[0]
    labels = checks.labels(labels, prior, n)
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch tensor of shape {prior.w_shape()}, got {type(W).__name__}")
    W = checks.w(W, prior, W.dtype)
    block, active, inv_sqrt = block_layout(prior, labels, n, W.dtype, groups)
    return cotangents(groups, W, prior, block, active, inv_sqrt)


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
    inv_sqrt = inv_sqrt_table(prior, W.dtype)
    if prior.notion == "dp" and not prior.balanced:  # one block, every sample active: no block index, no 1.0 factor
        Wb = blocks_view(W, prior)
        col_sq = (Wb * Wb).sum(dim=1)  # (1, l): sum_r W_ru^2
        return -col_sq[0] + 2.0 * Wb[0][groups] * inv_sqrt[0][groups].unsqueeze(1)
    block, active, _ = block_layout(prior, labels, groups.shape[0], W.dtype, groups)
    return cotangents(groups, W, prior, block, active, inv_sqrt)


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
    inv_sqrt = inv_sqrt_table(prior, F.dtype)
    member = torch.nn.functional.one_hot(groups, prior.num_groups).to(F.dtype)  # (n, k)
    if prior.notion == "dp" and not prior.balanced:  # one block, every sample active: no placement (a factor 1.0)
        return ((2.0 * (member * inv_sqrt[0])).unsqueeze(2) * F.unsqueeze(1)).sum(dim=0)
    block, active, _ = block_layout(prior, labels, n, F.dtype, groups)
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
    blocks = blocks_view(W, prior)
    return (-2.0 * blocks * outputs.to(W.dtype).unsqueeze(1)).reshape(W.shape)
