"""How a silo trains a supervised model on feature vectors: the model, the torch device, minibatch SGD, the
learning-rate schedule and local epochs."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field

from silofl.protocols.devices import Device
from silofl.protocols.model_names import MODEL_HELP, check_tabular_model_name
from silofl.protocols.options.base import SILO, OptionGroup

#: A tabular model's name: ``logreg``, ``mlp`` or a user's ``module:factory`` (`protocols.model_names`). A type, not a
#: validator of the group, so that the train instruction's copy of the field checks it too.
TabularModelName = Annotated[str, AfterValidator(check_tabular_model_name)]


class TabularModelOptions(OptionGroup):
    """A supervised model on feature vectors: silofl's own or the user's (docs/CUSTOM_MODEL.md)."""

    heading: ClassVar[str] = "model"

    model: TabularModelName = Field(default="logreg", max_length=300, description=MODEL_HELP, json_schema_extra=SILO)
    hidden: int = Field(default=64, ge=1, le=65536, description="hidden units of model mlp", json_schema_extra=SILO)


class DeviceOptions(OptionGroup):
    """Where the silos' torch maths run (`protocols.devices`)."""

    heading: ClassVar[str] = "hardware"

    device: Device = Field(
        default="cpu",
        description="torch device of the silos' model, per-sample gradients and sums (the noise is drawn on the CPU "
        "from the silo's seeded generator, so cpu gives the same numbers as before); auto: cuda where the silo "
        "sees a GPU, else cpu; cuda is refused on a machine without one. mu2fl and noisy-sgd compute with numpy on "
        "the CPU and have no device option",
        json_schema_extra=SILO,
    )


class SgdOptions(OptionGroup):
    """Minibatch SGD at the silos: the batch and the learning rate."""

    heading: ClassVar[str] = "minibatch SGD"

    batch_size: int = Field(
        default=256,
        ge=1,
        description="expected records per silo per step (Poisson rate m / n_j)",
        json_schema_extra=SILO,
    )
    lr: float = Field(default=0.5, gt=0.0, le=1e4, description="learning rate", json_schema_extra=SILO)


class LrDecayOptions(OptionGroup):
    """A step-decay schedule of the server's learning rate."""

    heading: ClassVar[str] = "learning-rate schedule"

    lr_decay: float = Field(default=1.0, gt=0.0, le=1.0, description="factor applied every lr-decay-epochs")
    lr_decay_epochs: float = Field(default=0.0, ge=0.0, description="0: constant learning rate")


class LocalEpochsOptions(OptionGroup):
    """Local passes over a silo's data per round (FedAvg-style algorithms)."""

    heading: ClassVar[str] = "local training"

    local_epochs: int = Field(default=1, ge=1, le=1000, description="local passes per round", json_schema_extra=SILO)
