"""Batches, priors and W shared by the tests of SteFFLe's maths (`tests/protocols/steffle/test_steffle_<module>.py` for
the modules of `protocols/steffle/`): random soft predictions with every (group, label) cell filled, the batch's own
prior, a group-balanced prior far from uniform, and a random W of the prior's shape."""

from __future__ import annotations

import numpy as np
import torch

from silofl.protocols.steffle import GroupPrior

SHAPES = [(2, 2), (3, 3), (3, 2), (2, 4)]  # (k groups, l labels)


def batch(n: int, k: int, l_: int, seed: int = 0, dtype: torch.dtype = torch.float64):
    """Random soft predictions, groups and labels; every (group, label) cell is non-empty."""
    g = torch.Generator().manual_seed(seed)
    F = torch.softmax(2.0 * torch.randn(n, l_, generator=g, dtype=dtype), dim=1)
    cells = torch.arange(k * l_).repeat(n // (k * l_) + 1)[:n]
    cells = cells[torch.randperm(n, generator=g)]
    return F, cells // l_, cells % l_


def _counts(groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> np.ndarray:
    counts = np.zeros((k, l_))
    np.add.at(counts, (groups.numpy(), labels.numpy()), 1)
    return counts


def batch_prior(notion: str, groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> GroupPrior:
    """The batch's own (conditional) group frequencies."""
    return GroupPrior.from_counts(notion, _counts(groups, labels, k, l_))


def balanced_prior(notion: str, groups: torch.Tensor, labels: torch.Tensor, k: int, l_: int) -> GroupPrior:
    """A prior far from uniform (not the batch's frequencies), balanced."""
    counts = _counts(groups, labels, k, l_) * np.linspace(1.0, 6.0, k)[:, None]
    return GroupPrior.from_counts(notion, counts, balanced=True)


def random_w(prior: GroupPrior, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A random W of the prior's shape (standard normal entries, seeded)."""
    return torch.randn(prior.w_shape(), generator=torch.Generator().manual_seed(seed), dtype=dtype)
