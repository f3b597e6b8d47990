"""A noised evaluation: the confusion counts of a silo's test split through a Gaussian histogram, charged first.

Under a policy with `evaluation = "noised"` (`protocols.silo_policy`) the silo answers an evaluation with

    counts + N(0, s^2) on each (group, label, prediction) cell,   loss sum = B (sum_i min(loss_i, B) / B + N(0, s^2))

with ``s`` the policy's `evaluation-noise` and ``B`` its `evaluation-loss-bound`. One test record contributes a
one-hot cell and its clipped loss over B, a vector of norm at most sqrt(2); replacing it moves that vector by at most
sqrt(1 + 1 + 1) = sqrt(3) (one cell down, one up, the loss by at most B). The release is one Gaussian mechanism at rate
1 (every test record, no sampling), where only that distance matters: under dp-accounting's ``REPLACE`` adjacency it
is radius sqrt(3)/2 at noise multiplier ``s / (sqrt(3)/2)`` (`protocols.privacy.accountant`: at rate 1, radius R is a
Gaussian of sensitivity 2 R). The silo charges it to its lifetime ledger BEFORE computing it (`client.lifetime_ledger`
`charge_evaluation`, refused past the lifetime budget), then rounds the noised counts to integers and clips them at 0,
and the loss sum at 0 (post-processing). The report carries ``noise_std = s`` so that the server knows the counts are
noised (they no longer sum to the test split's size).

A sensitive party (separate from the feature parties) answers the server's confusion query, the counts of the test
predictions the feature parties made by the sensitive groups it holds, the same way without the loss (it holds none):
:func:`noised_counts`, one record moving one count down and one up, radius sqrt(2)/2 (:data:`COUNTS_RADIUS`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context

from silofl.client import lifetime_ledger, privacy_state, randomness
from silofl.protocols import messages as msg
from silofl.protocols.silo_policy import SiloPolicy

#: One test record's move under replacement, halved: the ``REPLACE`` radius of the release at rate 1.
EVALUATION_RADIUS = math.sqrt(3.0) / 2.0
#: The same for counts alone (a sensitive party's confusion counts: no loss), one cell down and one up.
COUNTS_RADIUS = math.sqrt(2.0) / 2.0
#: The same for a loss sum alone (a feature party's test loss with sealed records: its clipped loss over B moves by
#: at most 1).
LOSS_RADIUS = 0.5
#: The random stream of a noised evaluation (`client.randomness`; distinct from the training streams).
EVALUATION_STREAM = 7


def evaluation_multiplier(policy: SiloPolicy, radius: float = EVALUATION_RADIUS) -> float:
    """The release's noise multiplier under replace-one (what the lifetime ledger composes)."""
    return policy.evaluation_noise / radius


def _ledger_folder(context: Context, who: str, what: str) -> Path:
    """The node's state folder, where its lifetime ledger is (MessageError naming `what` needs it, if none)."""
    directory = privacy_state.state_dir(context)
    if directory is None:
        raise msg.MessageError(
            f"{who}: its policy charges {what} to its lifetime ledger, which needs a state folder (node config "
            f"'{privacy_state.STATE_DIR_KEY}'); it has none, so it refuses"
        )
    return directory


def charge(
    context: Context, policy: SiloPolicy, *, server_round: int, who: str, radius: float = EVALUATION_RADIUS
) -> None:
    """Charge one noised evaluation to the node's lifetime ledger, before it is computed (MessageError: refused);
    `radius`: :data:`EVALUATION_RADIUS` for counts and loss, :data:`COUNTS_RADIUS` for counts alone."""
    directory = _ledger_folder(context, who, "each noised evaluation")
    lifetime_ledger.charge_evaluation(
        directory,
        policy,
        multiplier=evaluation_multiplier(policy, radius),
        run_id=int(context.run_id),
        server_round=server_round,
        who=who,
    )


