"""The Gaussian mechanism: release ``value + N(0, (noise_multiplier * sensitivity)^2 I)``.

``sensitivity`` is the L2 sensitivity of the released quantity under add/remove-one record (e.g. ``C / B`` for a mean
of per-record gradients clipped to norm ``C`` over an expected batch size ``B``); ``noise_multiplier`` is what
:func:`protocols.privacy.accountant.calibrate_noise` returns. Keeping the two apart is what lets the accountant stay
independent of the model: the accountant only ever sees the multiplier.

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
        generator. ``value`` is not modified.
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"release expects a torch.Tensor, got {type(value).__name__}; use release_numpy for arrays")
        if not value.is_floating_point():
            raise TypeError(f"release needs a floating-point tensor, got dtype {value.dtype}; cast it first")
        if self.std == 0.0:
            return value.clone()
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype, device=value.device)
        return value + noise * self.std

    def release_numpy(self, value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``value + N(0, std^2 I)`` in float64, with noise drawn from ``rng`` (for server-side numpy code)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng)}")
        array = np.asarray(value, dtype=np.float64)
        if self.std == 0.0:
            return array.copy()
        return array + rng.normal(0.0, self.std, size=array.shape)
