"""Randomized response over a node's sensitive groups, permanent per record (pure: numpy and the standard library).

A feature party holds its test records' features and labels, not their sensitive groups, so its evaluation (counts by
group, label and prediction) needs each record's group from the sensitive party that holds it. Sent exactly, the
groups would be the sensitive attribute itself. The sensitive party sends instead, for each test record, the k-ary
randomized response of its group: with probability ``1 - p`` the group, with probability ``p`` a group drawn uniformly
from all ``k`` (``p = k / (e^eps + k - 1)``, so that the true group comes out with probability
``e^eps / (e^eps + k - 1)`` and each other one with ``1 / (e^eps + k - 1)``: eps-DP for the record, dp-accounting's
``RandomizedResponseDpEvent(p, k)`` under replacing it).

The draw is *permanent*: a keyed hash of the record's id (HMAC-SHA256 under a secret the sensitive party keeps in its
state folder, with eps in the message) decides it, so every later request gets the same answer, which releases
nothing new (as RAPPOR's permanent randomized response). The party's lifetime ledger charges it once per secret and
eps, however often the server asks.

The server sums the feature parties' counts over (randomized group, label, prediction) and undoes the randomization in
expectation (:func:`debias`): with M[g', g] = P(report g' | group g), E[counts'] = M counts, so counts = M^-1 counts'.
"""

from __future__ import annotations

import hashlib
import hmac
import math

import numpy as np

__all__ = ["debias", "noise_parameter", "permanent_groups", "secret_fingerprint"]


def noise_parameter(epsilon: float, groups: int) -> float:
    """p of the k-ary randomized response that is `epsilon`-DP: the probability of replacing the group by a uniform
    draw over all `groups` (dp-accounting's ``RandomizedResponseDpEvent.noise_parameter``)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"randomized response needs a finite epsilon > 0, got {epsilon}")
    if groups < 1:
        raise ValueError(f"randomized response needs at least one group, got {groups}")
    return groups / (math.exp(epsilon) + groups - 1)


def _uniforms(secret: bytes, epsilon: float, ids: np.ndarray) -> np.ndarray:
    """Two uniforms in [0, 1) per id (rows), from HMAC-SHA256(secret, "eps:id")."""
    out = np.empty((len(ids), 2), dtype=np.float64)
    for row, record_id in enumerate(ids.tolist()):
        digest = hmac.new(secret, f"{epsilon!r}:{int(record_id)}".encode(), hashlib.sha256).digest()
        out[row, 0] = int.from_bytes(digest[:8], "big") / 2.0**64
        out[row, 1] = int.from_bytes(digest[8:16], "big") / 2.0**64
    return out


def permanent_groups(secret: bytes, ids: np.ndarray, groups: np.ndarray, epsilon: float, num_groups: int) -> np.ndarray:
    """The randomized response of each record's group (int64), the same for the same secret, id and epsilon."""
    ids, groups = np.asarray(ids, dtype=np.int64), np.asarray(groups, dtype=np.int64)
    if ids.shape != groups.shape or ids.ndim != 1:
        raise ValueError(f"ids {ids.shape} and groups {groups.shape} must be 1-d of one length")
    if groups.size and (int(groups.min()) < 0 or int(groups.max()) >= num_groups):
        raise ValueError(f"groups must be in 0..{num_groups - 1}")
    p = noise_parameter(epsilon, num_groups)
    u = _uniforms(secret, epsilon, ids)
    drawn = np.minimum((u[:, 1] * num_groups).astype(np.int64), num_groups - 1)
    return np.where(u[:, 0] < p, drawn, groups)


def secret_fingerprint(secret: bytes, epsilon: float, num_groups: int) -> str:
    """What the lifetime ledger charges a permanent randomized response under: one charge per secret, eps and k."""
    return hashlib.sha256(secret + f"|{epsilon!r}|{num_groups}".encode()).hexdigest()[:24]


def debias(counts: np.ndarray, epsilon: float) -> np.ndarray:
    """Unbiased estimates of the counts by true group from `counts` by randomized group (group on axis 0, any
    other axes: label, prediction), inverting M[g', g] = (1 - p) [g' = g] + p / k. Not clipped: a cell may be
    negative (the caller clips, after summing)."""
    counts = np.asarray(counts, dtype=np.float64)
    k = counts.shape[0]
    p = noise_parameter(epsilon, k)
    matrix = (1.0 - p) * np.eye(k) + p / k
    flat = counts.reshape(k, -1)
    return np.linalg.solve(matrix, flat).reshape(counts.shape)
