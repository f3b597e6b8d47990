"""The papers' closed-form noise for SteFFLe / DP-FERMI (Theorem 3.3), for the privacy report next to the accountant's.

silofl reports both the papers' closed form and the noise a numerical accountant finds; the run uses the accountant's
(docs/PRIVACY.md). This module computes the closed form and says what its sigma means in our terms.

Theorem 3.3 (SteFFLe; DP-FERMI Theorem 3.3, restated as D.2): let ``eps <= 2 ln(1/delta)``, ``delta in (0, 1)``,
``T >= (n sqrt(eps) / (2 m))^2``, ``F(x, .)`` be ``L``-Lipschitz and ``|W_rj| <= D``. Then noise with

    sigma_W^2     >= 16 T ln(1/delta) / (eps^2 n^2 rho)
    sigma_theta^2 >= 16 L^2 D^2 ln(1/delta) T / (eps^2 n^2 rho)

makes Algorithm 1 ``(eps, delta)``-DP with respect to the sensitive attributes (SteFFLe: ISRL-DP, per silo, with ``n``
the silo's record count ``n~``). Its second part (DP with respect to all features, neighbours differing in one whole
record ``z_i = (x_i, s_i, y_i)``; silofl's `protect` = record) asks for

    sigma_W^2     >= 32 T ln(1/delta) / (eps^2 n^2) (1/rho + D^2)
    sigma_theta^2 >= 64 L^2 D^2 ln(1/delta) T / (eps^2 n^2 rho) + 32 D^4 L^2 l^2 T ln(1/delta) / (eps^2 n^2)

with ``l`` the number of labels (``whole_record=True``). The theorem noises the fairness gradients only: Algorithm 1
adds no noise to the loss gradient, which depends on ``x_i`` and ``y_i``; silofl clips it per record and noises it as
theta's (the loss release of `client.algorithms.steffle.record_gradients`).

What sigma is. The std, per coordinate, of the Gaussian noise added to the batch MEAN of the per-record fairness
gradients: SteFFLe Algorithm 1 line 8, ``h_{t,j,w} = (1/|B_t|) sum_{i in B_t} grad_W psi_ji + V_{t,j}`` with
``(V_{t,j})_qr ~ N(0, sigma_{j,w}^2)``, likewise ``u_{t,j} ~ N(0, sigma_{j,theta}^2 I)`` for theta (DP-FERMI
Algorithm 1 lines 5-6). On the batch SUM the std is ``m sigma``.

Where the constants come from (DP-FERMI Appendix D, proof of Theorem D.2; SteFFLe Appendix B, Lemma B.1): the L2
distance between the batch means of two neighbouring data sets (one ``s_i`` changed) is bounded by
``Delta_W^2 <= 8 / (m^2 rho)`` and ``Delta_theta^2 <= 8 D^2 L^2 / (m^2 rho)``. (SteFFLe's Lemma B.1 prints these
without the square on the left; DP-FERMI's proof squares them, and only that reading reproduces the theorem's
constants.) These are fed to the moments accountant, Abadi et al. 2016 Theorem 1 (``sigma >= c2 q sqrt(T ln(1/delta))
/ eps`` for ``eps < c1 q^2 T``, with ``q = m / n``), with ``Delta`` in the role of the add/remove sensitivity and
``c2 = sqrt(2)``, ``c1 = 4`` (the latter is the condition on ``T``).

Conversion to our noise multipliers (``std / sensitivity``, :class:`protocols.privacy.gaussian.GaussianMechanism`):

* the papers' own reading is ``relation="add_remove"`` with sensitivity ``Delta``: multiplier
  ``sigma / Delta = q sqrt(2 T ln(1/delta)) / eps``, the same for both streams (``rho``, ``L`` and ``D`` cancel);
  the two streams come from one sample, so together they are ``releases=2`` at that multiplier
  (:func:`protocols.privacy.accountant.combined_noise_multiplier`), which the theorem does not account for;
* under ``relation="replace_one"`` the multiplier is ``sigma / R`` with ``R`` the radius of a ball centred at 0 that
  holds every record's contribution to the mean (see :mod:`protocols.privacy.accountant`); ``R >= Delta / 2``, with
  equality only when the contributions of the two neighbours can be opposite points of that ball.

Measured with these readings (``tests/protocols/privacy/test_closed_form.py``, Credit Card: ``n = 7,500`` per silo of
three, ``m = 256``, ``T = 1,200``, ``delta = 1 / n^2``): under add_remove the closed form's epsilon is larger than its
nominal one, 9 -> 17.3 (PLD, one stream; outside the theorem's validity condition, which needs ``T >= 1,932`` there) and
1 -> 1.30 (RDP, theta and W together).
"""

