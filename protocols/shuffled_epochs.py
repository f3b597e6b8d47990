"""Shuffled epochs: the minibatch sampler of the SteFFLe paper's released code, and its accounting without
amplification (pure; no Flower, no torch).

The sampler. Silo j holds n_j records; the run's batch size m is public. An epoch is one pass over a fresh random
permutation of the silo's records in B_j = ceil(n_j / m) batches of m (the last one holds the n_j - (B_j - 1) m left
over): every record is in exactly one batch of each epoch, as with a torch ``DataLoader(shuffle=True)``. Round t
(1-based) takes batch b = (t - 1) mod B_j of epoch e = (t - 1) div B_j + 1 (:func:`position`). The permutation of epoch
e is a pure function of a seed the caller derives from (run seed, silo id, stream, e) (``client.randomness``), so the
sampler keeps no state: a resumed run, a restarted silo and a deployed ClientApp (a fresh process per message) draw
the same batches. The non-sensitive and the sensitive division draw their batches from independent streams, as they draw
independent Poisson samples (the SteFFLe paper's Algorithm 1 line 6 draws one minibatch for both; silofl draws two, so
that the noised releases keep their amplification although the loss gradient is sent in the clear:
docs/algorithms/steffle.md, "What it does").

The accounting. The accountant's subsampled Gaussian assumes that each round draws a Poisson sample (rate q = m / n_j),
as silofl's default sampler does; a shuffled epoch is not covered by it: accounting shuffled batches as if they were
Poisson samples is not justified (Chua et al., ICML 2024, "How Private are DP-SGD Implementations?", show that shuffled
batches can be far less private than the Poisson figure). silofl claims NO amplification from shuffling. Under the
replace-one relation on sensitive attributes (what ``steffle`` and ``tran`` protect: DP-FERMI Definition 2.2, SteFFLe
Definition 2.3, ISRL-DP: every message of silo j (eps, delta)-DP in silo j's sensitive attributes, whatever the server
does), one epoch of a silo's rounds is at most ONE unsampled Gaussian release (q = 1) of the round's combined multiplier
sigma / sqrt(K) (K = 2 releases per round, ``protocols.privacy.accountant.combined_noise_multiplier``), and a run of T
rounds is at most E_j = ceil(T / B_j) of them composed, after the one-off group-count histogram, as one composition
(PLD), never a sum of epsilons. Why:

1. The permutation is independent of the data: its seed comes from public values, never from an attribute. We
   condition on it: the bound below holds for every fixed permutation, so it holds when the server knows it (it can,
   from the run seed) and for the mixture over permutations. Nothing is claimed from the permutation's randomness.
   The silo binds the run seed with its calibration (``client.round_privacy.RoundPrivacy``): a server that changes it
   mid-run, which could put a record in two batches of one epoch, is refused.
2. Neighbours D, D' differ in one record's sensitive attribute s_i only: the replace-one relation keeps the record's
   index i (and its x_i, y_i). Given the permutation, record i therefore lies in the same single batch b_i of epoch
   e in D and in D'.
3. A round of epoch e whose sensitive batch is not b_i releases sums over records other than i, computed at the
   server's message (a function of the history of releases) with fresh noise; the non-sensitive division's release
   (the loss gradient, the s-independent part of the W-gradient) never reads an attribute. Given the history, such a
   round has the same output distribution under D and D': its privacy loss is 0.
4. The round whose batch is b_i makes K Gaussian releases of sums of per-record contributions, each in a ball of
   radius R_k around 0 whatever the attribute (C for the clipped theta part; 2 / sqrt(rho) for SteFFLe's W part, 1 for
   Tran's group mass): changing s_i moves record i's contribution inside its balls and nothing else, so the round is
   the replace-one Gaussian mechanism at q = 1 (dp-accounting's REPLACE_ONE adjacency: sensitivity 2 R) with noise
   sigma R_k on release k, i.e. one Gaussian of multiplier sigma / sqrt(K). Dividing by the public m is
   post-processing.
5. The server picks each round's message from every earlier release (of every silo): adaptive composition, which
   the accountants' composition theorems cover (RDP and PLD compose adaptively chosen mechanisms). The B_j rounds of
   an epoch compose to the one Gaussian of step 4 (the other rounds add zero privacy loss), and the epochs, after the
   histogram, compose as ``ComposedDpEvent([histogram, SelfComposed(Gaussian(sigma / sqrt(K)), E_j)])``.

A run whose last epoch is partial still pays for that epoch in full (E_j rounds up). The silo charges each epoch's
release at the first round of the epoch it answers, before it computes anything of that round: charging the whole
epoch at its start is conservative and correct (the worst-case record may sit in the epoch's first batch); the other
rounds of the epoch charge nothing new (``client.privacy_state``). The calibration is the same event: ``RoundPrivacy``
calibrates sigma for E_j unsampled steps (:func:`accounted_steps`), which is why shuffled epochs need far more noise
than Poisson sampling at the same epsilon (docs/algorithms/steffle.md, "Shuffled epochs": measured on Adult).
"""

