"""One training round on a silo, per algorithm: what the ClientApp runs for a `train` message.

Each module defines `train_round(model, silo, instruction, context, message) -> (arrays, report)`: `model` already
holds the server's parameters, `arrays` maps the reply's record names to named numpy arrays, `report` is the public
:class:`~protocols.messages.TrainReport`. `train_round.extra_records` names the records the train message carries
besides the model and the instruction. This layer uses Flower's `Context` (the silo's persistent state: privacy plan,
ledger) and the pure computations in `client.algorithms`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from flwr.app import Context, Message
from torch import nn

from silofl.client.data.tabular import SiloData
from silofl.protocols.messages import TrainInstruction, TrainReport

RoundResult = tuple[dict[str, dict[str, np.ndarray]], TrainReport]


class RoundFunction(Protocol):
    extra_records: frozenset[str]
    needs_model: bool  # False: the round reads the model arrays itself (e.g. float64 query points), model=None

    def __call__(
        self, model: nn.Module, silo: SiloData, instr: TrainInstruction, context: Context, message: Message
    ) -> RoundResult: ...


def with_records(*names: str, model: bool = True) -> Callable[[Callable[..., RoundResult]], RoundFunction]:
    """Declare the extra records a round function's train message carries, and whether it wants the torch model."""

    def mark(fn: Callable[..., RoundResult]) -> RoundFunction:
        fn.extra_records = frozenset(names)  # type: ignore[attr-defined]
        fn.needs_model = model  # type: ignore[attr-defined]
        return fn  # type: ignore[return-value]

    return mark
