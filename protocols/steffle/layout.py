"""The per-sample block layout of SteFFLe's objective: which ``W`` block each record uses, whether (and with what
weight) it counts, the prior's ``p_b(r)^(-1/2)`` table, and the cotangents ``a_i`` that ``psi`` and its theta-gradient
are made of.

Record ``i`` uses block ``b_i`` of ``W`` (:func:`blocks_view`): 0 for ``"dp"`` and ``"eopp"``, its label ``y_i`` for
``"eo"`` (`prior`'s module docstring). It is active (factor 1) unless it is an ``"eopp"`` record of another label than
``l - 1`` (factor 0); for the group-balanced prior the factor is multiplied by its weight ``omega_i = (1/k) /
p_b(s_i)``. `objective`, `gradients` and (through the cotangents) `theta` are written on this layout
(:func:`block_layout`, :func:`cotangents`).
"""

from __future__ import annotations

import functools

import torch

from silofl.protocols.fairness_prior import GroupPrior

__all__ = ["block_layout", "blocks_view", "cotangents", "inv_sqrt_table", "probs_tensor"]


def probs_tensor(prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
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
def inv_sqrt_table(prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    """``p_b(r)^(-1/2)`` ``(blocks, k)`` in ``dtype``, built once per (prior, dtype): a GroupPrior is immutable and the
    server sends the same one every round. Read-only by convention (every caller only indexes it)."""
    return probs_tensor(prior, dtype).rsqrt()


def block_layout(
    prior: GroupPrior, labels: torch.Tensor | None, n: int, dtype: torch.dtype, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: its W block index ``b_i (n,)``, whether it contributes ``active_i (n,)`` (0/1 in ``dtype``; times
    the sample weight ``omega_i`` for a balanced prior), and the table ``p_b(r)^(-1/2)`` ``(blocks, k)`` of the
    objective's prior in ``dtype``."""
    inv_sqrt = inv_sqrt_table(prior, dtype)
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


def blocks_view(W: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    """``W`` as ``(blocks, k, l)`` (a view)."""
    assert prior.num_labels is not None
    return W.reshape(prior.blocks(), prior.num_groups, prior.num_labels)


def cotangents(
    groups: torch.Tensor,
    W: torch.Tensor,
    prior: GroupPrior,
    block: torch.Tensor,
    active: torch.Tensor,
    inv_sqrt: torch.Tensor,
) -> torch.Tensor:
    """``a_i (n, l)``: ``a_iu = -sum_r W^(b_i)_ru^2 + 2 W^(b_i)_{s_i,u} p_{b_i}(s_i)^(-1/2)``; 0 for inactive rows."""
    Wb = blocks_view(W, prior)
    col_sq = (Wb * Wb).sum(dim=1)  # (blocks, l): sum_r W_ru^2
    a = -col_sq[block] + 2.0 * Wb[block, groups] * inv_sqrt[block, groups].unsqueeze(1)
    return a * active.unsqueeze(1)
