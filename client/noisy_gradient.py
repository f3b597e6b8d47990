"""DP-SGD's release on a silo (Abadi et al. 2016): per-record loss gradients clipped to C, summed, Gaussian noise.

The record-level release of a loss gradient that several algorithms make: DP-FedSGD's whole step
(:func:`noisy_gradient`), FedFDP's at lambda = 0 (its fair clipping is then plain clipping: the same sample, the same
noise, the same numbers) and the loss release of a whole-record round of SteFFLe and Tran et al.
(:func:`loss_release`, on the round's one sample).

:func:`noisy_gradient` samples its minibatch by Poisson sampling with rate q = m / n_j (the accountant's assumption; a
shuffled epoch is not covered), clips every per-sample gradient to L2 norm C (vectorized, `torch.func`), sums, adds
N(0, (sigma C)^2 I) inside the silo and divides by the run's batch size m, a public constant. Under add/remove-one-
record neighbours the clipped sum has L2 sensitivity C, so the release is the Gaussian mechanism with noise multiplier
sigma; the batch size itself is never released.

The divisor must not depend on the data: dividing by the silo's own record count (q n_j, which is n_j when m >= n_j
and q = 1) lets one added record move the release by up to 2C / n_j, twice what the noise covers
(`docs/PRIVACY_AUDIT.md` measured epsilon lower bounds above the claim for that variant). With m >= n_j the release
is sum / m, a mean scaled by n_j / m: a small silo's step is shorter, never less private.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from silofl.client.batches import poisson_sample, step_batch
from silofl.client.data.tabular import NonSensitiveDivision
from silofl.client.gradients import clipped_gradient_sum
from silofl.protocols.privacy.gaussian import GaussianMechanism


def loss_release(
    model: nn.Module,
    data: NonSensitiveDivision,
    idx: np.ndarray,
    *,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """The per-record loss gradients of the records `idx` clipped to C and summed
    (`client.gradients.clipped_gradient_sum`: a record whose gradient, or its norm, is not finite contributes 0), plus
    N(0, (sigma C)^2) drawn from `generator` on the CPU (none with `noise_multiplier` 0); the SUM, on the CPU (the
    caller divides it by the public batch size). The clipped sum is computed on the model's device and moved to the
    CPU before the noise is drawn: the same draw on every device. It reads no sensitive attribute."""
    x, y = step_batch(model, data, idx)
    total = clipped_gradient_sum(model, x, y, clip).cpu()  # the noise is drawn on the CPU (`protocols.devices`)
    mechanism = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier)
    return mechanism.release(total, generator) if noise_multiplier > 0 else total


def noisy_gradient(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    sampling_rate: float,
    batch_size: int,
    clip: float,
    noise_multiplier: float,
    sample_rng: np.random.Generator,
    noise_generator: torch.Generator,
) -> torch.Tensor:
    """The private release: (sum of clipped per-sample gradients + Gaussian noise) / m, flattened (m = batch_size),
    on the CPU: :func:`loss_release` on a Poisson sample at `sampling_rate` drawn from `sample_rng`.

    Finite whatever finite model the server sends: a record whose gradient, or its norm, is not finite contributes 0,
    so the release never turns NaN because one record is there."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (the public divisor m of the noisy sum), got {batch_size}")
    idx = poisson_sample(len(data.labels), sampling_rate, sample_rng)
    released = loss_release(model, data, idx, clip=clip, noise_multiplier=noise_multiplier, generator=noise_generator)
    return released / batch_size
