"""Small user models for the tests of `--model module:factory` (docs/CUSTOM_MODEL.md): what a user would write.

The tabular factories have the signature silofl calls, ``factory(num_features, num_labels) -> torch.nn.Module``, and
return logits ``(n, num_labels)``; FedSC's encoders (the ``*encoder*`` factories below) are ``factory(image_shape)``
and return a backbone from images ``(N, C, H, W)`` to features ``(N, D)``.
"""

from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    """Two Linear layers with a LayerNorm between them (the example of docs/CUSTOM_MODEL.md)."""

    def __init__(self, num_features: int, num_labels: int, hidden: int = 16) -> None:
        super().__init__()
        self.inner = nn.Linear(num_features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.inner(x))))


def tiny(num_features: int, num_labels: int) -> nn.Module:
    """The documented example: Linear -> LayerNorm -> ReLU -> Linear, 16 hidden units."""
    return Tiny(num_features, num_labels)


def with_batchnorm(num_features: int, num_labels: int) -> nn.Module:
    """A model silofl must refuse: BatchNorm mixes the records of a batch (no per-sample gradients)."""
    return nn.Sequential(nn.Linear(num_features, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_labels))


def batch_mixing(num_features: int, num_labels: int) -> nn.Module:
    """A model without any BatchNorm layer or buffer whose output still depends on the other records of the batch
    (it subtracts the batch mean): refused by the server's record-by-record check."""

    class Centred(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(num_features, num_labels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x - x.mean(dim=0, keepdim=True))

    return Centred()


def one_logit(num_features: int, num_labels: int) -> nn.Module:
    """A binary model written as one output (BCE style): refused, silofl's loss reads (n, num_labels) logits."""
    return nn.Linear(num_features, 1)


def float64(num_features: int, num_labels: int) -> nn.Module:
    """A model in float64: refused (updates are float32 on the wire)."""
    return nn.Linear(num_features, num_labels).double()


NOT_A_FACTORY = 3


class LogregTwin(nn.Module):
    """silofl's binary logistic regression written as a user would: one Linear output z, logits [0, z]. Its
    parameters have the built-in model's names, so the two can hold the same weights (tests compare the maths of
    the built-in model's closed-form routes with the torch.func route a user's model takes)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.head = nn.Linear(num_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.head(x)
        return torch.cat([torch.zeros_like(z), z], dim=-1)


def logreg_twin(num_features: int, num_labels: int) -> nn.Module:
    if num_labels != 2:
        raise ValueError("logreg_twin is a binary model")
    return LogregTwin(num_features)


# -- FedSC encoders: factory(image_shape) -> backbone, images (N, C, H, W) -> features (N, D) -------------------------


def small_encoder(image_shape: tuple[int, int, int]) -> nn.Module:
    """The documented FedSC encoder (docs/CUSTOM_MODEL.md): two convolutions with GroupNorm, pooled to 16 features."""
    channels = image_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.GroupNorm(4, 8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.GroupNorm(4, 16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )


class _Encoder(nn.Module):
    """A 1x1 convolution, then `post` on its output: the refused encoders below differ in `post` only."""

    def __init__(self, channels: int, post) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 2, 1)
        self.post = post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.conv(x))


def encoder_with_batchnorm(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: BatchNorm mixes the records of a batch and keeps running statistics (buffers)."""
    return nn.Sequential(nn.Conv2d(image_shape[0], 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def encoder_batch_mixing(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: no BatchNorm, but it subtracts the batch mean, so a record's features depend on the others."""
    return _Encoder(image_shape[0], lambda h: (h - h.mean(dim=0, keepdim=True)).flatten(1))


def encoder_4d(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: returns feature maps (N, 2, H, W), not features (N, D)."""
    return _Encoder(image_shape[0], lambda h: h)


def encoder_nan(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: its features are NaN."""
    return _Encoder(image_shape[0], lambda h: h.flatten(1) * float("nan"))


def encoder_float64(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: float64 parameters (updates are float32 on the wire)."""
    return _Encoder(image_shape[0], lambda h: h.flatten(1)).double()


def encoder_frozen(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: a frozen parameter would still be sent and averaged."""
    model = _Encoder(image_shape[0], lambda h: h.flatten(1))
    model.conv.bias.requires_grad_(False)
    return model


def encoder_not_a_module(image_shape: tuple[int, int, int]) -> object:
    """Refused: a factory must return a torch.nn.Module."""
    return lambda x: x.flatten(1)


def encoder_raises(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: the factory fails (it expects another image size)."""
    raise ValueError(f"this encoder is for 32x32 images, got {image_shape}")


def encoder_with_buffer(image_shape: tuple[int, int, int]) -> nn.Module:
    """Refused: a persistent buffer would be in the state_dict but never sent or averaged."""
    model = _Encoder(image_shape[0], lambda h: h.flatten(1))
    model.register_buffer("scale", torch.ones(1))
    return model
