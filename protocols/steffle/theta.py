"""SteFFLe's fairness gradients in the model parameters theta: per record ``d psi_i / d theta = J_F(x_i)^T a_i``
(DP-FERMI, Lowy et al. ICLR 2023, Appendix D Lemma D.1, theta part; ``a_i`` from `gradients`), and their sum with
each record's gradient clipped to ``C``: the sensitive division's theta release of SteFFLe's Algorithm 1 line 8
(Gupta et al. 2024; the clipping is silofl's).

Two routes give the same values (tests compare them): ``torch.func`` (``vmap(grad(...))``) for any model, and for
:class:`protocols.models.TabularModel` one backward pass of ``sum_i <a_i, F(x_i)>`` (or, for logistic regression, the
closed-form logit gradients of :func:`psi_logit_grads`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from silofl.protocols.fairness_prior import GroupPrior
from silofl.protocols.models import TabularModel, clipped_row_sum, head_clipped_sum, linear_stack_clipped_sum
from silofl.protocols.steffle import checks
from silofl.protocols.steffle.gradients import psi_output_cotangents

__all__ = ["clipped_psi_theta_sum", "psi_logit_grads", "psi_theta_gradients"]


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
    prior = checks.prior(prior)
    groups = checks.indices("groups", groups, prior.num_groups, None)
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