def noised_release(
    counts: np.ndarray, losses: np.ndarray, policy: SiloPolicy, generator: torch.Generator
) -> tuple[np.ndarray, float]:
    """The noised counts (int64, >= 0) and loss sum (>= 0) of a test split: `counts` its exact (group, label,
    prediction) counts, `losses` each record's loss (non-finite losses count as the bound)."""
    s = policy.evaluation_noise
    bound = policy.evaluation_loss_bound
    clipped = np.where(np.isfinite(losses), np.clip(losses, 0.0, bound), bound)
    noise = torch.randn(counts.size + 1, generator=generator, dtype=torch.float64).numpy() * s
    noised_counts = counts.astype(np.float64).ravel() + noise[:-1]
    loss_sum = bound * (float(clipped.sum()) / bound + float(noise[-1]))
    out = np.clip(np.rint(noised_counts), 0, None).astype(np.int64).reshape(counts.shape)
    return out, max(loss_sum, 0.0)


def noised_counts(counts: np.ndarray, policy: SiloPolicy, generator: torch.Generator) -> np.ndarray:
    """`counts` (exact counts by (group, label, prediction)) + N(0, s^2) per cell, rounded and clipped at 0 (int64):
    a sensitive party's answer to a confusion query (one record: one cell, radius :data:`COUNTS_RADIUS`)."""
    noise = torch.randn(counts.size, generator=generator, dtype=torch.float64).numpy() * policy.evaluation_noise
    noised = counts.astype(np.float64).ravel() + noise
    return np.clip(np.rint(noised), 0, None).astype(np.int64).reshape(counts.shape)


def noised_loss(losses: np.ndarray, policy: SiloPolicy, generator: torch.Generator) -> float:
    """The loss sum B (sum_i min(loss_i, B) / B + N(0, s^2)), clipped at 0: a feature party's test loss alone (one
    record moves the clipped sum over B by at most 1, radius :data:`LOSS_RADIUS`)."""
    bound = policy.evaluation_loss_bound
    clipped = np.where(np.isfinite(losses), np.clip(losses, 0.0, bound), bound)
    noise = float(torch.randn(1, generator=generator, dtype=torch.float64)[0]) * policy.evaluation_noise
    return max(bound * (float(clipped.sum()) / bound + noise), 0.0)


class NoisedRelease:
    """One node's noised evaluation under its policy: :meth:`charge` before anything is computed, then the noised
    counts (with the clipped loss, :meth:`counts_and_loss`; alone, :meth:`counts`)."""

    def __init__(
        self, context: Context, policy: SiloPolicy, *, node_id: int, who: str, radius: float = EVALUATION_RADIUS
    ) -> None:
        self.context, self.policy, self.node_id, self.who, self.radius = context, policy, node_id, who, radius
        self.std = policy.evaluation_noise

    def charge(self, server_round: int) -> None:
        charge(self.context, self.policy, server_round=server_round, who=self.who, radius=self.radius)

    def counts_and_loss(self, counts: np.ndarray, losses: np.ndarray, server_round: int) -> tuple[np.ndarray, float]:
        return noised_release(counts, losses, self.policy, self._generator(server_round))

    def counts(self, counts: np.ndarray, server_round: int) -> np.ndarray:
        return noised_counts(counts, self.policy, self._generator(server_round))

    def loss(self, losses: np.ndarray, server_round: int) -> float:
        return noised_loss(losses, self.policy, self._generator(server_round))

    def _generator(self, server_round: int) -> torch.Generator:
        return generator(self.context, silo_id=self.node_id, server_round=server_round)


def generator(context: Context, *, silo_id: int, server_round: int) -> torch.Generator:
    """The evaluation's noise: seeded by the run in simulation, OS entropy when deployed (`client.randomness`)."""
    return randomness.torch_generator(
        context, seed=int(context.run_id), silo_id=silo_id, server_round=server_round, stream=EVALUATION_STREAM
    )
