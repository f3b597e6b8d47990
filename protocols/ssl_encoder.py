"""A user's own image encoder for FedSC and FedAvg+SC (``--model module.path:factory``, docs/CUSTOM_MODEL.md).

The factory is ``factory(image_shape) -> torch.nn.Module`` with ``image_shape = (C, H, W)`` of the run's images; the
module it returns is the **backbone**: images ``(N, C, H, W)`` -> features ``(N, D)``. silofl measures ``D`` on a probe
batch and adds its own projector (`protocols.ssl_models.build_ssl_model`), so the server, every silo, the linear probe,
the kNN monitor and the ONNX export read the encoder as they read ``cnn`` and ``resnet20``.

The factory is imported with `protocols.models.load_factory` (the tabular models' importer) and called with torch's
global RNG seeded from the run's seed and restored afterwards (the tabular convention): the server and every silo build
the same weights, and building never moves the caller's RNG.

What the server checks before any round (:func:`check_encoder`; `protocols.algorithms.common.check_run_model`, from
`silofl run`'s preflight and the ServerApp's setup), and why:

* the structure of `protocols.models.check_model_structure`: float32 parameters, all trainable, a ``state_dict`` that
  holds exactly the parameters (silofl sends and averages parameters only, by name; BatchNorm's running statistics
  are buffers and averaging per-silo statistics of one-class silos is not the union's), no BatchNorm, no Dropout;
* a finite float32 output ``(N, D)``, ``D >= 1``, on a probe batch of the run's image shape (the projector's input);
* a record's features do not depend on the other records of its batch: DP-CalR bounds each record's term of the
  correlation matrix on its own (its sensitivity, FedSC Proposition 6.6), which a batch statistic would break.
"""

from __future__ import annotations

import torch
from torch import nn

from silofl.protocols.models import ModelError, check_model_structure, load_factory

__all__ = ["PROBE_RECORDS", "build_backbone", "check_encoder", "probe_features"]

#: Records of the probe batch the feature dimension is measured on (a fixed draw, no silo's data).
PROBE_RECORDS = 4
_SIGNATURE = "(image_shape)"
_DOC = "docs/CUSTOM_MODEL.md, 'FedSC's encoder'"


def _probe_images(shape: tuple[int, int, int], records: int) -> torch.Tensor:
    """A fixed batch of `records` images in [0, 1] (pixels' range), from a private generator."""
    return torch.rand(records, *shape, generator=torch.Generator().manual_seed(0))


def build_backbone(kind: str, shape: tuple[int, int, int], *, seed: int) -> tuple[nn.Module, int]:
    """``factory(shape)`` of the user's ``module:factory`` with torch's global RNG seeded by `seed` (restored
    afterwards), checked for its structure (:func:`protocols.models.check_model_structure`), and the dimension D of
    its features measured on a probe batch (:func:`probe_features`). ModelError naming ``--model`` otherwise."""
    factory = load_factory(kind, _SIGNATURE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            backbone = factory(shape)
        except Exception as exc:
            raise ModelError(
                f"--model {kind}: {kind}({shape}) raised {type(exc).__name__}: {exc}; FedSC's factory is called with "
                f"the run's image shape (channels, height, width) and returns the backbone ({_DOC})"
            ) from exc
    check_model_structure(kind, backbone)
    return backbone, int(probe_features(kind, backbone, shape).shape[1])


def probe_features(
    kind: str, backbone: nn.Module, shape: tuple[int, int, int], records: int = PROBE_RECORDS
) -> torch.Tensor:
    """The backbone's features of a fixed probe batch of `records` images of `shape`, checked: a finite float32
    tensor ``(records, D)`` with ``D >= 1`` (what the projector and the linear probe read). Runs without gradients
    and without moving torch's global RNG. ModelError naming ``--model``, what it returned and the fix."""
    images = _probe_images(shape, records)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = backbone(images)
    except Exception as exc:
        raise ModelError(
            f"--model {kind}: the encoder fails on a batch of {records} images of shape {shape} (float32, values in "
            f"[0, 1]): {type(exc).__name__}: {exc}; it must map images (N, C, H, W) to features (N, D)"
        ) from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != records or out.shape[1] < 1:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(
            f"--model {kind}: the encoder returns {got} for {records} images of shape {shape}; FedSC needs features "
            f"(N, D) = ({records}, D) with D >= 1: flatten (or pool) its output per image, e.g. end with "
            "nn.Flatten() after nn.AdaptiveAvgPool2d(1)"
        )
    if out.dtype != torch.float32:
        raise ModelError(f"--model {kind}: the encoder returns {out.dtype} features; return float32")
    if not bool(torch.isfinite(out).all()):
        raise ModelError(f"--model {kind}: the encoder returns NaN or inf features at its initial parameters")
    return out


def check_encoder(kind: str, shape: tuple[int, int, int], *, seed: int = 0, probe: int = PROBE_RECORDS) -> int:
    """The server's checks of a user's FedSC encoder before any round (module docstring): it imports, builds, has
    silofl's structure, returns finite float32 features (N, D), and each record's features do not depend on the
    other records of its batch. Returns D. ModelError naming ``--model``, what failed and the fix."""
    backbone, dim = build_backbone(kind, shape, seed=seed)
    batch = probe_features(kind, backbone, shape, probe)
    images = _probe_images(shape, probe)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        single = torch.cat([backbone(images[i : i + 1]) for i in range(probe)])
    if tuple(single.shape) != tuple(batch.shape) or not torch.allclose(single, batch, rtol=1e-4, atol=1e-5):
        raise ModelError(
            f"--model {kind}: a record's features depend on the other records of its batch (encoder(x)[i] differs "
            "from encoder(x[i:i+1])); DP-CalR bounds each record's term of the correlation matrix on its own: "
            "normalize per record (GroupNorm, LayerNorm), never across the batch"
        )
    return dim
