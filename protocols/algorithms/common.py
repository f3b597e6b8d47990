"""What several algorithm entries share: the seeded starting model of the supervised algorithms."""

from __future__ import annotations

from typing import Any


def tabular_initial_arrays(config: Any, info: Any) -> Any:
    """The starting parameters of a logistic regression or MLP, initialised from the run's seed."""
    from protocols import messages as msg
    from protocols.models import build_model, get_parameters

    model = build_model(
        config.model, info.num_features, info.num_labels, hidden=getattr(config, "hidden", 64), seed=config.seed
    )
    return msg.arrays_record(get_parameters(model))
