"""FedFDP's server (Ling et al. 2024, arXiv 2402.16028, Algorithm 2, server side): average the silos' models and their
noised losses, broadcast both.

``w_{t+1} = sum_i p_i w_i`` and ``F_{t+1} = sum_i p_i F~_i`` with ``p_i = n_i / n`` (public, from the setup round);
F_0 = 0. All silos take part every round; no server learning rate; the last iterate is the result. The replies are
private already (noise added in each silo), so this is post-processing. F_t travels to the silos in the
``global-loss`` record and is checked at the silo (shape, dtype, finite) like every array.
"""

from __future__ import annotations

import numpy as np

from silofl.protocols import fedfdp
from silofl.protocols import messages as msg
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.replies import Arrays, SiloUpdate

VALUE = "value"
SCALAR = (1,)


class FedfdpStrategy(SiloflStrategy):
    """FedFDP's server: weighted model average plus the weighted average of the silos' noised losses (the next F_t).

    Ling, Fu, Wang, Li, Cheng, Chen, "FedFDP: Fairness-Aware Federated Learning with Differential Privacy", arXiv
    2402.16028, 2024 (Algorithm 2), a baseline of the SteFFLe paper. The fair clipping and the noise are the silos'.

    Parameters
    ----------
    federation, param_spec, instruction, eval_instruction, timeout
        as :class:`strategies.base.SiloflStrategy`; nothing else (the weights p_i = n_i / n come from the federation,
        F_0 = `protocols.fedfdp.INITIAL_GLOBAL_LOSS`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.records = np.array([e.info.n_train for e in self.federation.silos], dtype=np.float64)
        #: F_t, the global loss broadcast with the model (state: kept in checkpoints)
        self.global_loss = np.full(SCALAR, fedfdp.INITIAL_GLOBAL_LOSS, dtype=np.float64)

    def train_records(self, server_round: int, arrays) -> dict:
        loss = msg.arrays_record({VALUE: self.global_loss.astype(np.float32)})
        return {msg.MODEL: arrays, msg.GLOBAL_LOSS: loss}

    def reply_specs(self) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        return {msg.UPDATE: self.param_spec, msg.LOSS_RELEASE: [(VALUE, SCALAR)]}

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        models = [arrays[msg.UPDATE] for _, arrays, _ in updates]
        out = {
            name: fedfdp.server_average([m[name] for m in models], self.records).astype(np.float32) for name in current
        }
        losses = [arrays[msg.LOSS_RELEASE][VALUE] for _, arrays, _ in updates]
        self.global_loss = fedfdp.server_average(losses, self.records).reshape(SCALAR)
        return out

    def result_state(self) -> dict[str, object]:
        return {"global_loss": float(self.global_loss[0])}


def build(inputs: StrategyInputs) -> FedfdpStrategy:
    """FedFDP's server (the `fedfdp` registry entry)."""
    return FedfdpStrategy(inputs.federation, inputs.tabular_spec(), **inputs.common)
