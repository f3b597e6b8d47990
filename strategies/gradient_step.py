"""Server side of one-step-per-round algorithms (DP-FedSGD): average the silos' gradients, take one SGD step.

The silos' replies are already private (noise added inside each silo), so the server only post-processes them:
theta_{t+1} = theta_t - eta_t * sum_j w_j g_j with w_j = n_j / n (public, from the setup round), and eta_t following a
step schedule (a factor `lr_decay` every `lr_decay_epochs` passes over the data).
"""

from __future__ import annotations

import math

import numpy as np

from protocols import messages as msg
from strategies.base import Arrays, SiloflStrategy, SiloUpdate, StrategyInputs, weighted_sum


class StepSchedule:
    """eta_t = lr * decay ** floor(epoch(t) / decay_epochs), with epoch(t) = t * m / mean_j n_j."""

    def __init__(self, lr: float, *, decay: float = 1.0, decay_epochs: float = 0.0, rounds_per_epoch: float = 1.0):
        self.lr, self.decay, self.decay_epochs, self.rounds_per_epoch = lr, decay, decay_epochs, rounds_per_epoch

    def __call__(self, server_round: int) -> float:
        if self.decay_epochs <= 0 or self.decay == 1.0:
            return self.lr
        epoch = (server_round - 1) / self.rounds_per_epoch
        return self.lr * self.decay ** math.floor(epoch / self.decay_epochs)


class GradientStep(SiloflStrategy):
    """FedSGD: one (noisy) gradient per silo per round, averaged, one descent step."""

    def __init__(self, *args, schedule: StepSchedule, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.schedule = schedule
        n = np.array([e.info.n_train for e in self.federation.silos], dtype=np.float64)
        self.weights = n / n.sum()

    def round_lr(self, server_round: int) -> float:
        return self.schedule(server_round)

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        lr = self.schedule(server_round)
        out = {}
        for name, value in current.items():
            grad = weighted_sum(self.weights, updates, msg.UPDATE, name)
            out[name] = (value.astype(np.float64) - lr * grad).astype(np.float32)
        return out


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


def build(inputs: StrategyInputs) -> GradientStep:
    """DP-FedSGD's server (the `dp-fedsgd` registry entry)."""
    return GradientStep(inputs.federation, inputs.tabular_spec(), schedule=step_schedule(inputs), **inputs.common)
