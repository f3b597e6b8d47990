"""FedFDP's silo side (Ling et al. 2024, Alg. 2): one fair, clipped, noised DP-SGD step and the
noised loss release, on tensors. The math is `protocols.fedfdp`; the Flower round is `client.rounds.fedfdp`.

With lambda = 0 the fair clipping is plain clipping and the step is DP-FedSGD's: :func:`fair_noisy_gradient` then
calls DP-FedSGD's step, :func:`client.noisy_gradient.noisy_gradient` (same sample, same noise, same numbers).

Device (`--device`, `protocols.devices`): the losses and the clipped gradient sum are computed on the model's device
and moved to the CPU before their noise is drawn; both releases leave on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from silofl.client.batches import poisson_sample, step_batch
from silofl.client.data.tabular import NonSensitiveDivision
from silofl.client.gradients import per_sample_losses, weighted_clipped_gradient_sum
from silofl.client.noisy_gradient import noisy_gradient
from silofl.protocols import fedfdp
from silofl.protocols.privacy.gaussian import GaussianMechanism


def fair_noisy_gradient(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    global_loss: float,
    lam: float,
    sampling_rate: float,
    batch_size: int,
    clip: float,
    noise_multiplier: float,
    sample_rng: np.random.Generator,
    noise_generator: torch.Generator,
) -> torch.Tensor:
    """``(sum_{j in B} c_j g_j + N(0, sigma^2 C^2 I)) / m`` flattened (Eqs. 12-13), B a Poisson(q) sample.

    ``c_j g_j = clip(max(0, 1 + lambda (f(w_t; x_j) - F_t)) g_j, C)`` (:func:`protocols.fedfdp.fair_clip_factors`),
    so every term has norm <= C: the sum's add/remove sensitivity is C and the noise multiplier is sigma. m is the
    run's batch size, public (``q n_i`` whenever q < 1; the expected batch size, never the realized |B|, which depends
    on the data).

    A record whose loss f(w_t; x_j) is not finite (a huge model from the server) gets weight 0
    (:func:`protocols.fedfdp.fair_weights`) and one whose weighted gradient is not finite contributes 0
    (`client.gradients.weighted_clipped_gradient_sum`): the step never raises and never releases NaN because of
    one record.
    """
    if lam == 0:  # Eq. 11 with lambda = 0 is DP-FedSGD's gradient: its own code
        return noisy_gradient(
            model,
            data,
            sampling_rate=sampling_rate,
            batch_size=batch_size,
            clip=clip,
            noise_multiplier=noise_multiplier,
            sample_rng=sample_rng,
            noise_generator=noise_generator,
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (the public divisor m of the noisy sum), got {batch_size}")
    idx = poisson_sample(len(data.labels), sampling_rate, sample_rng)
    x, y = step_batch(model, data, idx)
    weights = fedfdp.fair_weights(per_sample_losses(model, x, y), global_loss, lam)
    total = weighted_clipped_gradient_sum(model, x, y, weights, clip).cpu()  # noised on the CPU
    mechanism = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier)
    released = mechanism.release(total, noise_generator) if noise_multiplier > 0 else total
    return released / batch_size


def loss_release(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    bound: float,
    sampling_rate: float,
    batch_size: int,
    noise_multiplier: float,
    sample_rng: np.random.Generator,
    noise_generator: torch.Generator,
) -> float:
    """``F~_i = (sum_{j in B'} min(C_l, max(0, f(w_i; x_j))) + N(0, sigma_l^2 C_l^2)) / m`` (Eqs. 14-15, Alg. 2
    l.16-20) with `model` holding w_i and B' a fresh Poisson(q) sample (`sample_rng` must be independent of B's).

    Without noise (`noise_multiplier` 0: a non-private run) nothing is released under DP, so the losses are not
    clipped at C_l: the release is the sample's mean loss, as in silofl's non-private ablation and the authors'
    non-private path. Clipping there would only bias F_t downwards (and, with the adaptive bound, drive it to the
    floor).

    A loss that is not finite (a huge model from the server) counts as 0 on both paths
    (:func:`protocols.fedfdp.clipped_loss_sum`): the release is finite, and never NaN because of one record."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (the public divisor m of the noisy sum), got {batch_size}")
    idx = poisson_sample(len(data.labels), sampling_rate, sample_rng)
    losses = per_sample_losses(model, *step_batch(model, data, idx)).cpu()  # clipped, summed and noised on the CPU
    if noise_multiplier == 0:
        values = losses.detach().to(torch.float64)
        values = torch.where(torch.isfinite(values), torch.clamp(values, min=0.0), torch.zeros_like(values))
        return float(values.sum()) / batch_size
    total = fedfdp.clipped_loss_sum(losses, bound).reshape(1)
    mechanism = GaussianMechanism(sensitivity=bound, noise_multiplier=noise_multiplier)
    released = mechanism.release(total, noise_generator) if noise_multiplier > 0 else total
    return float(released[0]) / batch_size


def local_step(parameters: torch.Tensor, gradient: torch.Tensor, lr: float) -> torch.Tensor:
    """``w_i = w_t - eta * gradient`` (Eq. 12; `gradient` already holds the 1/m and the noise)."""
    return parameters - lr * gradient
