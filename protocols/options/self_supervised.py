"""FedSC and FedAvg-SC, self-supervised learning on images: the backbone, local training, the server's optimizer,
the central evaluation, and FedSC's correlation sharing (DP-CalR)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field

from silofl.protocols.devices import Device
from silofl.protocols.messages import MAX_SERVER_VALUE
from silofl.protocols.model_names import SSL_MODEL_HELP, check_ssl_model_name
from silofl.protocols.options.base import SILO, OptionGroup

#: FedSC's backbone: ``cnn``, ``resnet20`` or a user's encoder ``module:factory`` (`protocols.ssl_encoder`).
SslModelName = Annotated[str, AfterValidator(check_ssl_model_name)]


class SslOptions(OptionGroup):
    """Federated spectral contrastive learning on images: the backbone, local training, the server's optimizer and
    the central evaluation."""

    heading: ClassVar[str] = "self-supervised learning (images)"

    model: SslModelName = Field(default="cnn", max_length=300, description=SSL_MODEL_HELP, json_schema_extra=SILO)
    local_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="minibatch steps per round (batches drawn without replacement, reshuffled when the silo's "
        "records run out); 0: local-epochs passes",
        json_schema_extra=SILO,
    )
    projection_dim: int = Field(
        default=128, ge=1, le=8192, description="dimension H of the representation z", json_schema_extra=SILO
    )
    width: int = Field(
        default=1, ge=1, le=64, description="backbone width multiplier (resnet20 x8: 512-d)", json_schema_extra=SILO
    )
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="local SGD momentum", json_schema_extra=SILO)
    weight_decay: float = Field(default=5e-4, ge=0.0, description="local SGD weight decay", json_schema_extra=SILO)
    grad_clip: float = Field(
        default=3.0, gt=0.0, description="local gradient-norm clip (not a DP clip)", json_schema_extra=SILO
    )
    mu: float = Field(
        default=4.0,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description="representations are clipped to norm sqrt(mu)",
        json_schema_extra=SILO,
    )
    participation: float = Field(
        default=1.0, gt=0.0, le=1.0, description="fraction of silos sampled per round (all in round 1)"
    )
    server_optimizer: Literal["avg", "adam"] = Field(
        default="avg",
        description="'avg' = the new model is the mean of the silos' models (FedAvg, the paper); 'adam' = "
        "Adam at the server on the mean update (FedAdam, Reddi et al. 2021) with server-lr",
    )
    server_lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="learning rate of server-optimizer adam")
    eval_data: Literal["central", "none"] = Field(
        default="central",
        description="'central' = linear probe and kNN on the dataset's train/test split at the server "
        "(the paper's protocol; simulation or a server with its own copy); 'none' = no evaluation",
    )
    device: Device = Field(
        default="cpu",
        description="torch device of silo training and evaluation; auto: cuda if available",
        json_schema_extra=SILO,
    )
    probe_epochs: int = Field(default=30, ge=1, le=10_000, description="linear-probe epochs (Adam 3e-3)")
    knn_k: int = Field(default=200, ge=1, description="neighbours of the kNN monitor")
    knn_tau: float = Field(default=0.1, gt=0.0, description="temperature of the kNN monitor")


class CalrOptions(OptionGroup):
    """FedSC's correlation sharing through DP-CalR and the alpha schedule of its local loss."""

    heading: ClassVar[str] = "correlation sharing (DP-CalR)"

    views: int = Field(
        default=2, ge=1, le=64, description="augmented views per record in DP-CalR", json_schema_extra=SILO
    )
    alpha_start: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="alpha at the first share (paper eq. 80: 1; q_j = 1/num-silos for equal silos is eq. 6's "
        "exact weight)",
    )
    alpha_end: float = Field(
        default=0.2, ge=0.0, le=1.0, description="alpha decays linearly from alpha-start to this (eq. 80)"
    )
    share_start: int = Field(default=1, ge=1, description="first round the silos share correlation matrices")
    share_every: int = Field(default=1, ge=1, description="rounds between two shares")
    stale_shares: Literal["drop", "keep"] = Field(
        default="drop",
        description="with participation < 1, what a participant's Rbar_{-j} is made of: 'drop' = the matrices shared "
        "in the latest sharing round only (the other participants'; measured best, docs/FEDSC.md); 'keep' = every "
        "silo's latest matrix, stale for the silos not sampled (the paper's Algorithm 1, line 17)",
    )
    calr_relation: Literal["replace_one", "add_remove"] = Field(
        default="replace_one", description="neighbouring relation of DP-CalR's sensitivity", json_schema_extra=SILO
    )
    calr_sampling_rate: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="each DP-CalR share uses a Poisson sample of the silo's records at this rate (accounted as "
        "a subsampled Gaussian); 1: every record (the paper)",
        json_schema_extra=SILO,
    )
