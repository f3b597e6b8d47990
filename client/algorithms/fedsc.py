"""A FedSC silo's local training: E epochs (or a fixed number of steps) of SGD on its local spectral contrastive loss
(paper eq. 5, Algorithm 1 line "local update").

Each step draws a minibatch of the silo's images, makes two augmented views, computes the representations z1, z2
normalized to norm sqrt(mu) (`protocols.fedsc.normalize_rows`, the models' representation layer: the loss and the
correlations DP-CalR shares live on the same scale) and minimizes

    L_j = - Tr R+_j + 1/2 alpha ||R_j||_F^2 + (1 - alpha) <R_j, Rbar_{-j}>_F        (eq. 5, Rbar_{-j} held constant)

with SGD (momentum, weight decay) and a clip of the gradient's norm (the paper's "gradient clip 3": a stabiliser, not
a privacy mechanism). alpha = 1 and no Rbar_{-j} is plain local SC, i.e. FedAvg+SC's local objective.

``steps > 0`` replaces the epochs by exactly that many minibatch steps: batches are drawn without replacement from a
permutation of the records, reshuffled when it runs out. With one step per round and sharing every round, FedSC's
averaged update is a stochastic gradient of the global loss (eq. 6) taken at the freshest Rbar_{-j}; FEDSC.md says
why that matters on a CPU budget (several local steps against a stale Rbar_{-j} make the silos herd).

The silo's randomness (batch order, augmentations) comes from one seed per round (`client.randomness`), so simulated
runs are reproducible.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from silofl.client.augment import make_views
from silofl.protocols.fedsc import local_loss, normalize_rows


def local_sc_training(
    model: nn.Module,
    images: torch.Tensor,
    augmentation: nn.Module,
    *,
    epochs: int,
    batch_size: int,
    steps: int = 0,
    lr: float,
    momentum: float,
    weight_decay: float,
    grad_clip: float,
    mu: float,
    alpha: float,
    others: torch.Tensor | None,
    seed: int,
) -> float:
    """Train `model` in place on `images` (N, C, H, W); returns the mean loss of the last epoch (of all steps when
    `steps` > 0)."""
    if images.ndim != 4 or len(images) < 2:
        raise ValueError(f"images: need a batch (N >= 2, C, H, W), got shape {tuple(images.shape)}")
    if others is None and alpha != 1.0:
        raise ValueError(f"alpha = {alpha} < 1 needs the other silos' correlation Rbar_-j ('others')")
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    model.train()
    n = len(images)
    b = min(batch_size, n)

    def step(idx: torch.Tensor) -> float:
        v1, v2 = make_views(images[idx], augmentation, 2, seed=int(rng.integers(2**62)))
        z1 = normalize_rows(model(v1), mu)
        z2 = normalize_rows(model(v2), mu)
        loss = local_loss(z1, z2, alpha, others)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return float(loss.detach())

    if steps > 0:
        batches = _step_batches(rng, n, b, steps)
        return float(np.mean([step(idx) for idx in batches]))
    last = 0.0
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(n))
        losses = [step(order[s : s + b]) for s in range(0, n - 1, b) if len(order[s : s + b]) >= 2]
        last = float(np.mean(losses)) if losses else last
    return last


def _step_batches(rng: np.random.Generator, n: int, b: int, steps: int) -> list[torch.Tensor]:
    """`steps` batches of `b` records (b <= n, b >= 2), without replacement within a pass; a new permutation when one
    runs out (a batch never straddles two passes, so it never repeats a record)."""
    out: list[torch.Tensor] = []
    order = rng.permutation(n)
    pos = 0
    while len(out) < steps:
        if pos + b > n:
            order, pos = rng.permutation(n), 0
        out.append(torch.from_numpy(order[pos : pos + b]))
        pos += b
    return out
