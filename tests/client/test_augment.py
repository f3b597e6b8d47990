"""Tests for client/augment.py: the per-shape SimCLR kernels and seeded, RNG-isolated view making."""

from __future__ import annotations

import kornia.augmentation as K
import pytest
import torch

from silofl.client.augment import CROP_SCALE, SMALL_CROP_SCALE, crop_scale, make_views, ssl_augmentation


def _ops(module: torch.nn.Module) -> list[type]:
    return [type(op) for op in module.children()]


def test_rgb_kernel_is_the_specs_simclr_augmentation() -> None:
    aug = ssl_augmentation((3, 32, 32))
    assert _ops(aug) == [K.RandomResizedCrop, K.RandomHorizontalFlip, K.ColorJitter, K.RandomGrayscale]
    jitter, gray = aug[2], aug[3]
    assert jitter.p == pytest.approx(0.8) and gray.p == pytest.approx(0.2)
    assert crop_scale((3, 32, 32)) == CROP_SCALE == (0.2, 1.0)


def test_gray_kernel_has_no_color_ops_and_small_images_crop_less() -> None:
    aug = ssl_augmentation((1, 28, 28))
    assert _ops(aug) == [K.RandomResizedCrop, K.RandomHorizontalFlip, K.ColorJitter]
    assert crop_scale((1, 28, 28)) == CROP_SCALE
    assert crop_scale((1, 8, 8)) == SMALL_CROP_SCALE == (0.5, 1.0)


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28), (1, 8, 8)])
def test_views_keep_shape_and_range_and_differ(shape: tuple[int, int, int]) -> None:
    images = torch.rand(16, *shape)
    v1, v2 = make_views(images, ssl_augmentation(shape), 2, seed=0)
    for view in (v1, v2):
        assert view.shape == images.shape and view.dtype == torch.float32
        assert view.min() >= 0.0 and view.max() <= 1.0
        assert not view.requires_grad
    assert not torch.allclose(v1, v2) and not torch.allclose(v1, images)


def test_every_sample_draws_its_own_parameters() -> None:
    images = torch.rand(1, 3, 32, 32).expand(8, -1, -1, -1).contiguous()
    (view,) = make_views(images, ssl_augmentation((3, 32, 32)), 1, seed=1)
    assert len({tuple(v.flatten()[:64].tolist()) for v in view}) == 8


def test_gray_jitter_changes_brightness() -> None:
    # A uniform gray image is unchanged by crops and flips: only the brightness/contrast jitter can move its level.
    images = torch.full((64, 1, 28, 28), 0.5)
    (view,) = make_views(images, ssl_augmentation((1, 28, 28)), 1, seed=2)
    levels = view.mean(dim=(1, 2, 3))
    assert levels.std() > 0.02
    assert 0.4 < (levels != 0.5).float().mean() < 1.0  # jitter applied with p = 0.8


def test_seeded_views_are_reproducible_and_isolated_from_the_global_rng() -> None:
    images = torch.rand(8, 1, 28, 28)
    aug = ssl_augmentation((1, 28, 28))
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = make_views(images, aug, 3, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    b = make_views(images, aug, 3, seed=7)
    c = make_views(images, aug, 3, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])  # views within one call are independent draws
    make_views(images, aug, 1, seed=None)
    assert not torch.equal(torch.get_rng_state(), state)  # unseeded: uses (and advances) the global stream


def test_bad_arguments() -> None:
    aug = ssl_augmentation((1, 8, 8))
    with pytest.raises(ValueError, match=r"images must be a float tensor \(N, C, H, W\)"):
        make_views(torch.rand(4, 64), aug, 2, seed=0)
    with pytest.raises(ValueError, match="images must be a float tensor"):
        make_views(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), aug, 2, seed=0)
    with pytest.raises(ValueError, match="n_views must be an integer >= 1"):
        make_views(torch.rand(4, 1, 8, 8), aug, 0, seed=0)
    with pytest.raises(ValueError, match="seed must be None or an integer >= 0"):
        make_views(torch.rand(4, 1, 8, 8), aug, 1, seed=-1)
    with pytest.raises(ValueError, match="supports 1 \\(gray\\) or 3 \\(RGB\\)"):
        ssl_augmentation((2, 8, 8))
    with pytest.raises(ValueError, match="image_shape must be"):
        ssl_augmentation((8, 8))  # type: ignore[arg-type]
