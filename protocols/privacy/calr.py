"""DP-CalR (FedSC, Algorithm 2): a client's differentially private correlation matrix, its sensitivity and its epsilon.

Source: Jing et al., "FedSC: Provable Federated Self-supervised Learning with Spectral Contrastive Objective over
Non-i.i.d. Data", ICML 2024 (Algorithm 2, Proposition 6.6, Table 6); silofl's choices: docs/FEDSC.md, "Privacy".
The mechanism, for client ``j`` with records ``D_j`` (``n = |D_j|``):

    for every record xbar: V augmented views x_1..x_V, z_v = NormClip(z(x_v; theta), sqrt(mu))
    R~_j = 1/(n V) sum_xbar sum_v z_v z_v^T  +  N(0, sigma^2) on each of the H x H entries

What is protected, and what is not. The guarantee is record-level DP of the *correlation matrices* a client uploads
(each share is one Gaussian mechanism; ``T_j`` shares compose). It does not cover the model weights the client also
returns every round (FedSC trains them without DP), so a FedSC run as a whole is not DP; the privacy report must say
so. The record count ``n`` is treated as public, and the encoder must treat records independently (eval mode: a
BatchNorm layer in training mode mixes records through batch statistics, which would break the per-record bound;
:func:`dp_calr` switches an ``nn.Module`` encoder to eval mode for the call).

Sensitivity (:func:`calr_sensitivity`): ``sqrt(2) mu / n`` for replace-one neighbours (default), ``mu / n`` for the
paper's add/remove proof. Accounting (:func:`calr_epsilon`, :func:`calr_noise`): every share uses the whole data set
(sampling rate 1), so ``T_j`` shares are ``T_j`` Gaussian mechanisms with noise multiplier ``sigma / sensitivity``,
composed by :mod:`protocols.privacy.accountant` (dp-accounting; PLD composes Gaussians exactly at rate 1, RDP is the
usual bound; ``"best"`` takes the smaller). The sensitivity given here is already the distance between the two
neighbours' outputs, which is what the accountant's ``add_remove`` relation expects at rate 1 (a Gaussian of that
sensitivity), so both CalR relations are accounted with the accountant's ``add_remove``. The accountant's own
``replace_one`` is a different notion (a ball radius around 0 for a sampled record's contribution, doubled into the
distance) and would double-count here.

Poisson-subsampled DP-CalR (``sampling_rate q < 1``, a silofl extension, not in the paper). Each share includes every
record independently with probability ``q`` (coins from the noise generator, never released) and releases
``R~_j = 1/(q n V) sum_{sampled records} sum_v z_v z_v^T + N(0, sigma^2)`` per entry: an unbiased estimate of
``R_j`` at a cost of ``q n`` records instead of ``n``, which is what lets a CPU run share every round (FEDSC.md says
why sharing must be frequent). The divisor ``q n`` is public and fixed, so one record's contribution to the release is
its own ``1/(q n V) sum_v z_v z_v^T``: a PSD matrix of Frobenius norm ``<= mu / (q n)``, and ``0`` when the record is
not sampled. That is exactly the setting of DP-SGD's Poisson-subsampled Gaussian (a per-record term in a ball of
radius ``mu / (q n)`` around 0), so the shares are accounted as ``PoissonSampled(q, Gaussian(sigma q n / mu))``
events with the accountant's own relation: ``add_remove`` (sensitivity ``mu / (q n)``) or ``replace_one`` (its ball
of radius ``mu / (q n)``, two records' terms up to ``2 mu / (q n)`` apart, which is loose by at most ``sqrt(2)`` for PSD
terms; PLD only). :func:`calr_noise_multiplier_scale` gives the scale ``sigma / multiplier`` for either rate.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np
import torch

from silofl.protocols.fedsc import clip_rows
from silofl.protocols.privacy.accountant import calibrate_noise, check_delta, check_epsilon, epsilon_spent

__all__ = [
    "CALR_RELATIONS",
    "accountant_relation",
    "calr_closed_form_epsilon",
    "calr_epsilon",
    "calr_noise",
    "calr_noise_multiplier_scale",
    "calr_sensitivity",
    "dp_calr",
    "normalize_release",
    "release_divisor",
    "release_noise_scale",
]

CALR_RELATIONS = ("replace_one", "add_remove")
"""Neighbouring relations of DP-CalR: one record replaced by another (default) or one record added/removed."""

_ACCOUNTANT_RELATION = "add_remove"
"""The accountant relation both CalR relations are accounted under (see the module docstring)."""


# --------------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------------


def _positive(value: object, name: str, hint: str) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number > 0 ({hint}), got {value!r}")
    if float(value) <= 0.0:
        raise ValueError(f"{name} must be > 0 ({hint}), got {value!r}")
    return float(value)


def _count(value: object, name: str, hint: str, *, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({hint}), got {value!r}")
    return int(value)


def _sigma(value: object) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(float(value)) or value < 0:
        raise ValueError(f"sigma must be a number >= 0 (noise std per matrix entry; 0 = no noise), got {value!r}")
    return float(value)


def _relation(relation: object) -> str:
    if relation not in CALR_RELATIONS:
        raise ValueError(
            f"relation must be one of {', '.join(CALR_RELATIONS)} (replace_one: one record replaced, the default; "
            f"add_remove: the paper's proof, valid for a public normalizer n), got {relation!r}"
        )
    return str(relation)


# --------------------------------------------------------------------------------------------------------------------
# Sensitivity and the mechanism
# --------------------------------------------------------------------------------------------------------------------


def calr_sensitivity(mu: float, n: int, relation: str = "replace_one") -> float:
    """L2 (Frobenius) sensitivity of DP-CalR's un-noised ``R~_j``: ``sqrt(2) mu / n`` or ``mu / n``.

    ``replace_one`` (default): neighbours ``D, D'`` of ``n`` records differ in one record, whose views give clipped
    ``a_v`` in ``D`` and ``b_v`` in ``D'`` (every other record and every augmentation draw fixed: the augmentation
    coins do not depend on the data and are not released, so the mechanism is a mixture over them of Gaussian
    mechanisms, each with this sensitivity). Then ``R(D) - R(D') = 1/(n V) sum_v (a_v a_v^T - b_v b_v^T)`` and, for each
    view, ``||a a^T - b b^T||_F^2 = ||a||^4 + ||b||^4 - 2 (a . b)^2 <= mu^2 + mu^2 - 0``, since ``||a||^2, ||b||^2 <=
    mu`` after clipping and ``(a . b)^2 >= 0``. The triangle inequality over the ``V`` views gives
    ``||R(D) - R(D')||_F <= sqrt(2) mu / n``, attained by maximal orthogonal ``a``, ``b`` (the same for every view).
    The naive bound ``2 mu / n`` (two matrices of norm ``mu``) is loose because the matrices are PSD.

    ``add_remove``: the paper's proof of Proposition 6.6 bounds the one record's term, ``||a a^T||_F / n <= mu / n``.
    That is the sensitivity of ``sum / n`` for a public, fixed ``n``. Algorithm 2 (and :func:`dp_calr`) divides by the
    actual record count, and then adding a record to ``n - 1`` others moves the mean by ``(C - R(D)) / n`` with ``C``
    its own term; both are PSD with norm ``<= mu``, so the bound is again ``sqrt(2) mu / n`` (attained when the others'
    views are orthogonal to the new record's; ``tests/protocols/privacy/test_calr.py`` shows ``mu / n`` is exceeded).
    The default ``replace_one`` value therefore also covers add/remove neighbours of the mean (with ``n`` the larger
    data set).
    """
    m = _positive(mu, "mu", "representations are clipped to norm sqrt(mu)")
    count = _count(n, "n", "the client's number of records |D_j|", minimum=1)
    factor = math.sqrt(2.0) if _relation(relation) == "replace_one" else 1.0
    return factor * m / count


def _rate(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < float(value) <= 1.0:
        raise ValueError(
            f"sampling_rate must be in (0, 1] (the Poisson rate of records in a share; 1: every record), got {value!r}"
        )
    return float(value)


def calr_noise_multiplier_scale(mu: float, n: int, relation: str = "replace_one", sampling_rate: float = 1.0) -> float:
    """What the accountant's noise multiplier is relative to: ``sigma = multiplier * scale``.

    ``sampling_rate = 1``: :func:`calr_sensitivity` (the distance between two neighbours' matrices), accounted under
    the accountant's ``add_remove`` relation (a Gaussian of that sensitivity). ``sampling_rate = q < 1``:
    ``mu / (q n)``, the norm bound of one sampled record's term (module docstring), accounted under ``relation`` itself
    (:func:`accountant_relation`).
    """
    q = _rate(sampling_rate)
    if q == 1.0:
        return calr_sensitivity(mu, n, relation)
    m = _positive(mu, "mu", "representations are clipped to norm sqrt(mu)")
    count = _count(n, "n", "the client's number of records |D_j|", minimum=1)
    _relation(relation)
    return m / (q * count)


def release_divisor(relation: str, sampling_rate: float, n: int) -> float:
    """What a silo divides its noised sum by before the matrix leaves it: ``q n`` under ``replace_one`` (n is the
    same for both neighbours), ``q`` under ``add_remove``.

    Under add/remove one neighbour has one record more, so a divisor ``q n`` would move the released matrix by
    ``R (1/(q n) - 1/(q (n+1)))`` even when the added record is not sampled, outside the ball of radius ``mu / (q n)``
    around that of an unsampled record which the accountant prices (the flaw DP-FedSGD's divisor had). The silo
    therefore releases ``(sum + noise) / q``, a Gaussian mechanism on a sum of per-record terms of norm ``<= mu``
    followed by the division by a public constant, and the server divides by the public ``n_j`` itself
    (:func:`normalize_release`): post-processing. With ``q = 1`` this is the paper's own setting (sensitivity
    ``mu / n`` of a mean over a public ``n``) made exact."""
    q = _rate(sampling_rate)
    count = _count(n, "n", "the client's number of records |D_j|", minimum=1)
    return q * count if _relation(relation) == "replace_one" else q


def release_noise_scale(mu: float, n: int, relation: str = "replace_one", sampling_rate: float = 1.0) -> float:
    """The noise std per entry of the released matrix divided by the noise multiplier: the matrix's scale of
    :func:`calr_noise_multiplier_scale` times ``q n / release_divisor`` (``mu / q`` under ``add_remove``: the norm
    bound of one record's term in the released ``sum / q``; never a function of n there)."""
    if _relation(relation) == "add_remove":
        return _positive(mu, "mu", "representations are clipped to norm sqrt(mu)") / _rate(sampling_rate)
    return calr_noise_multiplier_scale(mu, n, relation, sampling_rate)


def normalize_release(matrix: np.ndarray, relation: str, sampling_rate: float, n: int) -> np.ndarray:
    """The server's ``R~_j`` from silo j's released matrix and its public record count n_j: ``matrix x divisor /
    (q n)`` (the identity under ``replace_one``; ``/ n`` under ``add_remove``)."""
    divisor = release_divisor(relation, sampling_rate, n)
    q = _rate(sampling_rate)
    return matrix if divisor == q * n else matrix * (divisor / (q * n))


def accountant_relation(relation: str, sampling_rate: float = 1.0) -> str:
    """The accountant relation DP-CalR's shares are priced under (module docstring: ``add_remove`` at rate 1)."""
    rel = _relation(relation)
    return _ACCOUNTANT_RELATION if _rate(sampling_rate) == 1.0 else rel


def dp_calr(
    encode: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    augment: Callable[[torch.Tensor], torch.Tensor],
    *,
    views: int,
    mu: float,
    sigma: float,
    generator: torch.Generator | None,
    batch_size: int = 512,
    sampling_rate: float = 1.0,
    divisor: float | None = None,
) -> np.ndarray:
    """Algorithm 2: ``R~ = 1/(n V) sum_records sum_views z z^T + N(0, sigma^2)`` per entry, as float64 numpy (H x H).

    ``divisor``: what the sum over records of each record's mean over its views is divided by (default ``q n``, the
    mean; a silo passes :func:`release_divisor`, which is ``q`` under add/remove).

    ``sampling_rate = q < 1``: the Poisson-subsampled variant (module docstring): every record is kept with
    probability ``q`` (coins drawn from ``generator``, which is then required, before the noise) and the sum over the
    kept records is divided by ``q n``. An empty sample gives the noise alone.

    ``images`` holds the client's ``n`` records along dim 0. They are processed in chunks of ``batch_size``; for each
    chunk ``augment`` (a batch -> augmented batch callable with its own randomness) is called ``views`` times, and
    ``z = clip_rows(encode(view), mu)`` under ``torch.no_grad``. Every record has exactly ``views`` views, so the mean
    over records of each record's mean over its views is the mean over all ``n V`` rows; that per-record averaging is
    what bounds one record's contribution (:func:`calr_sensitivity`). ``z`` is cast to float64 before clipping (so the
    norm bound holds to float64 precision) and the sums are accumulated in float64.

    Noise: i.i.d. ``N(0, sigma^2)`` on each of the ``H^2`` entries (the paper's ``N(0, sigma^2 I)``; the result is
    therefore not symmetric), drawn in float64 from ``generator`` (a CPU ``torch.Generator``, required when
    ``sigma > 0``). ``sigma = 0`` at rate 1 adds nothing and leaves ``generator`` untouched.

    An ``nn.Module`` encoder is put in eval mode for the call and restored afterwards (see the module docstring: a
    record's ``z`` must not depend on the other records in its batch).
    """
    if not callable(encode) or not callable(augment):
        raise ValueError("encode and augment must be callables (batch tensor -> tensor)")
    if not isinstance(images, torch.Tensor) or images.ndim < 1 or images.shape[0] == 0:
        raise ValueError("images must be a tensor holding at least one record along dim 0")
    count_views = _count(views, "views", "augmented views per record, V; the paper uses 5-10", minimum=1)
    chunk = _count(batch_size, "batch_size", "records encoded at once", minimum=1)
    clip = _positive(mu, "mu", "representations are clipped to norm sqrt(mu)")
    std = _sigma(sigma)
    if not math.isfinite(std):
        raise ValueError(f"sigma must be finite, got {sigma!r}")
    q = _rate(sampling_rate)
    if (std > 0.0 or q < 1.0) and not isinstance(generator, torch.Generator):
        raise ValueError(
            "generator must be a torch.Generator when sigma > 0 or sampling_rate < 1 (the source of the DP noise "
            "and of the Poisson sample)"
        )
    n = images.shape[0]
    if q < 1.0:
        keep = torch.rand(n, generator=generator, dtype=torch.float64) < q
        sample = images[keep.to(images.device)]
    else:
        sample = images

    module = encode if isinstance(encode, torch.nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    total: torch.Tensor | None = None
    try:
        with torch.no_grad():
            for start in range(0, sample.shape[0], chunk):
                batch = sample[start : start + chunk]
                for _ in range(count_views):
                    z = encode(augment(batch))
                    if not isinstance(z, torch.Tensor) or z.ndim != 2 or z.shape[0] != batch.shape[0]:
                        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
                        raise ValueError(
                            f"encode(augment(batch)) must return a (batch, H) tensor with batch = {batch.shape[0]} "
                            f"rows, got {shape}"
                        )
                    clipped = clip_rows(z.to(torch.float64), clip)
                    part = clipped.T @ clipped
                    if total is not None and part.shape != total.shape:
                        raise ValueError(f"encode returned H = {part.shape[0]} after H = {total.shape[0]}")
                    total = part if total is None else total + part
            if total is None:  # an empty Poisson sample: only H is needed (one record encoded, nothing released)
                h = int(encode(augment(images[:1])).shape[-1])
                total = torch.zeros(h, h, dtype=torch.float64)
    finally:
        if module is not None:
            module.train(was_training)
    assert total is not None
    if divisor is None:
        divisor = q * n
    elif not (math.isfinite(divisor) and divisor > 0):
        raise ValueError(f"divisor must be finite and > 0 (a public constant), got {divisor!r}")
    result = total.cpu() / (divisor * count_views)
    if std > 0.0:
        noise = torch.randn(result.shape, generator=generator, dtype=torch.float64, device=torch.device("cpu"))
        result = result.cpu() + std * noise
    return result.cpu().numpy()


# --------------------------------------------------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------------------------------------------------


def calr_epsilon(
    sigma: float,
    delta: float,
    shares: int,
    mu: float,
    n: int,
    relation: str = "replace_one",
    accountant: str = "best",
    sampling_rate: float = 1.0,
) -> float:
    """Epsilon at ``delta`` of the ``shares`` DP-CalR releases a client actually made, by dp-accounting.

    Each share is a Gaussian mechanism with noise multiplier ``sigma / calr_noise_multiplier_scale(...)``
    (at sampling rate 1 the scale is :func:`calr_sensitivity`; below 1 each share is Poisson-subsampled, module
    docstring); the ``shares`` of them compose adaptively (the model changes between shares, the data do not).
    ``shares = 0`` -> ``0.0``; ``sigma = 0`` -> ``inf``. ``accountant`` is ``"pld"``, ``"rdp"`` or ``"best"``
    (``"rdp"`` is refused for subsampled shares under ``replace_one``).
    """
    count = _count(shares, "shares", "how many times the client uploaded R~_j", minimum=0)
    std = _sigma(sigma)
    scale = calr_noise_multiplier_scale(mu, n, relation, sampling_rate)
    d = check_delta(delta)
    if count == 0:
        return 0.0
    return epsilon_spent(
        std / scale,
        float(sampling_rate),
        count,
        d,
        accountant=accountant,
        relation=accountant_relation(relation, sampling_rate),
    )


def calr_noise(
    epsilon: float,
    delta: float,
    shares: int,
    mu: float,
    n: int,
    relation: str = "replace_one",
    accountant: str = "best",
    tolerance: float = 1e-3,
    sampling_rate: float = 1.0,
) -> float:
    """Smallest ``sigma`` (noise std per entry) with which ``shares`` DP-CalR releases are ``(epsilon, delta)``-DP.

    Calibrated by :func:`protocols.privacy.accountant.calibrate_noise` at ``sampling_rate`` (the multiplier is
    ``sigma / calr_noise_multiplier_scale(mu, n, relation, sampling_rate)``), so the answer is within relative
    ``tolerance`` above the exact smallest ``sigma`` and never below it. ``epsilon = inf`` -> ``0.0``.
    """
    target = check_epsilon(epsilon)
    count = _count(shares, "shares", "how many times the client will upload R~_j", minimum=1)
    scale = calr_noise_multiplier_scale(mu, n, relation, sampling_rate)
    calibration = calibrate_noise(
        target,
        delta,
        float(sampling_rate),
        count,
        accountant=accountant,
        tolerance=tolerance,
        relation=accountant_relation(relation, sampling_rate),
    )
    return calibration.noise_multiplier * scale


def calr_closed_form_epsilon(
    shares: int,
    mu: float,
    sigma: float,
    n: int,
    delta: float,
    relation: str = "replace_one",
) -> float:
    """Proposition 6.6 with its typo corrected: ``eps = T s^2 / (2 sigma^2) + sqrt(2 T s^2 ln(1/delta) / sigma^2)``.

    ``s = calr_sensitivity(mu, n, relation)``, ``T = shares``. With ``add_remove`` (``s = mu / n``) this is the
    formula at the end of the paper's proof (the proposition's statement drops ``|D_j|^2``); ``replace_one`` puts
    ``sqrt(2) mu / n`` in its place. It is the RDP curve ``alpha T s^2 / (2 sigma^2)`` converted by Mironov's Prop. 3
    at its best order (``alpha - 1 = sqrt(ln(1/delta) / rho)``, ``rho = T s^2 / (2 sigma^2)``); dp-accounting's RDP
    conversion and its PLD are tighter, so it is never below the accountant's epsilon (:func:`calr_epsilon`).

    Check against the paper's Table 6 (``tests/protocols/privacy/test_calr.py``; T = 200 rounds, shares counted from
    the table's round indices, e.g. ``t > 100, t % 2 = 0`` -> 50): with ``replace_one`` the table's sigmas give
    epsilons within 3 % of the nominal ones in 8 of 12 rows (e.g. SVHN eps 6: 6.003, CIFAR-10 eps 8: 7.96) and
    0.76-0.96 x nominal in the other four (sigma rounded up or chosen conservatively); with ``add_remove`` every row
    is at 0.53-0.71 x nominal. ``shares = 0`` -> ``0.0``; ``sigma = 0`` -> ``inf``.
    """
    count = _count(shares, "shares", "how many times the client uploaded R~_j", minimum=0)
    std = _sigma(sigma)
    sensitivity = calr_sensitivity(mu, n, relation)
    d = check_delta(delta)
    if count == 0:
        return 0.0
    if std == 0.0:
        return math.inf
    ratio = count * sensitivity**2 / std**2
    return ratio / 2.0 + math.sqrt(2.0 * ratio * math.log(1.0 / d))
