"""DP-FedSGD's silo side: one noisy, clipped minibatch gradient per round (DP-SGD of Abadi et al. 2016, per silo).

The silo samples its minibatch by Poisson sampling with rate q = m / n_j (the accountant's assumption; a shuffled
epoch is not covered), clips every per-sample gradient to L2 norm C (vectorized, `torch.func`), sums, adds
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

from silofl.client.data.tabular import NonSensitiveDivision
from silofl.client.gradients import clipped_gradient_sum
from silofl.protocols.models import model_device
from silofl.protocols.privacy.gaussian import GaussianMechanism


def poisson_sample(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a Poisson sample: each record independently with probability `rate`."""
    return np.flatnonzero(rng.random(n) < rate)


def step_sample(n: int, rate: float, rng: np.random.Generator | None, sample: np.ndarray | None) -> np.ndarray:
    """The records of one step: `sample` when the caller drew them (a shuffled epoch's batch, `client.batches`), else
    a Poisson sample at `rate` from `rng`. Exactly one of `rng` and `sample` must be given."""
    if (rng is None) == (sample is None):
        raise ValueError("give either rng (draw a Poisson sample) or sample (the step's records), not both or neither")
    if sample is not None:
        return sample
    return poisson_sample(n, rate, rng)


def step_batch(model: nn.Module, data: NonSensitiveDivision, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The features and labels of the records `idx` as tensors on the model's device (`protocols.devices`: the
    silo's `device`; on the CPU the very arrays' views, as before the option)."""
    device = model_device(model)
    return torch.from_numpy(data.features[idx]).to(device), torch.from_numpy(data.labels[idx]).to(device)


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
    on the CPU. The clipped sum is computed on the model's device and moved to the CPU before the noise is drawn
    from `noise_generator` (a CPU generator): the same draw on every device.

    Finite whatever finite model the server sends: a record whose gradient, or its norm, is not finite contributes 0
    (`client.gradients.clipped_gradient_sum`), so the release never turns NaN because one record is there."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (the public divisor m of the noisy sum), got {batch_size}")
    n = len(data.labels)
    idx = poisson_sample(n, sampling_rate, sample_rng)
    x, y = step_batch(model, data, idx)
    total = clipped_gradient_sum(model, x, y, clip).cpu()  # the noise is drawn on the CPU (`protocols.devices`)
    mechanism = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier)
    released = mechanism.release(total, noise_generator) if noise_multiplier > 0 else total
    return released / batch_size
