"""The augmentation kernel A(. | xbar) of spectral contrastive learning, as kornia modules, and seeded view making.

FedSC's correlation matrices (paper eqs. 1-2, Algorithm 2) and local loss (eq. 5) average over augmented views of each
sample. The FedSC paper (Jing et al., ICML 2024) does not list its augmentations (Section 7.1); silofl uses SimCLR's
kernel (Chen et al., ICML 2020) for the paper's RGB datasets:

* RGB (CIFAR-10, 32x32): random resized crop (scale 0.2-1), horizontal flip (p = 0.5), color jitter (brightness,
  contrast, saturation 0.4, hue 0.1) with p = 0.8, random grayscale with p = 0.2.
* One-channel images (MNIST, Fashion-MNIST, digits): crop, flip and brightness/contrast jitter only. Saturation and hue
  are undefined for a single channel (every pixel is gray, so they have no effect), and grayscale conversion is the
  identity; dropping them keeps the kernel well defined instead of silently doing nothing.

Decisions for the small images:

* Horizontal flip is kept for every shape, 8x8 digits included. No digit is the mirror image of another digit, and a
  mirrored garment or shoe (Fashion-MNIST) is still the same class, so a representation that is invariant to flips
  loses no label information, while the flip doubles the variety of views.
* The crop scale stays at SimCLR's 0.2-1 for 28x28 and 32x32, but is 0.5-1 for 8x8 digits: 20% of an 8x8 image is
  a patch about 3.6 pixels wide, which no longer shows the digit, so positive pairs would share nothing to align.

kornia draws its random parameters from torch's global RNG. :func:`make_views` with a seed runs inside
``torch.random.fork_rng`` after ``manual_seed(seed)``, so the views are reproducible and no other code's random stream
is disturbed.
"""

from __future__ import annotations

import kornia.augmentation as K
import numpy as np
import torch
from torch import nn

__all__ = ["CROP_SCALE", "SMALL_CROP_SCALE", "crop_scale", "make_views", "ssl_augmentation"]

#: RandomResizedCrop area range (fraction of the image), SimCLR's value.
CROP_SCALE = (0.2, 1.0)
#: Crop area range for images no larger than 8x8 (scikit-learn's digits), see the module docstring.
SMALL_CROP_SCALE = (0.5, 1.0)
_JITTER_P = 0.8
_GRAYSCALE_P = 0.2
_FLIP_P = 0.5


def _check_shape(image_shape: object) -> tuple[int, int, int]:
    if (
        not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 3
        or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in image_shape)
    ):
        raise ValueError(
            f"image_shape must be (channels, height, width) with positive integers, got {image_shape!r}; "
            "use protocols.ssl_models.image_shape(num_features)"
        )
    channels, height, width = (int(s) for s in image_shape)
    if channels not in (1, 3):
        raise ValueError(f"image_shape has {channels} channels; the augmentation supports 1 (gray) or 3 (RGB)")
    return channels, height, width


def crop_scale(image_shape: tuple[int, int, int]) -> tuple[float, float]:
    """The RandomResizedCrop area range for ``image_shape``: `SMALL_CROP_SCALE` up to 8x8 pixels, else `CROP_SCALE`."""
    _, height, width = _check_shape(image_shape)
    return SMALL_CROP_SCALE if max(height, width) <= 8 else CROP_SCALE


def ssl_augmentation(image_shape: tuple[int, int, int]) -> nn.Module:
    """The SimCLR-style augmentation for images of ``image_shape`` (C, H, W), as an ``nn.Sequential`` of kornia ops.

    Input: float batch ``(N, C, H, W)`` with values in [0, 1]; output: same shape, values in [0, 1]. Every sample
    draws its own parameters. See the module docstring for the per-shape choices.
    """
    channels, height, width = _check_shape(image_shape)
    ops: list[nn.Module] = [
        K.RandomResizedCrop((height, width), scale=crop_scale(image_shape)),
        K.RandomHorizontalFlip(p=_FLIP_P),
    ]
    if channels == 3:
        ops += [
            K.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=_JITTER_P),
            K.RandomGrayscale(p=_GRAYSCALE_P),
        ]
    else:
        ops.append(K.ColorJitter(brightness=0.4, contrast=0.4, p=_JITTER_P))
    return nn.Sequential(*ops)


def make_views(
    images: torch.Tensor, augmentation: nn.Module, n_views: int, seed: int | None = None
) -> list[torch.Tensor]:
    """``n_views`` independently augmented copies of the batch ``images`` (N, C, H, W) (no autograd graph).

    seed: None draws from torch's global RNG (advancing it, as kornia does); an integer makes the views a
    deterministic function of (images, seed) and leaves the global RNG exactly as it was.
    """
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        described = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(
            f"images must be a float tensor (N, C, H, W), got {described}; reshape flat records with "
            "protocols.ssl_models.image_shape(num_features)"
        )
    if isinstance(n_views, bool) or not isinstance(n_views, (int, np.integer)) or n_views < 1:
        raise ValueError(f"n_views must be an integer >= 1, got {n_views!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be None or an integer >= 0, got {seed!r}")
    with torch.no_grad():
        if seed is None:
            return [augmentation(images) for _ in range(int(n_views))]
        devices = [images.device] if images.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            return [augmentation(images) for _ in range(int(n_views))]
