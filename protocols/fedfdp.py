"""FedFDP (Ling et al. 2024, arXiv 2402.16028, v6 numbering): the pure math, no Flower, no silo state.

Paper: "FedFDP: Fairness-Aware Federated Learning with Differential Privacy" (v6; the 2024 versions, which the SteFFLe
paper cites, are titled "... Federated Learning with Fairness and Differential Privacy"). FedFDP targets "balanced
performance fairness" (equal loss across clients): the objective ``F(w) + (lambda/2) sum_i p_i (F_i(w) - F(w))^2``
(Eq. 6). Client i treats the broadcast global loss F_t as a constant and minimizes, per record,
``f(w; x_j) + (lambda/2)(f(w; x_j) - F_t)^2``, whose gradient is

    (1 + lambda Delta_j) grad f(w; x_j),    Delta_j = f(w_t; x_j) - F_t                     (Eqs. 10-11)

One round of client i (Alg. 2; silofl's choices where the paper leaves one open marked "Decision"):

* B ~ Poisson(q) over D_i; fair clipping ``c_j = min(max(0, 1 + lambda Delta_j), C / ||g_j||)`` (Eq. 13; the
  ``max(0, .)`` is a decision: without it a negative factor escapes the bound C);
* ``w_i = w_t - (eta / m) (sum_{j in B} c_j g_j + N(0, sigma^2 C^2 I))`` (Eq. 12), m the public expected batch size;
* on a fresh Poisson(q) batch B' (Decision: independent of B), with w_i:
  ``F~_i = (sum_{j in B'} min(C_l, max(0, f(w_i; x_j))) + N(0, sigma_l^2 C_l^2)) / m`` (Eqs. 14-15, Alg. 2 l.16-20);
* the adaptive bound is the client's own last release, floored: ``C_l <- max(1e-3, F~_i)`` (Decision; C_l0 = 2.5).

Server: ``w_{t+1} = sum_i p_i w_i`` and ``F_{t+1} = sum_i p_i F~_i`` with p_i = n_i / n; F_0 = 0 (Decision).

Observed consequence of the adaptive bound (measured, not a choice of ours): with C_l = the last release, the next
release estimates E[min(C_l, f)] < C_l whenever some losses lie below C_l, so C_l and F_t decrease round after round
to the floor 1e-3, with or without noise (Adult, 3 silos, 1767 rounds, lambda 0.1: final F_t = 9.3e-4 at epsilon inf
and at epsilon 3, against a test loss of 0.37). F_t then stops tracking the loss and Delta_j = f_j - F_t ~ f_j.
The authors' code does the same under DP (its non-private path releases the unclipped mean, as silofl now does at
epsilon inf). Decision (measured 2026-11-25, Adult, 3 silos, attribute split, eps 1, seed 0): the adaptive bound
stays the default (the baseline as published); ``--loss-bound B`` fixes C_l = B instead, which keeps F_t at the loss
(final F_t 0.33 with B = 2.5 against 8.8e-4 adaptive, lambda 2) but barely moves what the SteFFLe comparison
measures: test error 0.1593 / 0.1593, DP violation 0.1837 / 0.1826, EO 0.156 / 0.145 (adaptive / fixed, lambda 2;
lambda 0.5: 0.1584 / 0.1588, 0.186 / 0.187).

Both releases are sums of per-record terms of norm <= C (gradient) and in [0, C_l] (loss): add/remove-one-record
sensitivities C and C_l, noise multipliers sigma and sigma_l. Our accounting composes both per round
(``protocols.privacy.accountant.epsilon_spent(..., companion=sigma_l)``); :func:`paper_epsilon` is the paper's
gradient-only figure, reported beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

#: The loss bound's starting value C_l0 (the paper's and the authors' code's).
LOSS_BOUND_INIT = 2.5
#: The floor of the adaptive loss bound (Decision: noise can push F~_i to 0 or below, and a bound of 0 sticks).
LOSS_BOUND_FLOOR = 1e-3
#: sigma_l / sigma: the paper's 5 / 2 (sigma 2, sigma_l 5), kept when sigma is calibrated for a target epsilon.
LOSS_NOISE_RATIO = 2.5
#: The global loss before any release (F_0 = 0, as in the authors' code).
INITIAL_GLOBAL_LOSS = 0.0
#: RDP orders of the paper's gradient-only figure: the integers 2..64. With the improved conversion (Balle et al.
#: 2020) they give T = 6/114/267/463/702 (sigma 1/1.5/2/2.5/3, eps 2, q 0.05, delta 1e-5; the paper's Fig. 4 reports
#: 6/115/268/463/708, from the gradient term alone) and T = 776 at eps 3.52, sigma 2 (dp-accounting's default orders,
#: with fractional ones, give 268 and 782).
PAPER_RDP_ORDERS = tuple(range(2, 65))


def fair_weights(losses: torch.Tensor, global_loss: float, lam: float) -> torch.Tensor:
    """``max(0, 1 + lambda (f(w_t; x_j) - F_t))`` per record (Eqs. 10-11, clamped at 0: a decision).

    The weight of record j's loss gradient in the fair objective's gradient; 1 for every record when lambda = 0.
    A record whose loss is not finite (huge parameters from the server can overflow it), or whose weight overflows,
    gets weight 0: its term of the clipped sum is then 0, the centre of the ball of radius C the add/remove
    accounting assumes, and every weight is finite and >= 0 (no error downstream that depends on the data).
    """
    if lam < 0 or not math.isfinite(lam):
        raise ValueError(f"lambda must be a finite number >= 0, got {lam!r}")
    if not math.isfinite(global_loss):
        raise ValueError(f"the global loss F_t must be finite, got {global_loss!r}")
    if lam == 0:
        return torch.ones_like(losses)
    weights = torch.clamp(1.0 + lam * (losses.detach() - global_loss), min=0.0)
    return torch.where(torch.isfinite(weights), weights, torch.zeros_like(weights))


def fair_clip_factors(weights: torch.Tensor, grad_norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Fair clipping ``c_j = min(max(0, 1 + lambda Delta_j), C / ||g_j||)`` (Eq. 13 with the clamp at 0), from the
    weights of :func:`fair_weights` and the per-record gradient norms ``||g_j||``.

    ``0 <= c_j`` and ``||c_j g_j|| <= C``. ``c_j g_j = clip(a_j g_j, C)`` with ``a_j`` the weight: the silo
    computes the sum as the clipped sum of the weighted per-record gradients
    (``client.gradients.weighted_clipped_gradient_sum``); this function states Eq. 13 itself (tests check the two
    agree). A zero gradient gets ``c_j = a_j``. A weight or a gradient norm that is not finite gets ``c_j = 0``: the
    record contributes 0, as in ``weighted_clipped_gradient_sum`` (`protocols.models.clip_factors` says why).
    """
    if not clip > 0 or not math.isfinite(clip):
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    weights = torch.clamp(weights, min=0.0)
    bound = torch.where(grad_norms > 0, clip / torch.where(grad_norms > 0, grad_norms, 1.0), math.inf)
    factors = torch.minimum(weights, bound)
    return torch.where(torch.isfinite(weights) & torch.isfinite(grad_norms), factors, torch.zeros_like(factors))


