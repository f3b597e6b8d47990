"""Which of its records a silo's division uses in a round: its Poisson sample, or its batch of a shuffled epoch.

The run option `sampling` (`steffle` and `tran`; ``protocols.options.SamplingOptions``) chooses. ``poisson`` draws
each record with probability q = min(1, m / n_j) from the round's seeded stream (`client.randomness`), exactly the
draw the divisions made before the option existed; ``shuffle`` takes the round's batch of the division's shuffled
epoch (`protocols.shuffled_epochs`), whose permutation is seeded by (run seed, silo id, division, epoch). The two
divisions draw from independent streams either way.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from flwr.app import Context

from silofl.client import randomness
from silofl.client.algorithms.dp_fedsgd import poisson_sample
from silofl.protocols import shuffled_epochs
from silofl.protocols.messages import TrainInstruction

Division = Literal["nonsensitive", "sensitive"]

_POISSON_STREAMS = {"nonsensitive": randomness.SAMPLING, "sensitive": randomness.SENSITIVE_SAMPLING}
_EPOCH_STREAMS = {"nonsensitive": randomness.EPOCH_ORDER, "sensitive": randomness.SENSITIVE_EPOCH_ORDER}


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
