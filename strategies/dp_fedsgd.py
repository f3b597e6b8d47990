"""DP-FedSGD's server: average the silos' (noised) gradients, take one SGD step per round.

The silos' replies are already private (noise added inside each silo), so the server only post-processes them:
theta_{t+1} = theta_t - eta_t * sum_j w_j g_j with w_j = n_j / n (public, from the setup round), and eta_t following a
step schedule (a factor `lr_decay` every `lr_decay_epochs` passes over the data; `strategies.lr_schedule`).
"""

from __future__ import annotations

import numpy as np

from silofl.protocols import messages as msg
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.lr_schedule import StepSchedule, step_schedule
from silofl.strategies.replies import Arrays, SiloUpdate, weighted_sum


class DpFedSgdStrategy(SiloflStrategy):
    """DP-FedSGD: one (noisy) gradient per silo per round, averaged, one descent step.

    FedSGD (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS
    2017) with DP-SGD in each silo (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016: per-sample
    clipping and Gaussian noise added before anything leaves the silo); the server sees only private gradients.

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`.
    schedule : StepSchedule
        the server's step size eta_t per round (`lr`, `lr-decay`, `lr-decay-epochs`).
    """

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


def build(inputs: StrategyInputs) -> DpFedSgdStrategy:
    """DP-FedSGD's server (the `dp-fedsgd` registry entry)."""
    return DpFedSgdStrategy(inputs.federation, inputs.tabular_spec(), schedule=step_schedule(inputs), **inputs.common)
