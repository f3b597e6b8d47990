"""FedAvg's silo side (McMahan et al. 2017): local epochs of minibatch SGD from the server's model; no privacy."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from silofl.client.data.tabular import NonSensitiveDivision
from silofl.protocols.models import loss_fn, model_device


def local_sgd(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
) -> int:
    """Train `model` in place for `epochs` shuffled passes; return the number of local records.

    The silo's records go to the model's device once (the silo's `device`, `protocols.devices`); the shuffles are
    numpy draws from `rng` whatever the device (on the CPU: the same steps as before the option)."""
    device = model_device(model)
    x_all = torch.from_numpy(data.features).to(device)
    y_all = torch.from_numpy(data.labels).to(device)
    n = len(y_all)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(n)).to(device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x_all[idx]), y_all[idx]).backward()
            optimizer.step()
    return n
