"""FedSC's pure math: the spectral contrastive (SC) losses, the alpha schedule, and the server's correlation algebra.

Source: Jing, Yu, Zhang, Zhang, "FedSC: Provable Federated Self-supervised Learning with Spectral Contrastive
Objective over Non-i.i.d. Data", ICML 2024 (Algorithm 1, eqs. 1-6, 80); silofl's choices where it leaves one open:
docs/FEDSC.md, "Protocol". No Flower, no data
loading: the client trains with :func:`local_loss` (torch, differentiable) and the server keeps its cache of correlation
matrices with :func:`aggregate` / :func:`others` (float64 numpy).

Notation (paper Sec. 3-5). ``z(x; theta)`` in R^H is the projector output; for client ``j`` with weight
``q_j = |D_j| / |D|``

* ``R_j  = E_{xbar in D_j} E_{x ~ A(.|xbar)} z(x) z(x)^T``: the uncentered second moment (H x H), not a covariance;
* ``R+_j = E_{xbar in D_j} E_{x, x+ ~ A(.|xbar)} z(x) z(x+)^T``: its positive-pair counterpart;
* global loss (eqs. 1, 4): ``L = - sum_j q_j Tr R+_j + 1/2 || sum_j q_j R_j ||_F^2``;
* local loss (eq. 5, with ``q_j`` generalized to ``alpha`` by eq. 80):
  ``L_j = - Tr R+_j + 1/2 alpha ||R_j||_F^2 + (1 - alpha) <R_j, Rbar_{-j}>_F``, where ``Rbar_{-j}`` estimates the
  other clients' correlation ``R_{-j} = sum_{k != j} q_k R_k / (1 - q_j)`` and is a constant (stop gradient).

Why the third term has no 1/2 (eq. 6): with ``alpha = q_j`` and ``Rbar_{-j} = R_{-j}``, the gradients align,
``sum_j q_j grad L_j = grad L``; FedAvg+SC (``alpha = 1``) instead minimizes
``sum_j q_j L_j = L + 1/2 sum_j q_j ||R_j - R||_F^2``, a regularizer that pulls every client's correlation towards the
global one, which is wrong under label skew. ``tests/protocols/test_fedsc.py`` checks both identities numerically.

Minibatch estimators with two views per sample (Sec. 5.2, V = 1): ``Z1, Z2`` in R^{B x H}, ``Z = [Z1; Z2]``,
``Tr R+ = mean_b <z1_b, z2_b>`` (:func:`cross_trace`), ``R = Z^T Z / (2B)`` (:func:`correlation`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "aggregate",
    "alpha_schedule",
    "clip_rows",
    "correlation",
    "cross_trace",
    "global_loss",
    "local_loss",
    "normalize_weights",
    "others",
    "spectral_contrastive_loss",
]


# --------------------------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------------------------


def _real(value: object, name: str) -> float:
    """``value`` as a finite float; else ``ValueError`` naming ``name``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _matrix_rows(z: object, name: str) -> torch.Tensor:
    """``z`` if it is a 2-D floating-point tensor with at least one row; else ``ValueError``."""
    if not isinstance(z, torch.Tensor) or z.ndim != 2 or not z.is_floating_point():
        described = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"{name} must be a 2-D floating-point tensor (samples x H), got {described}")
    if z.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one row (sample), got shape {tuple(z.shape)}")
    return z


def _all_finite(t: torch.Tensor) -> bool:
    """Every entry finite: the sum first (NaN or inf if an entry is), entry by entry only when it is not finite."""
    return math.isfinite(float(t.detach().sum())) or bool(torch.isfinite(t).all())


