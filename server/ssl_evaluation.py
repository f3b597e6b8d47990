"""Central evaluation of a self-supervised backbone (FedSC, FedAvg+SC): the paper's protocol, at the server.

Representation learning is judged by what a simple classifier can do with the frozen backbone's features: a kNN
monitor during training (k = 200, tau = 0.1 by default) and a linear probe at the end (logistic regression with
Adam 3e-3 on the features of the labelled training set, accuracy on the test set; `final.accuracy` of result.json).
Like the paper's, this evaluation is central: the server needs its own labelled copy of the data (in simulation, the
run's dataset with its official train/test split; `eval-data = none` turns it off for a server without one). It
never touches the silos: nothing about their records leaves them for evaluation.

The monitor uses a seeded subset (`MONITOR_MEMORY` training and `MONITOR_QUERIES` test images) to stay cheap every
few rounds; the final evaluation uses every image.
"""

from __future__ import annotations

import numpy as np
import torch

from silofl.protocols.config import RunConfig
from silofl.protocols.devices import resolve_device
from silofl.protocols.models import set_parameters
from silofl.protocols.ssl_eval import extract_features, knn_accuracy, linear_probe
from silofl.protocols.ssl_models import build_ssl_model, image_shape

MONITOR_MEMORY = 10_000
MONITOR_QUERIES = 2_000


def central_evaluator(config: RunConfig) -> CentralEvaluator | None:
    """The registry's `server_evaluator` of FedSC and FedAvg+SC: the evaluator on the server's labelled data with
    `eval-data central`, None with `none`."""
    return CentralEvaluator(config) if config.eval_data == "central" else None


class CentralEvaluator:
    """kNN monitor and linear probe on the backbone's features of a labelled dataset held by the server."""

    def __init__(self, config: RunConfig) -> None:
        from silofl.client.data.loaders import load_dataset

        data = load_dataset(config.dataset, data_dir=config.data_dir or None, seed=config.seed)
        self.shape = image_shape(data.info.num_features)
        self.num_classes = data.info.num_labels
        self.train_x = torch.from_numpy(data.train.nonsensitive.features).reshape(-1, *self.shape)
        self.train_y = data.train.nonsensitive.labels.astype(np.int64)
        self.test_x = torch.from_numpy(data.test.nonsensitive.features).reshape(-1, *self.shape)
        self.test_y = data.test.nonsensitive.labels.astype(np.int64)
        rng = np.random.default_rng([config.seed, 0xE7A1])
        self.memory = np.sort(rng.choice(len(self.train_y), size=min(MONITOR_MEMORY, len(self.train_y)), replace=False))
        self.queries = np.sort(rng.choice(len(self.test_y), size=min(MONITOR_QUERIES, len(self.test_y)), replace=False))
        self.model = build_ssl_model(
            config.model, self.shape, projection_dim=config.projection_dim, width=config.width, seed=config.seed
        )
        self.config = config
        self.device = resolve_device(config.device)

    def _load(self, arrays) -> torch.nn.Module:
        set_parameters(self.model, arrays)
        return self.model.to(self.device)

    def monitor(self, arrays) -> dict[str, float]:
        """kNN accuracy of a test subset against a training subset (the paper's kNN monitor)."""
        model = self._load(arrays)
        memory = extract_features(model, self.train_x[self.memory])
        queries = extract_features(model, self.test_x[self.queries])
        acc = knn_accuracy(
            memory,
            self.train_y[self.memory],
            queries,
            self.test_y[self.queries],
            self.num_classes,
            k=self.config.knn_k,
            tau=self.config.knn_tau,
        )
        return {"knn_accuracy": float(acc)}

    def final(self, arrays) -> dict[str, float]:
        """Linear probe (the headline `accuracy`) and kNN accuracy on the whole train/test split."""
        model = self._load(arrays)
        train = extract_features(model, self.train_x)
        test = extract_features(model, self.test_x)
        probe = linear_probe(
            train,
            self.train_y,
            test,
            self.test_y,
            self.num_classes,
            epochs=self.config.probe_epochs,
            seed=self.config.seed,
        )
        knn = knn_accuracy(
            train, self.train_y, test, self.test_y, self.num_classes, k=self.config.knn_k, tau=self.config.knn_tau
        )
        return {
            "accuracy": float(probe.accuracy),
            "error": 1.0 - float(probe.accuracy),
            "probe_train_accuracy": float(probe.train_accuracy),
            "knn_accuracy": float(knn),
        }
