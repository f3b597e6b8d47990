"""Where a silo's randomness (Poisson sampling, shuffling, Gaussian noise) comes from.

Simulated silos derive every draw from (run seed, silo id, round, stream), so one seed gives one result on every
engine, whatever order the silos run in. A deployed silo must not do that: the server knows the run seed, and noise it
can regenerate is noise it can subtract (and a sample it can predict voids amplification by sampling). A deployed silo
therefore draws from the operating system's entropy unless its operator sets `deterministic-noise = true` in its
node config for a reproducible experiment.

One exception, :func:`epoch_seed`: the permutations of shuffled epochs (`protocols.shuffled_epochs`) come from the run
seed on every silo, deployed or not. Every round of an epoch must read the same permutation, also in a fresh ClientApp
process per message and after a restart, and a permutation the server can predict costs nothing: it is independent of
the data, and shuffled epochs are accounted without any amplification (each epoch as one unsampled release).
"""

from __future__ import annotations

import secrets

import numpy as np
import torch
from flwr.app import Context

from silofl.client.silo_data import is_deployed

DETERMINISTIC_KEY = "deterministic-noise"
#: Independent streams of one silo in one round (SENSITIVE_SAMPLING: the sensitive division's own Poisson sample;
#: LOSS_SAMPLING: FedFDP's fresh Poisson sample B' for its loss release).
SAMPLING, NOISE, SHUFFLE, SENSITIVE_SAMPLING, LOSS_SAMPLING = 0, 1, 2, 3, 4
#: Streams of the epoch permutations of shuffled epochs (:func:`epoch_seed`), one per division; used with epochs only,
#: never with rounds, so no epoch seed equals a round seed.
EPOCH_ORDER, SENSITIVE_EPOCH_ORDER = 5, 6


def is_deterministic(context: Context) -> bool:
    """Seeded draws for simulated silos; OS entropy for deployed ones unless their operator opts in."""
    if not is_deployed(context):
        return True
    return str(context.node_config.get(DETERMINISTIC_KEY, "false")).lower() in {"true", "1", "yes"}


def round_seed(context: Context, *, seed: int, silo_id: int, server_round: int, stream: int) -> int:
    """A 63-bit seed for one stream of one silo in one round."""
    if not is_deterministic(context):
        return secrets.randbits(63)
    return _derived_seed(seed, silo_id, server_round, stream)


def epoch_seed(*, seed: int, silo_id: int, epoch: int, stream: int) -> int:
    """A 63-bit seed for the permutation of one epoch of one division (`stream`: EPOCH_ORDER or
    SENSITIVE_EPOCH_ORDER) of one silo, from the run seed on every silo (see the module docstring: the batches of an
    epoch must agree across messages and processes, and predicting them costs nothing under the accounting)."""
    if stream not in (EPOCH_ORDER, SENSITIVE_EPOCH_ORDER):
        raise ValueError(f"stream must be EPOCH_ORDER or SENSITIVE_EPOCH_ORDER (an epoch stream), got {stream!r}")
    return _derived_seed(seed, silo_id, epoch, stream)


def _derived_seed(seed: int, silo_id: int, index: int, stream: int) -> int:
    """63 bits of ``SeedSequence([seed, silo_id, index, stream])``: independent for every distinct tuple."""
    seq = np.random.SeedSequence([seed, silo_id, index, stream])
    return int(seq.generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> np.uint64(1))


def numpy_rng(context: Context, **kwargs: int) -> np.random.Generator:
    return np.random.default_rng(round_seed(context, **kwargs))


def torch_generator(context: Context, **kwargs: int) -> torch.Generator:
    return torch.Generator().manual_seed(round_seed(context, **kwargs))
