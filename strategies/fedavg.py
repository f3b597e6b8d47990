"""FedAvg (McMahan et al. 2017): silos train locally, the server averages their models weighted by their records."""

from __future__ import annotations

import numpy as np

from silofl.protocols import messages as msg
from silofl.strategies.base import SiloflStrategy, StrategyInputs
from silofl.strategies.federation import RoundError
from silofl.strategies.replies import Arrays, SiloUpdate, weighted_sum


class FedAvg(SiloflStrategy):
    """FedAvg, non-private: each round every silo runs `local_epochs` of minibatch SGD from the global model.

    McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep Networks from
    Decentralized Data", AISTATS 2017. Parameters: those of :class:`strategies.base.SiloflStrategy` only.
    """

    def combine(self, server_round: int, current: Arrays, updates: list[SiloUpdate]) -> Arrays:
        weights = np.array([report.num_examples for _, _, report in updates], dtype=np.float64)
        if weights.sum() <= 0:
            raise RoundError(
                f"round {server_round}: the silos reported no training records (num-examples = 0 from every silo)"
            )
        weights /= weights.sum()
        return {name: weighted_sum(weights, updates, msg.UPDATE, name).astype(np.float32) for name in current}


def build(inputs: StrategyInputs) -> FedAvg:
    """FedAvg's server (the `fedavg` registry entry)."""
    return FedAvg(inputs.federation, inputs.tabular_spec(), **inputs.common)
