"""The server of Tran et al. 2021 adapted to silos: one primal step and one dual step per round.

The server holds the model theta, the multipliers lambda (one per fairness constraint, `protocols.tran`) and the sign
of the last violation estimate. Each round it broadcasts theta, the signed multipliers ``c = lambda (.) sign(nu_hat)``
and the group prior, and receives from every silo j the loss gradient g_j (in the clear: it does not depend on the
sensitive attributes) and, noised inside the silo, the clipped gradient h_j of the constraint term ``sum c (.) nu``
and the group mass m_j (`client.rounds.tran`). Then, with w_j = n_j / n::

    theta_{t+1} = theta_t - eta_theta(t) * sum_j w_j (g_j + h_j)          (primal: descent on L + sum lambda |nu|)
    nu_hat_t    = violations(sum_j w_j m_j, prior)                         (noised estimate of the constraints)
    lambda_{t+1} = lambda_t + s * |nu_hat_t|                               (dual ascent, step s = `dual-lr`)

and sign(nu_hat_t) weights the next round's constraint gradient. lambda starts at `lambda` for every constraint
(the paper starts at 0: `--lambda 0`); with `dual-lr 0` it stays there (a fixed-penalty method). Everything the server
computes from the silos' replies is post-processing of their private releases. The server returns the last iterate.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from silofl.protocols import messages as msg
from silofl.protocols import tran
from silofl.protocols.fairness_prior import GroupPrior
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.lr_schedule import StepSchedule, step_schedule
from silofl.strategies.replies import Arrays, SiloUpdate, weighted_sum

MASS = "mass"  # the group mass in the silos' fair-update record (`client.rounds.tran.MASS`)


class TranStrategy(SiloflStrategy):
    """Tran et al.'s server: primal descent on theta with the silos' noised constraint gradients, dual ascent on lambda.

    Tran, Fioretto, Van Hentenryck, "Differentially Private and Fair Deep Learning: A Lagrangian Dual Approach", AAAI
    2021 (PF-LD), adapted to silos under SteFFLe's threat model (noise on the sensitive attributes, added in each
    silo); the SteFFLe paper's baseline.

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`.
    schedule : StepSchedule
        eta_theta(t), the primal step size (`lr`, `lr-decay`, `lr-decay-epochs`).
    prior : GroupPrior
        the group prior from the silos' noised group counts.
    initial_multiplier : float
        lambda_0, every constraint's starting multiplier (`lambda`; the paper: 0).
    dual_lr : float
        s, the dual step size (`dual-lr`; 0: a fixed penalty).
    """

    def __init__(
        self,
        *args,
        schedule: StepSchedule,
        prior: GroupPrior,
        initial_multiplier: float,
        dual_lr: float,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        if initial_multiplier < 0 or dual_lr < 0:
            raise ValueError(f"lambda and dual-lr must be >= 0, got {initial_multiplier} and {dual_lr}")
        self.schedule = schedule
        self.prior = prior
        self.dual_lr = float(dual_lr)
        # The round-to-round state (numpy arrays, so that a checkpoint keeps them: `SiloflStrategy.state_arrays`):
        # the multipliers and the last violation estimate (0 before the first round: no constraint gradient then).
        self.lam = np.full(prior.w_shape(), float(initial_multiplier), dtype=np.float64)
        self.nu = np.zeros(prior.w_shape(), dtype=np.float64)
        n = np.array([e.info.n_train for e in self.federation.silos], dtype=np.float64)
        self.weights = n / n.sum()

    def round_lr(self, server_round: int) -> float:
        return self.schedule(server_round)

    def train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        c = tran.signed_multipliers(self.lam, self.nu).astype(np.float32)
        fairness = msg.arrays_record({"multipliers": c, "prior": self.prior.probs.astype(np.float32)})
        return {msg.MODEL: arrays, msg.FAIRNESS: fairness}

    def reply_specs(self) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        return {msg.UPDATE: self.param_spec, msg.FAIR_UPDATE: [*self.param_spec, (MASS, self.prior.w_shape())]}

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        lr = self.schedule(server_round)
        out = {}
        for name, value in current.items():
            step = weighted_sum(self.weights, updates, msg.UPDATE, name)
            step = step + weighted_sum(self.weights, updates, msg.FAIR_UPDATE, name)
            out[name] = (value.astype(np.float64) - lr * step).astype(np.float32)
        nu = tran.violations(weighted_sum(self.weights, updates, msg.FAIR_UPDATE, MASS), self.prior)
        self.lam = tran.dual_step(self.lam, nu, self.dual_lr)
        self.nu = nu
        return out

    def result_state(self) -> dict[str, object]:
        return {
            "multipliers": self.lam.tolist(),
            "violation_estimate": self.nu.tolist(),
            "prior": self.prior.probs.tolist(),
        }


def build(inputs: StrategyInputs) -> TranStrategy:
    """Tran et al.'s server (the `tran` registry entry): the prior from the silos' noised group counts."""
    from silofl.protocols.fairness_prior import PRIOR_FLOOR

    config = inputs.config
    prior = GroupPrior.from_counts(config.fairness, inputs.counts(), floor=PRIOR_FLOOR)
    return TranStrategy(
        inputs.federation,
        inputs.tabular_spec(),
        schedule=step_schedule(inputs),
        prior=prior,
        initial_multiplier=config.lam,
        dual_lr=config.dual_lr,
        **inputs.common,
    )
