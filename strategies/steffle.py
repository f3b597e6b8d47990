"""SteFFLe's server: one SGDA step per round on the silos' private gradients (SteFFLe Algorithm 1, line 11).

The server holds the model theta and the ERMI dual variable W. Each round it broadcasts both (with the group prior
P_S, or P_{S|Y} for equalized odds and equal opportunity) and receives from every silo j the loss gradient g_j (its
non-sensitive division's, sent in the clear: it does not depend on the sensitive attributes) and, when lambda > 0, the
noised fairness gradients h_theta_j and h_W_j (its sensitive division's). Then

    theta_{t+1} = theta_t - eta_theta(t) * sum_j w_j (g_j + lambda h_theta_j)
    W_{t+1}     = Proj_{||W||_F <= D}(W_t + eta_W * lambda * sum_j w_j h_W_j)

with w_j = n_j / n. The paper averages with w_j = 1/N over silos of equal size n~; weighting by n_j is the same for
equal silos and keeps the step an unbiased estimate of the objective over all records when they differ. The server
returns the last iterate, which DP-FERMI recommends in practice (Lowy et al., ICLR 2023, remarks after Theorem 3.4; its
analysis returns a uniformly random iterate).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord

from silofl.protocols import messages as msg
from silofl.protocols.steffle import PRIOR_FLOOR, project_frobenius
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.lr_schedule import StepSchedule, step_schedule
from silofl.strategies.replies import Arrays, SiloUpdate, weighted_sum


class SteffleStrategy(SiloflStrategy):
    """SteFFLe's server over silos: descent on theta, projected ascent on W; the silos' fairness replies are private.

    SteFFLe: Gupta, Poornash, Lowy, Razaviyayn, "A Stochastic Optimization Framework for Private and Fair Learning From
    Decentralized Data", 2024 (Algorithm 1); with one silo DP-FERMI (Lowy, Gupta, Razaviyayn, "Stochastic
    Differentially Private and Fair Learning", ICLR 2023). The noise is added in each silo's sensitive division; this
    server adds none. With separate feature and sensitive parties, `build` returns the subclass
    :class:`~strategies.steffle_parties.SteffleSeparatePartiesStrategy`.

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`; the instruction's `lam` is the fairness weight lambda.
    schedule : StepSchedule
        eta_theta(t), the step size on theta (`lr`, `lr-decay`, `lr-decay-epochs`).
    prior : np.ndarray
        the group prior P_S (or P_{S|Y} for equalized odds and equal opportunity) from the silos' noised counts.
    w_shape : tuple of int
        the shape of the ERMI dual variable W (W_0 = 0).
    w_radius : float
        D, the Frobenius radius W is projected onto.
    w_lr : float
        eta_W, the step size of the ascent on W.
    """

    def __init__(
        self,
        *args,
        schedule: StepSchedule,
        prior: np.ndarray,
        w_shape: tuple[int, ...],
        w_radius: float,
        w_lr: float,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.schedule = schedule
        self.prior = np.asarray(prior, dtype=np.float32)
        self.w = np.zeros(w_shape, dtype=np.float64)  # W_0 = 0 (Algorithm 1, line 1)
        self.w_radius = w_radius
        self.w_lr = w_lr
        n = np.array([e.info.n_train for e in self.federation.silos], dtype=np.float64)
        self.weights = n / n.sum()

    @property
    def lam(self) -> float:
        return self.instruction.lam

    def round_lr(self, server_round: int) -> float:
        return self.schedule(server_round)

    def train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        fairness = msg.arrays_record({"w": self.w.astype(np.float32), "prior": self.prior})
        return {msg.MODEL: arrays, msg.FAIRNESS: fairness}

    def reply_specs(self) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        specs = {msg.UPDATE: self.param_spec}
        if self.lam > 0:  # with lambda = 0 the silos compute no fairness gradient and spend no budget
            specs[msg.FAIR_UPDATE] = [*self.param_spec, ("w", tuple(self.w.shape))]
        return specs

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        g = {name: weighted_sum(self.weights, updates, msg.UPDATE, name) for name in current}
        if self.lam == 0:
            return self.sgda_step(server_round, current, g, None, None)
        h = {name: weighted_sum(self.weights, updates, msg.FAIR_UPDATE, name) for name in current}
        return self.sgda_step(server_round, current, g, h, weighted_sum(self.weights, updates, msg.FAIR_UPDATE, "w"))

    def sgda_step(
        self, server_round: int, current: Arrays, g: Arrays, h: Arrays | None, w_gradient: np.ndarray | None
    ) -> Arrays:
        """theta - eta_theta(t) (g + lambda h); W <- Proj(W + eta_W lambda w_gradient) (Algorithm 1, line 11)."""
        lr = self.schedule(server_round)
        out = {}
        for name, value in current.items():
            step = g[name]
            if h is not None:
                step = step + self.lam * h[name]
            out[name] = (value.astype(np.float64) - lr * step).astype(np.float32)
        if w_gradient is not None:
            ascent = self.w_lr * self.lam * w_gradient
            projected = project_frobenius(torch.from_numpy(self.w + ascent), self.w_radius)
            self.w = projected.numpy().astype(np.float64)
        return out

    def result_state(self) -> dict[str, object]:
        return {"w": self.w.tolist(), "prior": self.prior.tolist()}


def build(inputs: StrategyInputs) -> SteffleStrategy:
    """SteFFLe's server (the `steffle` registry entry): the prior from the silos' noised group counts."""
    from silofl.protocols.steffle import GroupPrior, w_shape

    config, info = inputs.config, inputs.federation.info
    prior = GroupPrior.from_counts(config.fairness, inputs.counts(), floor=PRIOR_FLOOR)
    kind = SteffleStrategy
    if inputs.federation.sensitive:  # separate feature and sensitive parties (strategies/steffle_parties.py)
        from silofl.strategies.steffle_parties import SteffleSeparatePartiesStrategy as kind
    return kind(
        inputs.federation,
        inputs.tabular_spec(),
        schedule=step_schedule(inputs),
        prior=prior.probs,
        w_shape=w_shape(config.fairness, info.num_groups, info.num_labels),
        w_radius=config.w_radius,
        w_lr=config.w_lr,
        **inputs.common,
    )
