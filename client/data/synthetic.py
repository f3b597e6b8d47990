"""A small fairness dataset generated in code: the embedded default of `silofl run` and of fast tests.

Generative model (all draws from one `numpy.random.Generator` seeded by `seed`, so the data is a pure function of the
arguments):

* group s ~ Categorical(p) with p proportional to linspace(1.5, 1, num_groups) (groups of unequal size), and a group
  score g = linspace(-1, 1, num_groups)[s];
* age ~ round(Normal(45, 13)) clipped to [18, 90] (raw years: the Algorithm 3 sort key, and also a feature);
* x1 = g + 0.8 * Normal(0, 1): a *proxy* of the group (think of a postcode);
* x2 .. x{d-1} ~ Normal(0, 1); x2..x5 carry label signal (weights 1.5, -1.2, 1.0, 0.6), the rest are noise;
* label y ~ Bernoulli(sigmoid(2 * (0.8 * z_age + w . x + bias * g - 0.4))), z_age the standardized age.

So the label depends on the group directly (strength `bias`), and an unconstrained classifier recovers the group
through the proxy x1. Measured with logistic regression on the test split at the defaults (n=6000, 2 groups,
8 features, bias=1; seeds 0..4, see tests/client/data/test_synthetic.py): accuracy 0.87-0.89 with a demographic-parity
violation of 0.17-0.21; the same model without x1 (a fair classifier: its predictions are independent of s) reaches
0.83-0.86 with a violation of at most 0.02. With bias=0 the label ignores the group and the violation vanishes (< 0.01).

The table goes through the same preprocessing as the real datasets (`generic.build_dataset`), so z-scoring, the
train/test split and the sort key behave identically.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from silofl.client.data.generic import build_dataset, categorical_labels
from silofl.client.data.tabular import DataError, TabularDataset

__all__ = ["SYNTHETIC_LABEL_NAMES", "make_synthetic", "synthetic_frame"]

SYNTHETIC_LABEL_NAMES = ("negative", "positive")
_SIGNAL_WEIGHTS = (1.5, -1.2, 1.0, 0.6)


def synthetic_frame(
    n: int = 6000, *, num_groups: int = 2, num_features: int = 8, seed: int = 0, bias: float = 1.0
) -> pd.DataFrame:
    """The raw synthetic table: columns age, x1..x{num_features-1}, group, label (0/1).

    Groups are named 'g0', 'g1', ... (zero-padded past 10 groups so that name order is group order).
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 8:
        raise DataError(f"n must be an integer >= 8 (enough for a train and a test split), got {n!r}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int | np.integer) or num_groups < 2:
        raise DataError(f"num_groups must be an integer >= 2 (fairness needs two groups), got {num_groups!r}")
    if isinstance(num_features, bool) or not isinstance(num_features, int | np.integer) or num_features < 3:
        raise DataError(
            f"num_features must be an integer >= 3 (age, the group proxy and one signal feature), got {num_features!r}"
        )
    if not np.isfinite(bias):
        raise DataError(f"bias must be a finite number, got {bias!r}")

    rng = np.random.default_rng(seed)
    probs = np.linspace(1.5, 1.0, num_groups)
    groups = rng.choice(num_groups, size=n, p=probs / probs.sum())
    score = np.linspace(-1.0, 1.0, num_groups)[groups]
    age = np.clip(np.round(rng.normal(45.0, 13.0, size=n)), 18.0, 90.0)
    x = rng.normal(size=(n, num_features - 1))
    x[:, 0] = score + 0.8 * x[:, 0]
    weights = np.zeros(num_features - 1)
    k = min(len(_SIGNAL_WEIGHTS), num_features - 2)
    weights[1 : 1 + k] = _SIGNAL_WEIGHTS[:k]
    logit = 0.8 * (age - 45.0) / 13.0 + x @ weights + bias * score - 0.4
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-2.0 * logit))).astype(np.int64)

    frame = pd.DataFrame({"age": age})
    for j in range(num_features - 1):
        frame[f"x{j + 1}"] = x[:, j]
    width = len(str(num_groups - 1))  # zero-pad so that name order equals group order ("g01" < "g10")
    frame["group"] = [f"g{k:0{width}d}" for k in groups]
    frame["label"] = labels
    return frame


def make_synthetic(
    n: int = 6000,
    *,
    num_groups: int = 2,
    num_features: int = 8,
    seed: int = 0,
    bias: float = 1.0,
    test_fraction: float = 0.25,
) -> TabularDataset:
    """The synthetic fairness dataset, split train/test by `seed` (see the module docstring for the model).

    Sensitive column 'group' (groups 'g0', 'g1', ...), labels ('negative', 'positive'), sort key: age in years.
    """
    frame = synthetic_frame(n, num_groups=num_groups, num_features=num_features, seed=seed, bias=bias)
    return build_dataset(
        frame,
        name="synthetic",
        target="label",
        sensitive=["group"],
        sort_key="age",
        seed=seed,
        test_fraction=test_fraction,
        label_encoder=categorical_labels(classes=[0, 1], names=SYNTHETIC_LABEL_NAMES),
    )
