"""Multinomial logistic regression in closed form, in silofl's "logreg" parameter layout (head.weight row-major, then
head.bias): the loss f of DP-mu2-FL's experiments (Reshef, Levy 2024, Section 5.3), its gradient, loss and accuracy in
numpy float64, so that the silo's round and the reference run compute the same bits (no torch).

The gradient stays finite, and equal to its true value, at any finite query point, since an untrusted server picks
the query points (the softmax is taken from stable logit differences; `logreg_grad`).
"""

from __future__ import annotations

import math

import numpy as np

from silofl.protocols.mu2fl import checks

__all__ = ["logreg_accuracy", "logreg_dim", "logreg_grad", "logreg_loss"]


def logreg_dim(num_features: int, num_classes: int) -> int:
    """Parameters of silofl's logreg: C (n + 1) for C > 2 classes, n + 1 for the binary single-output head."""
    rows = 1 if checks.positive_int("num_classes", num_classes) == 2 else int(num_classes)
    return rows * (checks.positive_int("num_features", num_features) + 1)


def _split_params(params: np.ndarray, num_features: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    rows = 1 if num_classes == 2 else num_classes
    expected = rows * (num_features + 1)
    if params.shape != (expected,):
        raise ValueError(
            f"params must be a flat vector of {expected} entries (head.weight {rows}x{num_features} then head.bias), "
            f"got shape {params.shape}"
        )
    return params[: rows * num_features].reshape(rows, num_features), params[rows * num_features :]


def _logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    weight, bias = _split_params(params, features.shape[1], num_classes)
    z = features @ weight.T + bias
    return np.concatenate([np.zeros_like(z), z], axis=1) if num_classes == 2 else z


def _shifted_logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    """``logits - max(logits)`` per row (<= 0), for any finite query point.

    Rows whose logits are finite: exactly ``logits - logits.max(axis=1)`` (a difference that overflows is -inf, whose
    exp is the 0 it rounds to anyway). A query point of norm ~1e308 (an untrusted server's choice) can overflow the
    logits themselves to inf, or to NaN (inf - inf), and the softmax to NaN; those rows are recomputed at the point
    scaled by a power of two (exact), then scaled back (:func:`_rescaled_shifted_logits`), so their softmax is its
    true value, one-hot at the largest logit."""
    with np.errstate(over="ignore", invalid="ignore"):
        logits = _logits(params, features, num_classes)
        shifted = logits - logits.max(axis=1, keepdims=True)
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():
            shifted[bad] = _rescaled_shifted_logits(params, features[bad], num_classes)
    return shifted


def _rescaled_shifted_logits(params: np.ndarray, features: np.ndarray, num_classes: int) -> np.ndarray:
    """``logits - max(logits)`` per row from the logits at ``params 2^-e``, with ``2^e`` the power of two just above
    ``max |params|``: those are finite for finite features in a sane range, and a power of two scales exactly, so
    ``(logits 2^-e - max) 2^e`` is the difference of the true logits, rounded; where it does not fit in float64 it is
    -inf (exp: 0). A row whose features are not finite has no logits: NaN (its record then contributes 0)."""
    top = float(np.max(np.abs(params))) if params.size else 0.0
    exponent = int(np.frexp(top)[1]) if 0.0 < top < math.inf else 0
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        scaled = _logits(np.ldexp(params, -exponent), features, num_classes)
        shifted = np.ldexp(scaled - scaled.max(axis=1, keepdims=True), exponent)
    shifted[~np.isfinite(features).all(axis=1)] = np.nan
    return shifted


def _batch(features: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] == 0:
        raise ValueError(f"features must be (n, num_features) and labels (n,), n >= 1; got {x.shape} and {y.shape}")
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"labels must be in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    return x, y.astype(np.int64, copy=False)


def logreg_grad(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Mean cross-entropy gradient over the batch, flat in silofl's layout (head.weight row-major, then head.bias).

    Closed form: with r = softmax(logits) - onehot(y), grad_W = r^T a / n and grad_b = sum(r) / n (for the binary
    single-output head, r is the second column: sigmoid(z) - y).

    Finite for any finite query point: the softmax is computed stably even where the logits overflow
    (:func:`_shifted_logits`), so a record's gradient is its true value, of norm <= G (`constants.Mu2Constants`,
    bounds that hold on all of R^d), at a query point of norm 1e308 too. A record whose gradient is still not
    finite (features that are not finite) contributes 0, a point of the ball of radius G the sensitivity assumes;
    the mean still divides by the batch size. The same bits as before whenever the logits are finite.
    """
    params = checks.vector("params", params)
    x, y = _batch(features, labels, num_classes)
    r = np.exp(_shifted_logits(params, x, num_classes))
    r /= r.sum(axis=1, keepdims=True)
    r[np.arange(y.shape[0]), y] -= 1.0
    if num_classes == 2:
        r = r[:, 1:]
    r /= y.shape[0]
    keep = np.isfinite(r).all(axis=1)
    if not keep.all():
        r, x = r[keep], x[keep]
    return np.concatenate([(r.T @ x).ravel(), r.sum(axis=0)])


def logreg_loss(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Mean cross-entropy (natural log) of the batch: never NaN for finite query points and features (a record's
    loss can be inf where its true value exceeds float64, at a query point of norm ~1e308)."""
    x, y = _batch(features, labels, num_classes)
    params = checks.vector("params", params)
    rows = np.arange(y.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        logits = _logits(params, x, num_classes)
        top = logits.max(axis=1)
        log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        losses = log_norm - logits[rows, y]
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():  # logits that overflow: -log softmax from the stable differences
            shifted = _rescaled_shifted_logits(params, x[bad], num_classes)
            losses[bad] = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(shifted.shape[0]), y[bad]]
        return float(np.mean(losses))


def logreg_accuracy(params: np.ndarray, features: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Fraction of the batch whose arg-max logit is its label (the arg-max of logits that overflow included)."""
    x, y = _batch(features, labels, num_classes)
    return float(np.mean(_shifted_logits(checks.vector("params", params), x, num_classes).argmax(axis=1) == y))