from __future__ import annotations

import math

import numpy as np

SAMPLERS = ("poisson", "shuffle")
"""The run option ``sampling``: Poisson samples of rate m / n_j each round, or shuffled epochs (this module)."""

ACCOUNTING_NOTE = (
    "shuffled epochs are accounted WITHOUT amplification: a record's sensitive attribute enters one batch per epoch, "
    "so each epoch is charged as one unsampled Gaussian release (q = 1) of the round's combined multiplier, at the "
    "first round of the epoch, before that round is computed; a run of T rounds is E_j = ceil(T / B_j) such "
    "releases after the group-count histogram, one PLD composition"
)
"""What the privacy block of a shuffled run says about its accounting (``protocols.algorithms.steffle`` and
``tran``)."""


def _check_positive(value: object, name: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def batches_per_epoch(records: int, batch_size: int) -> int:
    """B_j = ceil(n_j / m): the batches of one epoch of a silo of `records` records at batch size `batch_size`."""
    n = _check_positive(records, "records")
    m = _check_positive(batch_size, "batch_size")
    return -(-n // m)


def position(server_round: int, batches: int) -> tuple[int, int]:
    """(epoch e, batch b) of round t: e = (t - 1) div B + 1 (1-based), b = (t - 1) mod B (0-based)."""
    t = _check_positive(server_round, "server_round")
    count = _check_positive(batches, "batches")
    epoch, batch = divmod(t - 1, count)
    return epoch + 1, batch


def epoch_of(server_round: int, batches: int) -> int:
    """The (1-based) epoch round `server_round` belongs to; round 0 (the setup histogram) is in no epoch: 0."""
    if server_round == 0:
        return 0
    return position(server_round, batches)[0]


def accounted_steps(rounds: int, records: int, batch_size: int) -> int:
    """E_j = ceil(T / B_j): the epochs a run of `rounds` rounds touches, each accounted as one unsampled release."""
    count = batches_per_epoch(records, batch_size)
    return math.ceil(_check_positive(rounds, "rounds") / count)


def batch_indices(records: int, batch_size: int, batch: int, permutation_seed: int) -> np.ndarray:
    """The records of batch `batch` of the epoch whose permutation `permutation_seed` seeds, in increasing order.

    Batch b holds positions b m .. min((b + 1) m, n) - 1 of the permutation ``default_rng(seed).permutation(n)``: the
    B batches of one seed partition the n records, the last batch holding the n - (B - 1) m records left over. The
    order inside a batch does not change what the round computes (sums), and increasing indices read the silo's
    arrays in order.
    """
    n = _check_positive(records, "records")
    m = _check_positive(batch_size, "batch_size")
    count = -(-n // m)
    if not isinstance(batch, int | np.integer) or isinstance(batch, bool) or not 0 <= batch < count:
        raise ValueError(f"batch must be an integer in [0, {count}) for {n} records in batches of {m}, got {batch!r}")
    permutation = np.random.default_rng(permutation_seed).permutation(n)
    return np.sort(permutation[int(batch) * m : min((int(batch) + 1) * m, n)])
