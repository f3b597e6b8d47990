"""A tabular model behind a module that is not one, for tests that compare silofl's fast routes for its own models
(`protocols.models.TabularModel`: the Linear-stack and closed-form head routes) with the generic torch.func route."""

from __future__ import annotations

import torch


class NotTabular(torch.nn.Module):
    """Same function and parameter order as the wrapped model, but not a TabularModel: forces the torch.func route."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)
