"""The projection of SteFFLe's ascent variable ``W`` onto the Frobenius ball of radius ``D`` after each server step
(SteFFLe, Gupta et al. 2024, Algorithm 1 line 11; DP-FERMI, Lowy et al. ICLR 2023, Algorithm 1 line 6): it keeps every
entry within the bound ``|W_rj| <= D`` that DP-FERMI's Theorem 3.3 sensitivities assume."""

from __future__ import annotations

import math

import torch

__all__ = ["project_frobenius"]


def project_frobenius(W: torch.Tensor, radius: float) -> torch.Tensor:
    """``Proj_{||W||_F <= D}(W)`` (SteFFLe Algorithm 1 line 11; DP-FERMI Algorithm 1 line 6): a new tensor.

    Inside the ball ``W`` is returned unchanged (a copy); outside it is scaled to norm ``radius``. For ``"eo"`` the
    ball is on the whole ``(l, k, l)`` tensor, so every block, and every entry, also has norm ``<= D`` (the bound
    ``|W_rj| <= D`` that Theorem 3.3's sensitivities assume).
    """
    if not isinstance(W, torch.Tensor) or not W.is_floating_point():
        raise TypeError(f"W must be a floating torch tensor, got {type(W).__name__}")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not math.isfinite(radius) or radius <= 0:
        raise ValueError(f"radius must be a finite number > 0, got {radius!r}")
    if not bool(torch.isfinite(W).all()):
        raise ValueError("W contains NaN or inf values")
    norm = float(torch.linalg.vector_norm(W))
    if norm <= radius:
        return W.clone()
    return W * (radius / norm)
