"""Tests for protocols/mu2fl/logreg.py: the closed-form logistic regression equals silofl's torch model (the
non-finite query points are tests/system/test_nonfinite.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.protocols.mu2fl.logreg import logreg_dim, logreg_grad, logreg_loss


def test_closed_form_gradient_matches_silofl_torch_model() -> None:
    import torch

    from silofl.protocols.models import build_model, get_parameters, loss_fn

    rng = np.random.default_rng(1)
    for classes in (2, 4):
        model = build_model("logreg", 6, classes, seed=3)
        params = np.concatenate([v.ravel() for v in get_parameters(model).values()]).astype(np.float64)
        assert params.shape == (logreg_dim(6, classes),)
        a = rng.random((5, 6)).astype(np.float32)
        y = rng.integers(classes, size=5)
        logits = model(torch.from_numpy(a))
        loss = loss_fn(logits, torch.from_numpy(y))
        model.zero_grad()
        loss.backward()
        expected = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
        np.testing.assert_allclose(logreg_grad(params, a, y, classes), expected, atol=1e-6)
        assert logreg_loss(params, a, y, classes) == pytest.approx(loss.item(), abs=1e-6)
