"""How a run names its supervised model: a built-in architecture, or a user's factory as ``module.path:factory``.

Pure and light (no torch): the run options (`protocols.options`) and the message schemas (`protocols.messages`)
validate names with it, and a deployed ClientApp, a fresh process per message, imports it on every message.

* ``logreg`` and ``mlp`` are silofl's own models (`protocols.models.build_model`);
* ``cnn`` and ``resnet20`` are FedSC's backbones (`protocols.ssl_models`); there ``module.path:factory`` names a
  function ``factory(image_shape) -> torch.nn.Module``, the user's backbone (`protocols.ssl_encoder`);
* ``module.path:factory`` names a function ``factory(num_features: int, num_labels: int) -> torch.nn.Module``
  importable as ``module.path`` wherever the model is built: at the server (its starting weights and the checks of
  `protocols.models.check_model`) and at every silo (docs/CUSTOM_MODEL.md). Only the form is checked here; nothing is
  imported. A deployed silo imports such a module only when its operator allows it (policy key ``model-modules``,
  `client.silo_policy.check_model`): a server that could name any importable module would make the silo run it.
"""

from __future__ import annotations

import re

#: silofl's own tabular models.
MODEL_KINDS: tuple[str, ...] = ("logreg", "mlp")
#: The self-supervised backbones (FedSC, FedAvg+SC), which a federated evaluation never names.
SSL_KINDS: tuple[str, ...] = ("cnn", "resnet20")

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``package.module:function``: a dotted module path, a colon, one attribute name.
CUSTOM_MODEL = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}")
#: The flag's description, shared by the run option and the errors.
MODEL_HELP = (
    "logreg (logistic regression), mlp (one hidden layer of `hidden` units), or your own torch model as "
    "MODULE:FACTORY, a function FACTORY(num_features, num_labels) -> torch.nn.Module importable at the server and at "
    "every silo (docs/CUSTOM_MODEL.md; a deployed silo imports it only if its policy lists the module in "
    "model-modules)"
)

#: The self-supervised algorithms' flag description.
SSL_MODEL_HELP = (
    "backbone: cnn (28x28 and 8x8 images), resnet20 (CIFAR-10), or your own encoder as MODULE:FACTORY, a function "
    "FACTORY(image_shape) -> torch.nn.Module mapping images (N, C, H, W) to features (N, D), importable at the server "
    "and at every silo (docs/CUSTOM_MODEL.md)"
)


def is_custom_model(kind: str) -> bool:
    """Whether `kind` names a user's factory (``module:factory``) rather than a built-in model."""
    return isinstance(kind, str) and CUSTOM_MODEL.fullmatch(kind) is not None


def model_module(kind: str) -> str:
    """The module a custom model's name imports (``mypkg.models`` of ``mypkg.models:tiny``)."""
    if not is_custom_model(kind):
        raise ValueError(f"{kind!r} is not a custom model name (MODULE:FACTORY)")
    return kind.partition(":")[0]


def check_tabular_model_name(value: str) -> str:
    """The `model` option of the supervised tabular algorithms: a built-in model or ``module:factory``."""
    if value in MODEL_KINDS or is_custom_model(value):
        return value
    raise ValueError(
        f"{value!r} is neither a built-in model ({', '.join(MODEL_KINDS)}) nor MODULE:FACTORY (e.g. "
        "mypkg.models:tiny, a function (num_features, num_labels) -> torch.nn.Module; docs/CUSTOM_MODEL.md)"
    )


def check_ssl_model_name(value: str) -> str:
    """The `model` option of FedSC and FedAvg+SC: a built-in backbone or a user's encoder ``module:factory``, a
    function ``factory(image_shape) -> torch.nn.Module`` (`protocols.ssl_encoder`)."""
    if value in SSL_KINDS or is_custom_model(value):
        return value
    raise ValueError(
        f"{value!r} is neither a built-in backbone ({', '.join(SSL_KINDS)}) nor MODULE:FACTORY (e.g. "
        "mypkg.encoders:small, a function (image_shape) -> torch.nn.Module mapping images (N, C, H, W) to features "
        "(N, D); docs/CUSTOM_MODEL.md)"
    )


def check_evaluated_model_name(value: str) -> str:
    """The `model` of an evaluate instruction: a tabular model's name, or a self-supervised backbone's."""
    if value in SSL_KINDS:
        return value
    return check_tabular_model_name(value)
