"""Which of its records a silo's division uses in a round: its Poisson sample, or its batch of a shuffled epoch.

The run option `sampling` (`steffle` and `tran`; ``protocols.options.SamplingOptions``) chooses. ``poisson`` draws
each record with probability q = min(1, m / n_j) from the round's seeded stream (`client.randomness`), exactly the
draw the divisions made before the option existed; ``shuffle`` takes the round's batch of the division's shuffled
epoch (`protocols.shuffled_epochs`), whose permutation is seeded by (run seed, silo id, division, epoch). The two
divisions draw from independent streams either way.

Also the helpers every minibatch algorithm's tensor code takes its records with: :func:`poisson_sample`,
:func:`step_sample` (the drawn sample or the one the caller gives) and :func:`step_batch` (those records' tensors).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from silofl.client import randomness
from silofl.client.data.tabular import NonSensitiveDivision
from silofl.protocols import shuffled_epochs
from silofl.protocols.messages import TrainInstruction
from silofl.protocols.models import model_device

Division = Literal["nonsensitive", "sensitive"]

_POISSON_STREAMS = {"nonsensitive": randomness.SAMPLING, "sensitive": randomness.SENSITIVE_SAMPLING}
_EPOCH_STREAMS = {"nonsensitive": randomness.EPOCH_ORDER, "sensitive": randomness.SENSITIVE_EPOCH_ORDER}


def poisson_sample(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a Poisson sample: each record independently with probability `rate`."""
    return np.flatnonzero(rng.random(n) < rate)


def step_sample(n: int, rate: float, rng: np.random.Generator | None, sample: np.ndarray | None) -> np.ndarray:
    """The records of one step: `sample` when the caller drew them (a shuffled epoch's batch, :func:`round_sample`),
    else a Poisson sample at `rate` from `rng`. Exactly one of `rng` and `sample` must be given."""
    if (rng is None) == (sample is None):
        raise ValueError("give either rng (draw a Poisson sample) or sample (the step's records), not both or neither")
    if sample is not None:
        return sample
    return poisson_sample(n, rate, rng)


def step_batch(model: nn.Module, data: NonSensitiveDivision, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The features and labels of the records `idx` as tensors on the model's device (`protocols.devices`: the
    silo's `device`; on the CPU the very arrays' views, as before the option)."""
    device = model_device(model)
    return torch.from_numpy(data.features[idx]).to(device), torch.from_numpy(data.labels[idx]).to(device)


def round_sample(
    context: Context, instr: TrainInstruction, *, silo_id: int, records: int, division: Division
) -> np.ndarray:
    """The indices of the records `division` uses in round ``instr.server_round``, in increasing order.

    An instruction without a `sampling` field (an algorithm without the option) samples by Poisson.
    """
    if getattr(instr, "sampling", "poisson") == "shuffle":
        batches = shuffled_epochs.batches_per_epoch(records, instr.batch_size)
        epoch, batch = shuffled_epochs.position(instr.server_round, batches)
        seed = randomness.epoch_seed(seed=instr.seed, silo_id=silo_id, epoch=epoch, stream=_EPOCH_STREAMS[division])
        return shuffled_epochs.batch_indices(records, instr.batch_size, batch, seed)
    rng = randomness.numpy_rng(
        context, seed=instr.seed, silo_id=silo_id, server_round=instr.server_round, stream=_POISSON_STREAMS[division]
    )
    return poisson_sample(records, min(1.0, instr.batch_size / records), rng)