def clipped_loss_sum(losses: torch.Tensor, bound: float) -> torch.Tensor:
    """``sum_j min(C_l, max(0, f(w_i; x_j)))`` (Eq. 14): each record contributes a value in [0, C_l], so adding or
    removing one record moves the sum by at most C_l, the sensitivity of the loss release (Eq. 15).

    A loss that is not finite (NaN or inf: huge parameters from the server) contributes 0, a value in [0, C_l]
    decided from that record alone; a NaN term would make the release NaN exactly when the record is there."""
    if not bound > 0 or not math.isfinite(bound):
        raise ValueError(f"the loss bound C_l must be a finite number > 0, got {bound!r}")
    values = losses.detach().to(torch.float64)
    clamped = torch.clamp(values, min=0.0, max=bound)
    return torch.where(torch.isfinite(values), clamped, torch.zeros_like(clamped)).sum()


def next_loss_bound(released: float) -> float:
    """The next round's bound: the client's own last release, floored (``C_l <- max(1e-3, F~_i)``, Decision)."""
    if not math.isfinite(released):
        raise ValueError(f"the released loss must be finite, got {released!r}")
    return max(LOSS_BOUND_FLOOR, float(released))


def server_average(values: Sequence[np.ndarray], records: Sequence[int]) -> np.ndarray:
    """``sum_i p_i v_i`` with ``p_i = n_i / n`` (the server's update of w and F, Alg. 2), in float64."""
    n = np.asarray(records, dtype=np.float64)
    if n.ndim != 1 or len(n) != len(values) or len(n) == 0 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"records must be one count >= 0 per value with a positive total, got {list(records)}")
    p = n / n.sum()
    return sum((w * np.asarray(v, dtype=np.float64) for w, v in zip(p, values, strict=True)), np.zeros(()))


def paper_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """The paper's epsilon: the gradient release alone (Theorems 2-4 as the authors' code applies them; the loss
    release is not counted), RDP over :data:`PAPER_RDP_ORDERS` with the improved conversion. Smaller than the
    run's real epsilon, which composes both releases; reported for comparison with the paper only."""
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
    from dp_accounting.rdp import RdpAccountant

    if steps == 0 or math.isinf(noise_multiplier):
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = RdpAccountant(orders=list(PAPER_RDP_ORDERS))
    event = GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1.0:
        event = PoissonSampledDpEvent(sampling_rate, event)
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


def paper_max_steps(epsilon: float, delta: float, sampling_rate: float, noise_multiplier: float) -> int:
    """The largest T whose :func:`paper_epsilon` is <= epsilon (the authors' ``get_max_steps``, Fig. 4's T)."""
    if paper_epsilon(noise_multiplier, sampling_rate, 1, delta) > epsilon:
        return 0
    good, bad = 1, 2
    while paper_epsilon(noise_multiplier, sampling_rate, bad, delta) <= epsilon:
        good, bad = bad, bad * 2
    while bad - good > 1:
        middle = (good + bad) // 2
        if paper_epsilon(noise_multiplier, sampling_rate, middle, delta) <= epsilon:
            good = middle
        else:
            bad = middle
    return good
