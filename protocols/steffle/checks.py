"""Argument checks shared by SteFFLe's maths (`objective`, `gradients`, `theta`): the prior, the soft predictions
``F``, index tensors (groups, labels) and ``W``, each refused with an error that names the argument and what it must
be, so that a bad value is refused where it enters the maths; and :func:`probability_rows`, the same check of ``F``
row by row for predictions that come from another party.

The silo's hot path skips them (`gradients`' checked-input kernels): its inputs were checked where they entered it.
"""

from __future__ import annotations

import torch

from silofl.protocols.fairness_prior import GroupPrior

__all__ = ["batch", "indices", "labels", "prior", "probability_rows", "soft_predictions", "w"]

_SIMPLEX_ATOL = 1e-4  # float32 softmax rows sum to 1 within ~1e-7; this only catches inputs that are not probabilities


def prior(prior: object) -> GroupPrior:
    """``prior`` if it is a :class:`GroupPrior` (validated when it was built); a TypeError otherwise."""
    if not isinstance(prior, GroupPrior):
        raise TypeError(f"prior must be a GroupPrior, got {type(prior).__name__}")
    return prior


def soft_predictions(F: object, prior: GroupPrior) -> torch.Tensor:
    """``F`` if it is ``(n, l)`` soft predictions for the prior's ``l`` labels: floating, finite, rows on the simplex
    (within ``_SIMPLEX_ATOL``). Logits are refused: ERMI and the W-gradient bound ``2 / sqrt(rho)`` hold for
    probability rows (``||F_i||_2 <= 1``)."""
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
    """``(n,)`` bool: the rows of ``F (n, l)`` that ``psi_w_gradients`` accepts as soft predictions (finite,
    entries in ``[0, 1]`` and summing to 1, within the same tolerance), row by row.

    For soft predictions that come from outside (a separate sensitive party receives ``F`` from the server): the
    bound ``2 / sqrt(p(s_i))`` on a record's s-dependent W term holds only for ``||F_i||_2 <= 1``, so a row that is
    not a probability vector must contribute 0, not an unbounded term (and not an error, which would depend on the
    records the party holds and keeps)."""
    values = F.detach()
    in_range = ((values >= -_SIMPLEX_ATOL) & (values <= 1 + _SIMPLEX_ATOL)).all(dim=1)  # False for NaN
    return in_range & ((values.sum(dim=1) - 1).abs() <= _SIMPLEX_ATOL)


def indices(name: str, values: object, size: int, n: int | None) -> torch.Tensor:
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


def labels(labels: object, prior: GroupPrior, n: int) -> torch.Tensor | None:
    """The true labels ``y_i`` as int64 indices in ``[0, l)`` (:func:`indices`); required for ``"eo"`` and ``"eopp"``
    (they pick each sample's block), None passes for ``"dp"``."""
    assert prior.num_labels is not None
    if labels is None:
        if prior.notion != "dp":
            raise ValueError(f"labels (the true y_i) are required for notion {prior.notion!r}")
        return None
    return indices("labels", labels, prior.num_labels, n)


def w(W: object, prior: GroupPrior, dtype: torch.dtype) -> torch.Tensor:
    """``W`` cast to ``dtype`` if it is a floating, finite tensor of the prior's :func:`w_shape`."""
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


def batch(
    group_prior: object, F: object, groups: object, true_labels: object
) -> tuple[GroupPrior, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(prior, F, groups, labels)`` of one batch, checked in that order (:func:`prior`, :func:`soft_predictions`,
    :func:`indices` with one group per row of ``F``, :func:`labels`): what ``psi``, ``psi_w_gradients`` and the
    objective's soft statistics all take."""
    checked = prior(group_prior)
    F = soft_predictions(F, checked)
    n = F.shape[0]
    return checked, F, indices("groups", groups, checked.num_groups, n), labels(true_labels, checked, n)
