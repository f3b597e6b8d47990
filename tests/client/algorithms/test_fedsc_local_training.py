"""Tests for client/algorithms/fedsc.py: a FedSC silo's local SGD (epochs, or a fixed number of steps)."""

from __future__ import annotations

import numpy as np
import torch

from silofl.client.algorithms.fedsc import _step_batches, local_sc_training
from silofl.client.augment import ssl_augmentation
from silofl.protocols.ssl_models import build_ssl_model


def _train(model, images, **kwargs) -> float:
    options = {
        "epochs": 1,
        "batch_size": 4,
        "lr": 0.05,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "grad_clip": 3.0,
        "mu": 4.0,
        "alpha": 1.0,
        "others": None,
        "seed": 0,
        **kwargs,
    }
    return local_sc_training(model, images, ssl_augmentation((1, 8, 8)), **options)


def test_steps_replace_the_epochs_and_take_exactly_that_many_sgd_steps(monkeypatch) -> None:
    images = torch.rand(10, 1, 8, 8)
    calls = [0]
    original = torch.optim.SGD.step

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", counting)
    model = build_ssl_model("cnn", (1, 8, 8), projection_dim=4, seed=0)
    loss = _train(model, images, steps=7, epochs=5)
    assert calls[0] == 7 and np.isfinite(loss)
    calls[0] = 0
    _train(model, images, epochs=2)  # steps = 0: two passes of ceil(10 / 4) batches
    assert calls[0] == 6


def test_one_step_moves_the_model_and_is_reproducible() -> None:
    images = torch.rand(10, 1, 8, 8)
    models = [build_ssl_model("cnn", (1, 8, 8), projection_dim=4, seed=0) for _ in range(3)]
    before = [p.detach().clone() for p in models[0].parameters()]
    _train(models[0], images, steps=1)
    _train(models[1], images, steps=1)
    _train(models[2], images, steps=1, seed=1)
    after = [list(m.parameters()) for m in models]
    assert any(not torch.equal(a, b) for a, b in zip(before, after[0], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(after[0], after[1], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(after[0], after[2], strict=True))


def test_step_batches_never_repeat_a_record_within_a_pass() -> None:
    rng = np.random.default_rng(0)
    batches = _step_batches(rng, n=10, b=4, steps=5)
    assert [len(b) for b in batches] == [4] * 5
    for batch in batches:
        assert len(set(batch.tolist())) == 4
    first_pass = np.concatenate([b.numpy() for b in batches[:2]])  # 2 batches of 4 fit in 10 records
    assert len(set(first_pass.tolist())) == 8
