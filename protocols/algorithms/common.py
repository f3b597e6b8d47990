"""What several algorithm entries share: the minibatch algorithms' training defaults, the seeded starting model of
the supervised algorithms, and the checks of the run's model before any round."""

from __future__ import annotations

from typing import Any

#: The SteFFLe sweeps' training setup on Adult (docs/RESULTS.md): 40 epochs, batch 256, lr 0.25 x 0.8 every 10. The
#: defaults of DP-FedSGD, SteFFLe and Tran et al.
MINIBATCH_DEFAULTS = {"epochs": 40.0, "batch-size": 256, "lr": 0.25, "lr-decay": 0.8, "lr-decay-epochs": 10.0}


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
    (`protocols.models.check_model`); for FedSC and FedAvg+SC, a user's encoder that does not return finite float32
    features (n, D) record by record on the run's image shape (`protocols.ssl_encoder.check_encoder`). ConfigError
    naming ``--model`` and the fix; nothing for the built-in models (and for an algorithm without a `model`
    option)."""
    from silofl.protocols.config import ConfigError
    from silofl.protocols.model_names import is_custom_model
    from silofl.protocols.models import ModelError, check_model

    kind = getattr(config, "model", "")
    if not is_custom_model(kind):
        return
    try:
        if _is_ssl(config):
            _check_encoder(config, kind, num_features)
        else:
            check_model(kind, num_features, num_labels, seed=config.seed)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None


def _is_ssl(config: Any) -> bool:
    """Whether the run's algorithm trains an image encoder (its options hold `SslOptions`: FedSC, FedAvg+SC)."""
    from silofl.protocols.options import SslOptions

    spec = getattr(config, "spec", None)
    return spec is not None and any(issubclass(group, SslOptions) for group in spec.options)


def _check_encoder(config: Any, kind: str, num_features: int) -> None:
    """A user's FedSC encoder on the run's image shape (`protocols.ssl_encoder.check_encoder`); ``--width``, which
    only scales the built-in backbones, must stay 1."""
    from silofl.protocols.config import ConfigError
    from silofl.protocols.ssl_encoder import check_encoder
    from silofl.protocols.ssl_models import image_shape

    if getattr(config, "width", 1) != 1:
        raise ConfigError(
            f"--width {config.width} scales the built-in backbones (cnn, resnet20); --model {kind} builds its own "
            "encoder, whose factory sets its size: drop --width"
        )
    try:
        shape = image_shape(num_features)
    except ValueError as exc:
        raise ConfigError(f"--model {kind}: {exc}") from None
    check_encoder(kind, shape, seed=config.seed)
