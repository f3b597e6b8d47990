"""Tests for protocols/steffle/projection.py: the projection of W onto the Frobenius ball."""

from __future__ import annotations

import pytest
import torch

from silofl.protocols.steffle.projection import project_frobenius


def test_project_frobenius() -> None:
    W = torch.tensor([[0.3, -0.4], [0.0, 0.0]])  # norm 0.5
    inside = project_frobenius(W, 1.0)
    assert torch.equal(inside, W) and inside is not W
    assert torch.equal(project_frobenius(W, 0.5), W)  # on the sphere: unchanged
    outside = project_frobenius(W, 0.1)
    assert float(torch.linalg.vector_norm(outside)) == pytest.approx(0.1, rel=1e-6)
    torch.testing.assert_close(outside, W * 0.2)  # same direction
    blocks = torch.randn(3, 2, 3, generator=torch.Generator().manual_seed(40)) * 10  # eo: the whole tensor is projected
    projected = project_frobenius(blocks, 2.0)
    assert float(torch.linalg.vector_norm(projected)) == pytest.approx(2.0, rel=1e-6)
    assert float(projected.abs().max()) <= 2.0
    with pytest.raises(ValueError, match="radius must be a finite number > 0"):
        project_frobenius(W, -1.0)
