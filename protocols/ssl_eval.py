"""Evaluation of self-supervised representations: feature extraction, the weighted kNN monitor, the linear probe.

FedSC is evaluated like centralized SSL (paper Section 7.1 and Fig. 2): the backbone is
frozen and its features are judged by

* a **kNN monitor** (k = 200, tau = 0.1; the paper's convergence plots, Fig. 2): cosine similarity between
  L2-normalized features, each of the k most similar training points votes for its label with weight
  ``exp(sim / tau)`` (Wu et al., 2018, instance discrimination; the monitor of most SimCLR/SC code), and
* a **linear probe** (Table 2's metric): multinomial logistic regression on the frozen features, trained with Adam
  (lr 3e-3, 200 epochs in the paper), on features standardized with the training statistics.

Pure torch/numpy on the CPU; everything is bounded in memory (kNN similarities are computed in chunks of test points)
and deterministic given the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from silofl.protocols.ssl_models import image_shape as infer_image_shape

__all__ = [
    "ProbeResult",
    "extract_features",
    "knn_accuracy",
    "knn_predict",
    "linear_probe",
]

_KNN_CHUNK_ELEMENTS = 1 << 24  # similarities held at once: 16M float32 = 64 MiB
_STD_FLOOR = 1e-6  # constant features are centred but not scaled up


@dataclass(frozen=True)
class ProbeResult:
    """Linear-probe outcome: test accuracy, training accuracy, and the final mean cross-entropy on the training set."""

    accuracy: float
    train_accuracy: float
    loss: float


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _features(name: str, value: object, dim: int | None = None) -> torch.Tensor:
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.ndim != 2 or array.shape[0] == 0 or not np.issubdtype(array.dtype, np.number):
        raise ValueError(
            f"{name} must be a non-empty numeric (n, d) array, got dtype {array.dtype} shape {array.shape}"
        )
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{name} has {array.shape[1]} columns but the training features have {dim}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or inf; the model that produced them diverged")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _labels(name: str, value: object, n: int, num_classes: int) -> torch.Tensor:
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.shape != (n,) or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{name} must be an integer array of shape ({n},), got dtype {array.dtype} shape {array.shape}"
        )
    if array.min() < 0 or array.max() >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes}), got range [{array.min()}, {array.max()}]")
    return torch.from_numpy(array.astype(np.int64))


def extract_features(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    *,
    image_shape: tuple[int, int, int] | None = None,
    batch_size: int = 1024,
) -> np.ndarray:
    """Frozen backbone features ``(N, F)`` as float32 numpy: ``model.features`` in eval mode, without autograd.

    images: a float tensor ``(N, C, H, W)``, or flattened records ``(N, C*H*W)`` (numpy or tensor) reshaped to
    ``image_shape`` (default: inferred from the width with :func:`protocols.ssl_models.image_shape`). A model without
    a ``features`` method (a plain encoder) is called directly. The model's train/eval mode is restored afterwards.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    x = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.asarray(images))
    if x.dim() == 2:
        shape = infer_image_shape(x.shape[1]) if image_shape is None else tuple(image_shape)
        if int(np.prod(shape)) != x.shape[1]:
            raise ValueError(f"image_shape {shape} has {int(np.prod(shape))} pixels but the records have {x.shape[1]}")
        x = x.reshape(x.shape[0], *shape)
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W) or flattened records (N, D), got shape {tuple(x.shape)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    encode = getattr(model, "features", model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            chunks = [
                encode(x[start : start + batch_size].to(device=device, dtype=torch.float32)).cpu()
                for start in range(0, x.shape[0], batch_size)
            ]
    finally:
        model.train(was_training)
    if not chunks:
        raise ValueError("images is empty: there is nothing to extract features from")
    return torch.cat(chunks).numpy().astype(np.float32, copy=False)


def knn_predict(
    train_features: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_features: np.ndarray | torch.Tensor,
    num_classes: int,
    k: int = 200,
    tau: float = 0.1,
) -> np.ndarray:
    """Weighted-kNN labels (int64 ``(n_test,)``) of the test points, by cosine similarity to the training points.

    Each test point takes its ``min(k, n_train)`` most similar training points; each votes for its label with weight
    ``exp(sim / tau)``; the class with the largest total wins (ties: the smallest class index). Similarities are
    computed in chunks of test points so that memory stays about 64 MiB whatever the sizes.
    """
    num_classes = _check_int("num_classes", num_classes, 2)
    k = _check_int("k", k, 1)
    tau = _check_positive("tau", tau)
    train = _features("train_features", train_features)
    test = _features("test_features", test_features, dim=train.shape[1])
    labels = _labels("train_labels", train_labels, train.shape[0], num_classes)
    train = F.normalize(train, dim=1)
    test = F.normalize(test, dim=1)
    k = min(k, train.shape[0])
    chunk = max(1, _KNN_CHUNK_ELEMENTS // train.shape[0])
    out = []
    for start in range(0, test.shape[0], chunk):
        sim = test[start : start + chunk] @ train.T
        top_sim, top_idx = sim.topk(k, dim=1)
        # exp(sim / tau) divided by the row's largest weight: the same vote, with no overflow or underflow for small tau
        weights = torch.exp((top_sim - top_sim[:, :1]) / tau)
        votes = torch.zeros(top_idx.shape[0], num_classes, dtype=weights.dtype)
        votes.scatter_add_(1, labels[top_idx], weights)
        out.append(votes.argmax(dim=1))
    return torch.cat(out).numpy()


def knn_accuracy(
    train_features: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_features: np.ndarray | torch.Tensor,
    test_labels: np.ndarray | torch.Tensor,
    num_classes: int,
    k: int = 200,
    tau: float = 0.1,
) -> float:
    """Fraction of test points whose :func:`knn_predict` label equals ``test_labels``."""
    predictions = knn_predict(train_features, train_labels, test_features, num_classes, k=k, tau=tau)
    truth = _labels("test_labels", test_labels, predictions.shape[0], num_classes).numpy()
    return float((predictions == truth).mean())


def linear_probe(
    train_features: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_features: np.ndarray | torch.Tensor,
    test_labels: np.ndarray | torch.Tensor,
    num_classes: int,
    *,
    epochs: int,
    lr: float = 3e-3,
    batch_size: int = 512,
    seed: int = 0,
    standardize: bool = True,
) -> ProbeResult:
    """Train a logistic-regression probe ``Linear(F, num_classes)`` on frozen features and score it on the test set.

    Adam with learning rate ``lr`` (the paper: 3e-3 for 200 epochs), shuffled minibatches of ``batch_size``,
    cross-entropy loss. With ``standardize`` the features are z-scored with the training mean and standard
    deviation (also applied to the test features). Initialization and shuffling come from ``seed`` through a
    private generator: the same inputs and seed give the same result, and the global RNG is not used.
    """
    num_classes = _check_int("num_classes", num_classes, 2)
    epochs = _check_int("epochs", epochs, 1)
    lr = _check_positive("lr", lr)
    batch_size = _check_int("batch_size", batch_size, 1)
    seed = _check_int("seed", seed, 0)
    train = _features("train_features", train_features)
    test = _features("test_features", test_features, dim=train.shape[1])
    y_train = _labels("train_labels", train_labels, train.shape[0], num_classes)
    y_test = _labels("test_labels", test_labels, test.shape[0], num_classes)
    if standardize:
        mean = train.mean(dim=0)
        std = train.std(dim=0, unbiased=False).clamp_min(_STD_FLOOR)
        train, test = (train - mean) / std, (test - mean) / std

    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # nn.Linear's default init would consume the global RNG
        probe = nn.Linear(train.shape[1], num_classes)
    bound = 1.0 / float(np.sqrt(train.shape[1]))
    with torch.no_grad():
        probe.weight.uniform_(-bound, bound, generator=generator)
        probe.bias.uniform_(-bound, bound, generator=generator)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr)
    n = train.shape[0]
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(probe(train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    with torch.no_grad():
        train_logits = probe(train)
        final_loss = float(F.cross_entropy(train_logits, y_train))
        train_accuracy = float((train_logits.argmax(dim=1) == y_train).float().mean())
        accuracy = float((probe(test).argmax(dim=1) == y_test).float().mean())
    return ProbeResult(accuracy=accuracy, train_accuracy=train_accuracy, loss=final_loss)
