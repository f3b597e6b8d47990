"""The server's step-size schedule, shared by the strategies that take one gradient step per round: DP-FedSGD
(`strategies.dp_fedsgd`), SteFFLe (`strategies.steffle`) and Tran et al. (`strategies.tran`).

eta_t = lr * decay ** floor(epoch(t) / decay_epochs): a factor `lr-decay` every `lr-decay-epochs` passes over the mean
silo's data. It lives in a module of its own because three algorithms' servers use it; it belongs to none of them.
"""

from __future__ import annotations

import math

from silofl.strategies.base import StrategyInputs


class StepSchedule:
    """eta_t = lr * decay ** floor(epoch(t) / decay_epochs), with epoch(t) = t * m / mean_j n_j."""

    def __init__(self, lr: float, *, decay: float = 1.0, decay_epochs: float = 0.0, rounds_per_epoch: float = 1.0):
        self.lr, self.decay, self.decay_epochs, self.rounds_per_epoch = lr, decay, decay_epochs, rounds_per_epoch

    def __call__(self, server_round: int) -> float:
        if self.decay_epochs <= 0 or self.decay == 1.0:
            return self.lr
        epoch = (server_round - 1) / self.rounds_per_epoch
        return self.lr * self.decay ** math.floor(epoch / self.decay_epochs)


def step_schedule(inputs: StrategyInputs) -> StepSchedule:
    """The run's lr schedule: `lr`, times `lr-decay` every `lr-decay-epochs` passes over the mean silo's data."""
    config, federation = inputs.config, inputs.federation
    mean_n = federation.n_train / len(federation.silos)
    return StepSchedule(
        config.lr,
        decay=config.lr_decay,
        decay_epochs=config.lr_decay_epochs,
        rounds_per_epoch=mean_n / config.batch_size,
    )