def _pair(z1: object, z2: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The two views' representations, checked to be row-aligned (same sample in the same row)."""
    a, b = _matrix_rows(z1, "z1"), _matrix_rows(z2, "z2")
    if a.shape != b.shape:
        raise ValueError(
            f"z1 and z2 must have the same shape (row b of both = two views of sample b), got {tuple(a.shape)} "
            f"and {tuple(b.shape)}"
        )
    return a, b


def _alpha(alpha: object) -> float:
    a = _real(alpha, "alpha")
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (eq. 80: q_j, or a schedule from 1 down to 0.2), got {a}")
    return a


# --------------------------------------------------------------------------------------------------------------------
# Estimators (Sec. 5.2) and the losses (eqs. 1, 4, 5, 80)
# --------------------------------------------------------------------------------------------------------------------


def clip_rows(z: torch.Tensor, mu: float) -> torch.Tensor:
    """Scale each row of ``z`` to L2 norm at most ``sqrt(mu)`` (NormClip of Algorithm 2, line 5).

    Differentiable: a row with norm ``r > sqrt(mu)`` becomes ``z sqrt(mu) / r``; a row already inside is multiplied by
    exactly 1 (unchanged bit for bit, zero extra gradient). Implemented as ``sqrt(mu) / max(r, sqrt(mu))`` so no
    division by a zero norm can occur (an all-zero row keeps a finite gradient).

    A row whose norm is not finite (a NaN or inf entry, or finite entries whose norm overflowed: an encoder with huge
    parameters from the server) becomes a row of zeros, with zero gradient: DP-CalR's sensitivity needs every row in
    the ball of radius ``sqrt(mu)``, and 0 is in it, where a NaN row would make the noised correlation NaN exactly
    when that record is there. The row's own values decide it, nothing else.
    """
    rows = _matrix_rows(z, "z")
    m = _real(mu, "mu")
    if m <= 0.0:
        raise ValueError(f"mu must be > 0 (rows are clipped to norm sqrt(mu); the paper uses mu = 2 to 5), got {m}")
    radius = math.sqrt(m)
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    if not _all_finite(norms):  # zeros in, and their norm (0) recomputed: neither the value nor a gradient is NaN
        rows = torch.where(torch.isfinite(norms), rows, torch.zeros_like(rows))
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    return rows * (radius / torch.clamp(norms, min=radius))


def correlation(z: torch.Tensor) -> torch.Tensor:
    """``Z^T Z / N`` (H x H): the uncentered second moment of the rows of ``z`` (estimator of ``R``, Sec. 5.2)."""
    rows = _matrix_rows(z, "z")
    return rows.T @ rows / rows.shape[0]


def cross_trace(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """``mean_b <z1_b, z2_b>``: the estimator of ``Tr R+`` from two views (row ``b`` of both = sample ``b``)."""
    a, b = _pair(z1, z2)
    return (a * b).sum(dim=1).mean()


def _frobenius_sq_of_correlation(z: torch.Tensor) -> torch.Tensor:
    """``||Z^T Z / N||_F^2`` through the smaller Gram matrix: ``Z^T Z`` (H x H) or ``Z Z^T`` (N x N).

    Both have the same non-zero eigenvalues, hence the same Frobenius norm; ``Z Z^T`` is cheaper when the batch is
    smaller than the representation (``N < H``), e.g. H = 512 with a few dozen samples.
    """
    n, h = z.shape
    gram = z.T @ z if h <= n else z @ z.T
    return (gram * gram).sum() / (n * n)


def local_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    alpha: float,
    others: torch.Tensor | np.ndarray | None = None,
) -> torch.Tensor:
    """Client ``j``'s SC loss, eq. 5 / eq. 80, on one minibatch with two views: a scalar tensor.

    ``L_j = - Tr R+_j + 1/2 alpha ||R_j||_F^2 + (1 - alpha) <R_j, Rbar_{-j}>_F`` with ``R_j = Z^T Z / (2B)``,
    ``Z = [z1; z2]`` and ``Tr R+_j = mean_b <z1_b, z2_b>``. ``others`` is ``Rbar_{-j}`` (H x H, from :func:`others` on
    the server's side); it is detached and cast to ``z1``'s dtype and device, i.e. held constant as eq. 6 requires.
    ``others=None`` means plain local SC (FedAvg+SC, or FedSC before the first share) and needs ``alpha == 1``.

    Cost: ``||R_j||_F^2`` goes through the smaller of ``Z^T Z`` and ``Z Z^T``, and ``<R_j, Rbar>`` through
    ``sum((Z Rbar) * Z) / (2B)`` when ``2B < H``, so no H x H matrix of ``Z`` is formed for small batches.
    """
    a, b = _pair(z1, z2)
    weight = _alpha(alpha)
    z = torch.cat([a, b], dim=0)
    n, h = z.shape
    loss = -cross_trace(a, b) + 0.5 * weight * _frobenius_sq_of_correlation(z)
    if others is None:
        if weight != 1.0:
            raise ValueError(
                f"others (Rbar_-j, the other clients' correlation) is required when alpha < 1, got alpha={weight}; "
                "pass alpha=1.0 for plain local SC (FedAvg+SC)"
            )
        return loss
    rbar = torch.as_tensor(others).detach().to(dtype=z.dtype, device=z.device)
    if rbar.shape != (h, h):
        raise ValueError(
            f"others must be an H x H matrix with H = {h} (the representation size), got {tuple(rbar.shape)}"
        )
    inner = ((z @ rbar) * z).sum() / n if n < h else (correlation(z) * rbar).sum()
    return loss + (1.0 - weight) * inner


def spectral_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Plain SC loss ``- Tr R+ + 1/2 ||R||_F^2`` (eq. 1 on one data set): :func:`local_loss` with ``alpha = 1``."""
    return local_loss(z1, z2, 1.0)


def global_loss(views: Sequence[tuple[torch.Tensor, torch.Tensor]], weights: Sequence[float]) -> torch.Tensor:
    """The global objective (eq. 4): ``L = - sum_j q_j Tr R+_j + 1/2 || sum_j q_j R_j ||_F^2``.

    ``views[j] = (z1_j, z2_j)`` are client ``j``'s two views; ``weights[j] > 0`` are normalized to sum to 1
    (``q_j = w_j / sum w``), so sample counts ``|D_j|`` can be passed as they are. A reference for tests and
    monitoring: it needs every client's representations at once, which FedSC never gathers.
    """
    pairs = list(views)
    if not pairs:
        raise ValueError("views must hold at least one client's (z1, z2) pair, got an empty sequence")
    if len(weights) != len(pairs):
        raise ValueError(f"weights must have one entry per client in views ({len(pairs)}), got {len(weights)}")
    q = normalize_weights(dict(enumerate(weights)))
    checked = [_pair(z1, z2) for z1, z2 in pairs]
    sizes = sorted({a.shape[1] for a, _ in checked})
    if len(sizes) != 1:
        raise ValueError(f"every client's representations in views must have the same size H, got sizes {sizes}")
    positive = sum(q[j] * cross_trace(a, b) for j, (a, b) in enumerate(checked))
    total = sum(q[j] * correlation(torch.cat([a, b], dim=0)) for j, (a, b) in enumerate(checked))
    return -positive + 0.5 * (total * total).sum()


def alpha_schedule(t: int, total_rounds: int, start: float = 1.0, end: float = 0.2) -> float:
    """``alpha_t = start + (end - start) t / T``: eq. 80's linear decay, ``1 - 0.8 t / T`` with the defaults.

    ``t`` is the round index in ``[0, total_rounds]`` (``alpha_0 = start``, ``alpha_T = end``); ``start`` and ``end``
    are in ``[0, 1]`` (alpha weighs ``||R_j||^2`` against ``<R_j, Rbar_{-j}>``, so it is a convex weight).
    """
    if not isinstance(total_rounds, numbers.Integral) or isinstance(total_rounds, bool) or total_rounds < 1:
        raise ValueError(f"total_rounds must be an integer >= 1 (T, the number of rounds), got {total_rounds!r}")
    if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t <= total_rounds:
        raise ValueError(f"t must be an integer round index in [0, total_rounds={total_rounds}], got {t!r}")
    first, last = _real(start, "start"), _real(end, "end")
    for name, value in (("start", first), ("end", last)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"{name} must be in [0, 1] (alpha is a convex weight; the paper uses 1 -> 0.2), got {value}"
            )
    return first + (last - first) * int(t) / int(total_rounds)


# --------------------------------------------------------------------------------------------------------------------
# Server side (Algorithm 1, lines 9, 14 and 20): float64 numpy
# --------------------------------------------------------------------------------------------------------------------


def normalize_weights(weights: Mapping[int, float], ids: Sequence[int] | None = None) -> dict[int, float]:
    """``q_j = w_j / sum_{k in ids} w_k`` for ``j`` in ``ids`` (default: every key of ``weights``).

    Every weight must be finite and ``> 0``; a missing id raises ``ValueError``. :func:`aggregate` weighs the cache
    with exactly these ``q_j``, so pass ``normalize_weights(weights, cache_ids)[j]`` to :func:`others`.
    """
    keys = list(weights) if ids is None else list(ids)
    if not keys:
        raise ValueError("weights must hold at least one client, got none")
    missing = [j for j in keys if j not in weights]
    if missing:
        raise ValueError(f"weights has no entry for client(s) {missing}; give every client its weight (e.g. |D_j|)")
    values = {j: _real(weights[j], f"weights[{j!r}]") for j in keys}
    bad = {j: w for j, w in values.items() if w <= 0.0}
    if bad:
        raise ValueError(f"weights must be > 0 (e.g. the clients' record counts |D_j|), got {bad}")
    total = math.fsum(values.values())
    return {j: w / total for j, w in values.items()}


def _as_float64_matrix(value: object, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    matrix = np.asarray(value, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{name} must be a square H x H matrix, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} must be finite (no NaN or inf entries)")
    return matrix


def aggregate(correlations: Mapping[int, torch.Tensor | np.ndarray], weights: Mapping[int, float]) -> np.ndarray:
    """``R~ = sum_j q_j R~_j`` over the clients in ``correlations`` (Algorithm 1, line 9), float64 H x H.

    ``correlations`` is the server's cache of the latest (noised) ``R~_j`` of each client, stale for clients not
    sampled this round (line 17). ``weights`` need not sum to 1 and may hold clients absent from the cache: the
    weights are normalized over the clients present in ``correlations`` (:func:`normalize_weights`), so that ``R~`` is
    a weighted mean of the cached matrices. Recomputing the sum from the cache each round equals line 14's incremental
    update ``R~ - q_j R~_j^{t-1} + q_j R~_j^t`` and does not accumulate rounding.
    """
    if not correlations:
        raise ValueError("correlations must hold at least one client's matrix, got none")
    q = normalize_weights(weights, list(correlations))
    matrices = {j: _as_float64_matrix(r, f"correlations[{j!r}]") for j, r in correlations.items()}
    shapes = {m.shape for m in matrices.values()}
    if len(shapes) != 1:
        raise ValueError(f"every matrix in correlations must have the same H x H shape, got {sorted(shapes)}")
    total = np.zeros(shapes.pop(), dtype=np.float64)
    for j, matrix in matrices.items():
        total += q[j] * matrix
    return total


def others(total: np.ndarray, own: torch.Tensor | np.ndarray, weight: float) -> np.ndarray:
    """``Rbar_{-j} = (R~ - q_j R~_j) / (1 - q_j)`` (Algorithm 1, line 20), float64 H x H.

    ``total`` is :func:`aggregate`'s ``R~``, ``own`` the client's own cached ``R~_j`` and ``weight`` its normalized
    ``q_j`` (the one :func:`aggregate` used, see :func:`normalize_weights`). The client's own DP noise enters ``R~``
    as ``q_j N_j`` and is subtracted again: ``Rbar_{-j} = sum_{k != j} q_k R~_k / (1 - q_j)`` carries only the other
    clients' noise. ``q_j`` must be in ``(0, 1)``: with ``q_j = 1`` there are no other clients to contrast with.
    """
    q = _real(weight, "weight")
    if q >= 1.0:
        raise ValueError(
            f"weight (q_j) must be < 1, got {q}: a client holding all the weight has no other clients; train it with "
            "alpha=1 (plain local SC) instead"
        )
    if q <= 0.0:
        raise ValueError(f"weight (q_j) must be > 0 (the client's normalized share of the records), got {q}")
    r = _as_float64_matrix(total, "total")
    mine = _as_float64_matrix(own, "own")
    if r.shape != mine.shape:
        raise ValueError(f"own must have the shape of total {r.shape}, got {mine.shape}")
    return (r - q * mine) / (1.0 - q)


def normalize_rows(z: torch.Tensor, mu: float) -> torch.Tensor:
    """Each row scaled to norm exactly sqrt(mu): the representation layer of the spectral contrastive models.

    The paper's analysis assumes bounded representations "when the NN has a normalization layer at the end"
    (Assumption 6.7), and the spectral contrastive loss is trained with z = sqrt(mu) z / ||z|| (HaoChen et al.'s
    formulation, which the FedSC experiments' mu = 4 refers to). Without it the loss has a collapsed stationary point
    (every z the same vector, loss -1/2 at unit norm) that SGD falls into from a small random initialisation, and
    clipping alone does not prevent it since the norm can shrink. DP-CalR still clips (`clip_rows`): for normalized
    rows that is a no-op, and the privacy guarantee never depends on the model.

    ``torch.nn.functional.normalize``'s values, bit for bit, except that a row whose norm is not finite (a NaN or inf
    entry: an encoder with huge parameters from the server) becomes a row of zeros, as an all-zero row does, with
    zero gradient, instead of NaN (a finite row whose norm overflows is 0 in both).
    """
    if not math.isfinite(mu) or mu <= 0:
        raise ValueError(f"mu must be a positive finite number, got {mu!r}")
    norms = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    if not _all_finite(norms):  # zeros in, and their norm recomputed: neither the value nor a gradient is NaN
        z = torch.where(torch.isfinite(norms), z, torch.zeros_like(z))
        norms = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    # torch.nn.functional.normalize(z, dim=-1), with the norm computed once
    return z / norms.clamp_min(1e-12) * math.sqrt(mu)
