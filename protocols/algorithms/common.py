"""What several algorithm entries share: the seeded starting model of the supervised algorithms, and the checks of
the run's model before any round."""

from __future__ import annotations

from typing import Any


def tabular_initial_arrays(config: Any, info: Any) -> Any:
    """The starting parameters of a logistic regression, an MLP or the user's model (`--model module:factory`),
    initialised from the run's seed."""
    from silofl.protocols import messages as msg
    from silofl.protocols.models import build_model, get_parameters

    model = build_model(
        config.model, info.num_features, info.num_labels, hidden=getattr(config, "hidden", 64), seed=config.seed
    )
    return msg.arrays_record(get_parameters(model))


def check_run_model(config: Any, num_features: int, num_labels: int) -> None:
    """Refuse, before any round, a run whose model silofl cannot train: a user's ``module:factory`` that does not
    import, build, return (n, num_labels) float32 logits record by record, or give per-sample gradients
    (`protocols.models.check_model`). ConfigError naming ``--model`` and the fix; nothing for the built-in models
    (and for an algorithm without a `model` option)."""
    from silofl.protocols.config import ConfigError
    from silofl.protocols.model_names import is_custom_model
    from silofl.protocols.models import ModelError, check_model

    kind = getattr(config, "model", "")
    if not is_custom_model(kind):
        return
    try:
        check_model(kind, num_features, num_labels, seed=config.seed)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
