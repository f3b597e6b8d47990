"""Representation models for federated spectral contrastive learning (FedSC): a backbone plus a projector.

The paper's representation ``z(x; theta) in R^H`` (Section 3, the SC objective) is the
projector's output; the linear probe and the kNN monitor read the backbone's features instead (Section 7.1; the usual
SimCLR/SC protocol). :func:`build_ssl_model` builds the two architectures silofl supports, or wraps a user's backbone
(``module:factory``, `protocols.ssl_encoder`) with the same projector:

* ``"resnet20"``: the CIFAR ResNet-20 of He et al. (2016, Section 4.2): a 3x3 stem, then 3 stages of 3 basic blocks
  with ``16, 32, 64`` channels (times ``width``), strides 1, 2, 2, global average pooling. ``width=8`` gives the
  512-dimensional backbone output of the paper's "modified ResNet20" (Section 7.1, "Models"; spec "Experiments"). When
  a stage changes shape, the shortcut is a 1x1 strided convolution plus normalization (He et al.'s option B).
* ``"cnn"``: a small 3-block CNN for 28x28 (MNIST, Fashion-MNIST) and 8x8 (digits) images that trains in reasonable
  time on one CPU core; blocks of 32, 64, 128 channels (times ``width``), the last two with stride 2.

Both use the paper's projector shape, ``Linear(F, 2F) - ReLU - Linear(2F, H)`` (512 -> 1024 -> 512 at full scale).

Normalization is GroupNorm (Wu & He, 2018), never BatchNorm, for two reasons. (1) A federated model's state must be
exactly its parameters (``protocols.models.parameter_spec`` and the wire format send ``state_dict`` entries, and FedAvg
averages them): BatchNorm's running mean/variance are buffers, not parameters, and averaging statistics of clients
that each hold one class does not give the statistics of the union. (2) BatchNorm is known to fail under label skew:
its per-batch statistics differ from client to client, and Hsieh et al. (2020, "The non-IID data quagmire") show it
breaks decentralized training on class-partitioned data, where GroupNorm recovers most of the accuracy. In contrastive
learning BatchNorm also leaks information between the samples of a batch. GroupNorm normalizes each sample on its own
and has only affine parameters, so these models have no buffers at all (tested).

Initialization is a deterministic function of ``seed`` through a private ``torch.Generator``; modules are constructed
inside ``torch.random.fork_rng`` so that building a model never moves the global RNG (the convention of
``protocols.models.build_model``): the server and every silo get identical weights from the same seed.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from silofl.protocols.model_names import is_custom_model

__all__ = [
    "SSL_MODEL_KINDS",
    "SSLModel",
    "build_ssl_model",
    "feature_dim",
    "image_shape",
]

SSL_MODEL_KINDS: tuple[str, ...] = ("cnn", "resnet20")

#: Flattened record width -> image shape (C, H, W). Records are flattened: CIFAR channel-major (as its python batches
#: store them: 1024 red, 1024 green, 1024 blue values, each row-major), MNIST/digits row-major with one channel, so
#: ``features.reshape(n, C, H, W)`` recovers the images in both cases.
_IMAGE_SHAPES: dict[int, tuple[int, int, int]] = {
    784: (1, 28, 28),
    3072: (3, 32, 32),
    64: (1, 8, 8),
}

_MAX_GROUPS = 8  # GroupNorm groups: gcd(channels, 8); 2+ channels per group for every width


def image_shape(num_features: int) -> tuple[int, int, int]:
    """The (C, H, W) shape of a flattened image record: 784 -> (1, 28, 28), 3072 -> (3, 32, 32), 64 -> (1, 8, 8)."""
    if isinstance(num_features, bool) or not isinstance(num_features, (int, np.integer)):
        raise ValueError(f"num_features must be an integer, got {num_features!r}")
    shape = _IMAGE_SHAPES.get(int(num_features))
    if shape is None:
        known = ", ".join(f"{n} -> {s}" for n, s in _IMAGE_SHAPES.items())
        raise ValueError(
            f"num_features={num_features} is not a known image size ({known}); the SSL models need an image dataset "
            "(mnist, fashion-mnist, digits or cifar10)"
        )
    return shape


def _check_shape(shape: object) -> tuple[int, int, int]:
    if (
        not isinstance(shape, (tuple, list))
        or len(shape) != 3
        or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in shape)
    ):
        raise ValueError(
            f"image_shape must be (channels, height, width) with positive integers, got {shape!r}; "
            "use image_shape(num_features)"
        )
    return (int(shape[0]), int(shape[1]), int(shape[2]))


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, _MAX_GROUPS), channels)


def _conv_block(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        _norm(out_channels),
        nn.ReLU(),
    )


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-GN-ReLU-conv3x3-GN plus the shortcut, then ReLU (He et al., 2016)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = _norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), _norm(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _cnn_backbone(channels: int, width: int) -> tuple[nn.Module, int]:
    c1, c2, c3 = 32 * width, 64 * width, 128 * width
    body = nn.Sequential(
        _conv_block(channels, c1, stride=1),
        _conv_block(c1, c2, stride=2),
        _conv_block(c2, c3, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    return body, c3


def _resnet20_backbone(channels: int, width: int) -> tuple[nn.Module, int]:
    widths = (16 * width, 32 * width, 64 * width)
    layers: list[nn.Module] = [_conv_block(channels, widths[0], stride=1)]
    in_channels = widths[0]
    for stage, out_channels in enumerate(widths):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(in_channels, out_channels, stride))
            in_channels = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers), widths[-1]


class SSLModel(nn.Module):
    """Backbone + projector. ``forward(x)`` is the representation z (dim H), ``features(x)`` the backbone output.

    ``x`` is a float batch ``(N, C, H, W)`` with the model's channel count; a flattened batch ``(N, C*H*W)`` in the
    record layout (see :func:`image_shape`) is reshaped. Parameters are named ``backbone.*`` and ``projector.*``.
    """

    def __init__(
        self, backbone: nn.Module, projector: nn.Module, feature_dim: int, image_shape: tuple[int, int, int]
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.feature_dim = feature_dim
        self.image_shape = image_shape

    def _as_images(self, x: torch.Tensor) -> torch.Tensor:
        channels, height, width = self.image_shape
        if x.dim() == 2 and x.shape[1] == channels * height * width:
            return x.reshape(x.shape[0], channels, height, width)
        if x.dim() != 4 or x.shape[1] != channels:
            raise ValueError(
                f"input has shape {tuple(x.shape)}; the model expects images (N, {channels}, H, W) or flattened "
                f"records (N, {channels * height * width})"
            )
        return x

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone features ``(N, feature_dim)``: what the linear probe and the kNN monitor use."""
        return self.backbone(self._as_images(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The representation ``z(x; theta)`` ``(N, H)`` of the SC objective (paper Section 3)."""
        return self.projector(self.features(x))


def _initialize(model: nn.Module, generator: torch.Generator) -> None:
    """Kaiming-normal convolutions (fan-out, as torchvision's ResNets), GroupNorm (1, 0), PyTorch-default Linear."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu", generator=generator)
            elif isinstance(module, nn.GroupNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)
                nn.init.uniform_(module.weight, -bound, bound, generator=generator)
                nn.init.uniform_(module.bias, -bound, bound, generator=generator)


def build_ssl_model(
    kind: str, image_shape: tuple[int, int, int], *, projection_dim: int = 128, width: int = 1, seed: int = 0
) -> SSLModel:
    """Build a float32 :class:`SSLModel` for images of ``image_shape`` (C, H, W).

    kind: ``"cnn"`` (feature dim ``128 * width``), ``"resnet20"`` (feature dim ``64 * width``; ``width=8`` is the
    paper's 512) or a user's ``"module:factory"``, whose ``factory(image_shape)`` returns the backbone (feature dim
    measured on a probe batch; ``width`` does not apply; `protocols.ssl_encoder`, docs/CUSTOM_MODEL.md).
    projection_dim: H, the size of the representation z (the paper: 512). seed: initialization seed; the same seed
    gives identical weights and the global RNG is left untouched.
    """
    custom = is_custom_model(kind)
    if not custom and kind not in SSL_MODEL_KINDS:
        raise ValueError(f"kind must be one of {SSL_MODEL_KINDS} or MODULE:FACTORY, got {kind!r}")
    shape = _check_shape(image_shape)
    projection_dim = _check_int("projection_dim", projection_dim, 1)
    width = _check_int("width", width, 1)
    seed = _check_int("seed", seed, 0)
    if custom:
        return _with_projector(kind, shape, projection_dim, seed)
    with torch.random.fork_rng(devices=[]):  # default inits below would otherwise consume the global RNG
        make = _cnn_backbone if kind == "cnn" else _resnet20_backbone
        backbone, dim = make(shape[0], width)
        projector = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, projection_dim))
        model = SSLModel(backbone, projector, dim, shape)
    _initialize(model, torch.Generator().manual_seed(seed))
    return model.float()


def _with_projector(kind: str, shape: tuple[int, int, int], projection_dim: int, seed: int) -> SSLModel:
    """A user's backbone (`protocols.ssl_encoder.build_backbone`: ``factory(shape)``, its weights the factory's under
    torch's global RNG seeded by `seed`) with silofl's projector ``Linear(D, 2D) - ReLU - Linear(2D, H)``, initialised
    as the built-in models' projector (PyTorch-default Linear from a private generator seeded by `seed`)."""
    from silofl.protocols.ssl_encoder import build_backbone  # imports the user's module: only for MODULE:FACTORY

    backbone, dim = build_backbone(kind, shape, seed=seed)
    with torch.random.fork_rng(devices=[]):
        projector = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, projection_dim))
    _initialize(projector, torch.Generator().manual_seed(seed))
    return SSLModel(backbone, projector.float(), dim, shape)


def feature_dim(model: nn.Module) -> int:
    """Dimension of the backbone features of an :class:`SSLModel` (the linear probe's input size)."""
    if not isinstance(model, SSLModel):
        raise ValueError(f"model must be an SSLModel built by build_ssl_model, got {type(model).__name__}")
    return model.feature_dim