from __future__ import annotations

import math
import numbers

from silofl.protocols.privacy.accountant import check_delta


def _positive(value: object, name: str, *, upper: float = math.inf) -> float:
    """``value`` as a finite float in ``(0, upper]``; else ``ValueError`` naming ``name``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 < float(value) <= upper:
        bound = f"(0, {upper:g}]" if math.isfinite(upper) else "> 0 and finite"
        raise ValueError(f"{name} must be a number in {bound}, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _count(value: object, name: str, *, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; else ``ValueError`` naming ``name``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def steffle_closed_form(
    epsilon: float,
    delta: float,
    n: int,
    m: int,
    T: int,
    rho: float,
    L: float,
    D: float,
    *,
    whole_record: bool = False,
    num_labels: int = 2,
) -> dict[str, float | bool]:
    """The papers' Theorem 3.3 noise for one silo, and what it is in our terms (see the module docstring);
    ``whole_record``: Theorem D.2's second part (DP of the whole record; ``num_labels`` is its ``l``).

    Args:
        epsilon, delta: the target privacy, per silo.
        n: the silo's number of records (``n~`` in SteFFLe); m: the batch size ``|B_t|``; T: the number of rounds.
        rho: a lower bound on every group's share of the records (``p_S(r) >= rho``).
        L: Lipschitz constant of the model output ``F(x, .)`` in theta; D: the bound on ``|W_rj|`` (the theorem's
            entrywise bound; its proof uses D as the diameter of the W set, and silofl projects W on
            ``||W||_F <= D``).

    Returns:
        ``sigma_w``, ``sigma_theta``: noise std per coordinate on the batch MEAN (the theorem's lower bounds; with
        ``whole_record`` its second part's);
        ``sensitivity_w``, ``sensitivity_theta``: the papers' ``Delta`` (distance of neighbours' batch means; for the
        sensitive attributes);
        ``sampling_rate``: ``m / n``;
        ``noise_multiplier``: ``sigma / Delta`` for either stream, the add/remove multiplier the proof assumes;
        ``min_steps``: ``(n sqrt(eps) / (2 m))^2``, the smallest ``T`` the theorem covers;
        ``valid``: whether ``T >= min_steps`` and ``eps <= 2 ln(1/delta)``, the theorem's conditions.

    Raises:
        ValueError: an argument is out of range (the message names it).
    """
    eps = _positive(epsilon, "epsilon")
    d = check_delta(delta)
    records = _count(n, "n")
    batch = _count(m, "m")
    if batch > records:
        raise ValueError(f"m (the batch size) must be <= n (the silo's records), got m={batch}, n={records}")
    steps = _count(T, "T")
    share = _positive(rho, "rho", upper=1.0)
    lipschitz = _positive(L, "L")
    bound = _positive(D, "D")

    labels = _count(num_labels, "num_labels", minimum=2)

    log_term = math.log(1.0 / d)
    variance_w = 16.0 * steps * log_term / (eps**2 * records**2 * share)
    sigma_w = math.sqrt(variance_w)
    sigma_theta = math.sqrt(variance_w * lipschitz**2 * bound**2)
    if whole_record:  # Theorem D.2, second part
        scale = steps * log_term / (eps**2 * records**2)
        record_w = math.sqrt(32.0 * scale * (1.0 / share + bound**2))
        record_theta = math.sqrt(
            64.0 * lipschitz**2 * bound**2 * scale / share + 32.0 * bound**4 * lipschitz**2 * labels**2 * scale
        )
    sensitivity_w = math.sqrt(8.0 / share) / batch
    sensitivity_theta = sensitivity_w * bound * lipschitz
    min_steps = (records * math.sqrt(eps) / (2.0 * batch)) ** 2
    return {
        "sigma_w": record_w if whole_record else sigma_w,
        "sigma_theta": record_theta if whole_record else sigma_theta,
        "sensitivity_w": sensitivity_w,
        "sensitivity_theta": sensitivity_theta,
        "sampling_rate": batch / records,
        "noise_multiplier": sigma_w / sensitivity_w,
        "min_steps": min_steps,
        "valid": bool(steps >= min_steps and eps <= 2.0 * log_term),
    }
