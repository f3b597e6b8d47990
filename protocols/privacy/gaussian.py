"""The Gaussian mechanism: release ``value + N(0, (noise_multiplier * sensitivity)^2 I)``.

``sensitivity`` depends on the neighbouring relation the noise was calibrated for
(:data:`protocols.privacy.accountant.RELATIONS`):

* ``add_remove``: the L2 sensitivity of the released quantity under add/remove-one record (e.g. ``C / B`` for a mean
  of per-record gradients clipped to norm ``C`` over an expected batch size ``B``);
* ``replace_one`` (one record's sensitive attribute changes): the radius ``R`` of a ball **centred at 0** that holds
  every record's contribution whatever its attribute (``C / B`` again for that mean; see the accountant's module
  docstring for why the centre must be 0 under sampling). For an un-sampled release (``sampling_rate = 1``) only the
  distance between the two neighbours' values matters: ``R`` is half of it (:func:`histogram_sensitivity`).

``noise_multiplier`` is what :func:`protocols.privacy.accountant.calibrate_noise` returns. Keeping the two apart is what
lets the accountant stay independent of the model: the accountant only ever sees the multiplier.

A release is never NaN or inf, and never an error: when ``value + noise`` is not finite everywhere (a value that is
not finite, or one so large that adding the noise overflows), the mechanism returns the noise alone, the same draw
(the generator is consumed exactly as on the normal path). The per-record rules upstream
(`protocols.models.clip_factors` and its callers) keep every released sum finite and within its sensitivity whatever
finite values a server sends, so this is the last line of defence against an overflow nobody foresaw. Why noise and
not an error or the NaN: an error or a NaN that appears because of one record tells the server that the record is
there, and no noise can hide it. The noise alone is the Gaussian mechanism's release of the constant 0, a value
inside every ball around 0 the replace-one and add/remove accounting assumes; a value that overflowed was outside
those balls anyway, and the finite noise gives away at most that the fallback fired.

Known limitation, shared with Opacus' default mode: noise comes from torch's / numpy's PRNGs (not a CSPRNG) and from
floating-point Gaussian sampling, which has known side channels in theory (Mironov 2012; Jin et al. 2022). Not
addressed here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from silofl.protocols.privacy.accountant import check_relation


@dataclass(frozen=True)
class GaussianMechanism:
    """Adds isotropic Gaussian noise with std ``noise_multiplier * sensitivity``.

    Args:
        sensitivity: L2 sensitivity of the released quantity (finite, ``>= 0``).
        noise_multiplier: noise std in units of the sensitivity (finite, ``>= 0``; 0 releases the value as is).
    """

    sensitivity: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        for name in ("sensitivity", "noise_multiplier"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise ValueError(f"GaussianMechanism.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"GaussianMechanism.{name} must be finite and >= 0, got {value}")
            object.__setattr__(self, name, float(value))

    @property
    def std(self) -> float:
        """Standard deviation of the noise on each coordinate."""
        return self.noise_multiplier * self.sensitivity

    def release(self, value: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``value + N(0, std^2 I)`` as a new tensor of ``value``'s dtype and device.

        ``generator`` makes the noise reproducible (it must live on ``value``'s device); ``None`` uses torch's global
        generator. ``value`` is not modified. If ``value + noise`` is not finite everywhere, the noise alone (the
        same draw; zeros when ``std`` is 0): see the module docstring.
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"release expects a torch.Tensor, got {type(value).__name__}; use release_numpy for arrays")
        if not value.is_floating_point():
            raise TypeError(f"release needs a floating-point tensor, got dtype {value.dtype}; cast it first")
        if self.std == 0.0:
            return value.clone() if _all_finite(value) else torch.zeros_like(value)
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype, device=value.device) * self.std
        released = value + noise
        return released if _all_finite(released) else noise

    def release_numpy(self, value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``value + N(0, std^2 I)`` in float64, with noise drawn from ``rng`` (for server-side numpy code); the noise
        alone if that is not finite everywhere (see the module docstring)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng)}")
        array = np.asarray(value, dtype=np.float64)
        if self.std == 0.0:
            return array.copy() if np.all(np.isfinite(array)) else np.zeros_like(array)
        noise = rng.normal(0.0, self.std, size=array.shape)
        with np.errstate(over="ignore", invalid="ignore"):
            released = array + noise
        if not np.all(np.isfinite(released)):
            return noise
        return released


def _all_finite(t: torch.Tensor) -> bool:
    """Every entry finite: the sum first (NaN or inf if an entry is; one reduction, the common case), entry by entry
    only when the sum is not finite (a NaN or inf entry, or finite entries whose sum overflows)."""
    return math.isfinite(float(t.detach().sum())) or bool(torch.isfinite(t).all())


def histogram_sensitivity(relation: str) -> float:
    """``sensitivity`` to give :class:`GaussianMechanism` for a histogram of counts (one count per group), unsampled.

    One record adds 1 to the count of its group. Under ``add_remove`` a record's presence changes one count by 1:
    sensitivity 1. Under ``replace_one`` changing its group from ``r`` to ``r'`` moves 1 from count ``r`` to count
    ``r'``: the two histograms are ``sqrt(2)`` apart in L2, and an unsampled replace-one Gaussian release is accounted
    as a Gaussian of sensitivity ``2 R`` (dp-accounting's ``REPLACE`` adjacency at ``q = 1``), so ``R = sqrt(2) / 2``.
    Either way the release is accounted at ``sampling_rate = 1`` (e.g. as a
    :class:`~protocols.privacy.accountant.PriorRelease`).
    """
    return 1.0 if check_relation(relation) == "add_remove" else math.sqrt(2.0) / 2.0
