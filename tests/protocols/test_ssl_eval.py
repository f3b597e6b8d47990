"""Tests for protocols/ssl_eval.py: the weighted kNN monitor, the linear probe, and feature extraction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import silofl.protocols.ssl_eval as ssl_eval
from silofl.protocols.ssl_eval import ProbeResult, extract_features, knn_accuracy, knn_predict, linear_probe
from silofl.protocols.ssl_models import build_ssl_model


def clusters(n: int, num_classes: int, dim: int, spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around random unit directions (what a good SSL backbone produces), with their labels."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(0).normal(size=(num_classes, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    labels = rng.integers(0, num_classes, n)
    return (centers[labels] + spread * rng.normal(size=(n, dim))).astype(np.float32), labels


def test_knn_on_separated_clusters_and_on_random_labels() -> None:
    x, y = clusters(2000, 10, 32, spread=0.1, seed=1)
    xt, yt = clusters(500, 10, 32, spread=0.1, seed=2)
    assert knn_accuracy(x, y, xt, yt, 10) > 0.99
    # Labels independent of the features (random in train and in test): chance level, 0.1.
    rng = np.random.default_rng(3)
    assert 0.05 < knn_accuracy(x, rng.integers(0, 10, 2000), xt, rng.integers(0, 10, 500), 10) < 0.16


def test_knn_weights_votes_by_similarity() -> None:
    # One neighbour of class 1 at similarity 1.0, two of class 0 at similarity 0.8 (cosine).
    train = np.array([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6]])
    labels = np.array([1, 0, 0])
    test = np.array([[5.0, 0.0]])  # the scale does not matter: features are L2-normalized
    # tau = 0.1: exp(10) > 2 exp(8), the close neighbour wins; tau = 10: nearly equal weights, the majority wins.
    assert knn_predict(train, labels, test, 2, k=3, tau=0.1).tolist() == [1]
    assert knn_predict(train, labels, test, 2, k=3, tau=10.0).tolist() == [0]
    assert knn_predict(train, labels, test, 2, k=1, tau=10.0).tolist() == [1]
    # k larger than the training set uses all of it; a tiny tau neither overflows nor underflows.
    assert knn_predict(train, labels, test, 2, k=200, tau=1e-4).tolist() == [1]


def test_knn_chunking_does_not_change_predictions(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = clusters(300, 5, 8, spread=0.6, seed=4)
    xt, _ = clusters(101, 5, 8, spread=0.6, seed=5)
    whole = knn_predict(x, y, xt, 5, k=20)
    monkeypatch.setattr(ssl_eval, "_KNN_CHUNK_ELEMENTS", 300 * 7)  # 7 test points per chunk
    chunked = knn_predict(torch.from_numpy(x), torch.from_numpy(y), xt, 5, k=20)
    assert chunked.dtype == np.int64
    np.testing.assert_array_equal(chunked, whole)


def test_linear_probe_separable_and_shuffled_labels() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 4))

    def separable(n: int) -> tuple[np.ndarray, np.ndarray]:
        # Labels are the argmax of a linear map; points closer than 1 to a decision boundary are dropped (margin).
        x = rng.normal(size=(n, 16))
        scores = np.sort(x @ w, axis=1)
        x = x[scores[:, -1] - scores[:, -2] > 1.0]
        return x, (x @ w).argmax(axis=1)

    (x, y), (xt, yt) = separable(3000), separable(1000)
    result = linear_probe(x, y, xt, yt, 4, epochs=30, batch_size=128)
    assert isinstance(result, ProbeResult)
    assert result.accuracy > 0.95 and result.train_accuracy > 0.95
    assert 0 < result.loss < 0.3
    noise = linear_probe(x, rng.permutation(y), xt, yt, 4, epochs=30, batch_size=128)
    assert 0.15 < noise.accuracy < 0.37  # chance is 0.25
    assert noise.loss > 1.0


def test_linear_probe_is_seeded_and_leaves_the_global_rng_alone() -> None:
    x, y = clusters(600, 3, 8, spread=0.8, seed=6)
    xt, yt = clusters(200, 3, 8, spread=0.8, seed=7)
    state = torch.get_rng_state()
    a = linear_probe(x, y, xt, yt, 3, epochs=3, batch_size=64, seed=1)
    b = linear_probe(x, y, xt, yt, 3, epochs=3, batch_size=64, seed=1)
    c = linear_probe(x, y, xt, yt, 3, epochs=3, batch_size=64, seed=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert a == b
    assert a.loss != c.loss


def test_standardization_rescues_badly_scaled_features() -> None:
    x, y = clusters(1000, 3, 8, spread=0.3, seed=8)
    xt, yt = clusters(300, 3, 8, spread=0.3, seed=9)
    scale = np.array([1e3, 1e-3, 1, 1, 1, 1, 1, 1], dtype=np.float32)
    offset = np.float32(50.0)
    scaled = linear_probe(x * scale + offset, y, xt * scale + offset, yt, 3, epochs=10, batch_size=128)
    plain = linear_probe(x, y, xt, yt, 3, epochs=10, batch_size=128)
    assert scaled.accuracy > 0.95 and abs(scaled.accuracy - plain.accuracy) < 0.03
    raw = linear_probe(x * scale + offset, y, xt * scale + offset, yt, 3, epochs=10, batch_size=128, standardize=False)
    assert raw.loss > scaled.loss


def test_extract_features_matches_the_backbone_in_eval_mode() -> None:
    model = build_ssl_model("cnn", (1, 8, 8), projection_dim=4).train()
    images = torch.rand(10, 1, 8, 8)
    with torch.no_grad():
        expected = model.eval().features(images).numpy()
    model.train()
    feats = extract_features(model, images, batch_size=3)
    assert model.training  # mode restored
    assert feats.dtype == np.float32 and feats.shape == (10, 128)
    np.testing.assert_allclose(feats, expected, rtol=1e-5, atol=1e-6)
    flat = extract_features(model, images.reshape(10, 64).numpy())  # shape inferred from 64 features
    np.testing.assert_allclose(flat, expected, rtol=1e-5, atol=1e-6)
    explicit = extract_features(model, images.reshape(10, 64), image_shape=(1, 8, 8))
    np.testing.assert_allclose(explicit, expected, rtol=1e-5, atol=1e-6)


def test_bad_arguments() -> None:
    x, y = clusters(20, 2, 4, spread=0.1, seed=0)
    with pytest.raises(ValueError, match="test_features has 3 columns but the training features have 4"):
        knn_predict(x, y, x[:, :3], 2)
    with pytest.raises(ValueError, match=r"train_labels must lie in \[0, 2\)"):
        knn_predict(x, y + 1, x, 2)
    with pytest.raises(ValueError, match=r"train_labels must be an integer array of shape \(20,\)"):
        knn_predict(x, y[:5], x, 2)
    with pytest.raises(ValueError, match="tau must be a positive number"):
        knn_predict(x, y, x, 2, tau=0)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        linear_probe(bad, y, x, y, 2, epochs=1)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        linear_probe(x, y, x, y, 2, epochs=0)
    with pytest.raises(ValueError, match="test_labels must be an integer array"):
        linear_probe(x, y, x, y.astype(float), 2, epochs=1)
    model = build_ssl_model("cnn", (1, 8, 8))
    with pytest.raises(ValueError, match=r"image_shape \(1, 4, 4\) has 16 pixels but the records have 64"):
        extract_features(model, np.zeros((2, 64), np.float32), image_shape=(1, 4, 4))
    with pytest.raises(ValueError, match="not a known image size"):
        extract_features(model, np.zeros((2, 65), np.float32))
