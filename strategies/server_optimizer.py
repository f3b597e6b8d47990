"""How the FedSC server turns the silos' models into the next global model: their mean (FedAvg, the FedSC paper's
Algorithm 1) or an Adam step on the mean update (FedAdam: Reddi et al. 2021, "Adaptive Federated Optimization",
Algorithm 2).

FedAdam treats ``Delta_t = mean_j(theta_j) - theta_{t-1}`` (the n_j-weighted mean of the participants' local
displacements) as a negative pseudo-gradient and updates the global model with Adam. With one local SGD step per
round, ``-Delta_t / lr_local`` is the participants' mean minibatch gradient, which for FedSC is a stochastic gradient of
the global spectral contrastive loss (eq. 6), so FedSC + FedAdam is Adam on the global objective; FedAvg+SC + FedAdam is
Adam on the sum of the per-silo objectives. Adam's per-parameter step sizes are what made central training on the
global loss progress within a CPU budget (docs/results/fedsc_objective_gap.md: Adam reaches in 600 steps what SGD does
not).

The Adam itself is ``torch.optim.Adam`` (defaults betas (0.9, 0.999), eps 1e-8, with bias correction; Reddi et al.
use a larger eps "tau" without bias correction, a detail we do not follow) over float32 copies of the parameters,
with ``Delta_t`` in the ``.grad`` slots. Its state (each parameter's moments and step count) goes into the server's
checkpoint (:meth:`ServerOptimizer.state_arrays`, :meth:`ServerOptimizer.restore`; server/checkpoint.py), so that a
resumed run takes the same steps as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

Arrays = Mapping[str, np.ndarray]

SERVER_OPTIMIZERS = ("avg", "adam")
#: What torch's Adam keeps per parameter (no amsgrad): its step count (a float32 scalar) and its two moments.
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")


class ServerOptimizer:
    """``step(current, mean, lr)`` -> the next global model (float32 arrays, same names and shapes)."""

    def __init__(self, kind: Literal["avg", "adam"]) -> None:
        if kind not in SERVER_OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {SERVER_OPTIMIZERS}, got {kind!r}")
        self.kind = kind
        self._params: dict[str, torch.Tensor] = {}
        self._adam: torch.optim.Adam | None = None

    def step(self, current: Arrays, mean: Arrays, lr: float) -> dict[str, np.ndarray]:
        if self.kind == "avg":
            return {name: np.asarray(value, dtype=np.float32) for name, value in mean.items()}
        if set(current) != set(mean):
            raise ValueError(f"server optimizer: the mean update names {sorted(mean)}, the model {sorted(current)}")
        if self._adam is None:
            self._params = {
                name: torch.tensor(np.asarray(value, dtype=np.float32), requires_grad=True)
                for name, value in current.items()
            }
            self._adam = torch.optim.Adam(list(self._params.values()), lr=lr)
        with torch.no_grad():
            for name, param in self._params.items():
                param.copy_(torch.from_numpy(np.asarray(current[name], dtype=np.float32)))
                delta = np.asarray(current[name], dtype=np.float64) - np.asarray(mean[name], dtype=np.float64)
                param.grad = torch.from_numpy(delta.astype(np.float32))
        for group in self._adam.param_groups:
            group["lr"] = lr
        self._adam.step()
        return {name: param.detach().numpy().copy() for name, param in self._params.items()}

    # -- checkpoints --------------------------------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Adam's state as float32 arrays ``{step,exp_avg,exp_avg_sq}.NAME`` (copies); empty for "avg" and before
        Adam's first step (the next step then starts Adam afresh, as in an uninterrupted run)."""
        if self._adam is None:
            return {}
        return {
            f"{key}.{name}": self._adam.state[param][key].detach().numpy().copy()
            for name, param in self._params.items()
            for key in ADAM_STATE
        }

    def restore(self, arrays: Mapping[str, np.ndarray], spec: Sequence[tuple[str, tuple[int, ...]]]) -> None:
        """Put back :meth:`state_arrays` for a model of `spec` (parameter names and shapes); ValueError naming the
        array if they do not fit it (another model, another optimizer)."""
        if not arrays:
            self._params, self._adam = {}, None
            return
        if self.kind != "adam":
            raise ValueError(f"server optimizer {self.kind!r} keeps no state, but the checkpoint holds Adam's")
        expected = {
            f"{key}.{name}": (() if key == "step" else tuple(shape)) for name, shape in spec for key in ADAM_STATE
        }
        if set(arrays) != set(expected):
            raise ValueError(
                f"the checkpoint's Adam state holds {sorted(arrays)}, Adam over this model keeps {sorted(expected)}"
            )
        for key, shape in expected.items():
            value = arrays[key]
            if value.shape != shape or value.dtype != np.float32:
                raise ValueError(f"Adam state '{key}' is {value.dtype}{value.shape}, expected float32{shape}")
        self._params = {
            name: torch.zeros(tuple(shape), dtype=torch.float32, requires_grad=True) for name, shape in spec
        }
        self._adam = torch.optim.Adam(list(self._params.values()), lr=0.0)  # every step sets its lr
        for name, param in self._params.items():
            self._adam.state[param] = {key: torch.from_numpy(arrays[f"{key}.{name}"].copy()) for key in ADAM_STATE}
