"""DP-FedSGD's silo side: one noisy, clipped minibatch gradient per round (DP-SGD of Abadi et al. 2016, per silo).

The silo samples its minibatch by Poisson sampling with rate q = m / n_j (the accountant's assumption; a shuffled
epoch is not covered), clips every per-sample gradient to L2 norm C (vectorized, `torch.func`), sums, adds
N(0, (sigma C)^2 I) inside the silo and divides by the expected batch size m = q n_j. Under add/remove-one-record
neighbours the clipped sum has L2 sensitivity C, so the release is the Gaussian mechanism with noise multiplier sigma;
the batch size itself is never released.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from client.data.tabular import NonSensitiveDivision
from client.gradients import clipped_gradient_sum
from protocols.privacy.gaussian import GaussianMechanism


def poisson_sample(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a Poisson sample: each record independently with probability `rate`."""
    return np.flatnonzero(rng.random(n) < rate)


def noisy_gradient(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    sampling_rate: float,
    clip: float,
    noise_multiplier: float,
    sample_rng: np.random.Generator,
    noise_generator: torch.Generator,
) -> torch.Tensor:
    """The private release: (sum of clipped per-sample gradients + Gaussian noise) / (q n), flattened."""
    n = len(data.labels)
    idx = poisson_sample(n, sampling_rate, sample_rng)
    x = torch.from_numpy(data.features[idx])
    y = torch.from_numpy(data.labels[idx])
    total = clipped_gradient_sum(model, x, y, clip)
    mechanism = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier)
    released = mechanism.release(total, noise_generator) if noise_multiplier > 0 else total
    return released / (sampling_rate * n)
