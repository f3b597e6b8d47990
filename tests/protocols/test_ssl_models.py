"""Tests for protocols/ssl_models.py: shapes, the paper's ResNet-20 / projector sizes, no buffers, seeded init."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from silofl.protocols.models import get_parameters, parameter_spec, set_parameters
from silofl.protocols.ssl_models import SSLModel, build_ssl_model, feature_dim, image_shape


def test_image_shape_of_flattened_records() -> None:
    assert image_shape(784) == (1, 28, 28)
    assert image_shape(3072) == (3, 32, 32)
    assert image_shape(64) == (1, 8, 8)
    assert image_shape(np.int64(784)) == (1, 28, 28)
    with pytest.raises(ValueError, match="num_features=785 is not a known image size"):
        image_shape(785)
    with pytest.raises(ValueError, match="num_features must be an integer"):
        image_shape(784.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "shape", "width", "dim"),
    [
        ("cnn", (1, 28, 28), 1, 128),
        ("cnn", (1, 8, 8), 2, 256),
        ("resnet20", (3, 32, 32), 1, 64),
        ("resnet20", (1, 28, 28), 2, 128),
    ],
)
def test_output_shapes(kind: str, shape: tuple[int, int, int], width: int, dim: int) -> None:
    model = build_ssl_model(kind, shape, projection_dim=16, width=width, seed=0)
    x = torch.rand(3, *shape)
    assert feature_dim(model) == dim
    assert model.features(x).shape == (3, dim)
    assert model(x).shape == (3, 16)
    # forward is projector(backbone(x)), and flattened records in the dataset layout give the same result.
    torch.testing.assert_close(model(x), model.projector(model.backbone(x)))
    torch.testing.assert_close(model(x.reshape(3, -1)), model(x))


def test_paper_resnet20_width8_has_512_features_and_the_papers_projector() -> None:
    model = build_ssl_model("resnet20", (3, 32, 32), projection_dim=512, width=8)
    spec = dict(parameter_spec(model))
    assert feature_dim(model) == 512
    # Linear(512, 1024) - ReLU - Linear(1024, 512) (spec "Experiments").
    assert spec["projector.0.weight"] == (1024, 512) and spec["projector.2.weight"] == (512, 1024)
    convs = [m for m in model.backbone.modules() if isinstance(m, nn.Conv2d)]
    # ResNet-20: 1 stem conv + 3 stages x 3 blocks x 2 convs = 19 3x3 convs (+ the final layer = 20), 2 projection
    # shortcuts where a stage halves the resolution; stage widths 128, 256, 512.
    assert sum(c.kernel_size == (3, 3) for c in convs) == 19
    assert [c.out_channels for c in convs if c.kernel_size == (1, 1)] == [256, 512]
    assert sorted({c.out_channels for c in convs}) == [128, 256, 512]


def test_no_buffers_no_batchnorm_and_state_is_exactly_the_parameters() -> None:
    for kind in ("cnn", "resnet20"):
        model = build_ssl_model(kind, (3, 32, 32))
        assert list(model.buffers()) == []
        assert list(model.state_dict()) == [name for name, _ in model.named_parameters()]
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        assert any(isinstance(m, nn.GroupNorm) for m in model.modules())


def test_each_sample_is_normalized_on_its_own() -> None:
    # GroupNorm, unlike BatchNorm, makes a sample's output independent of the rest of the batch, in train mode too.
    model = build_ssl_model("resnet20", (3, 32, 32), projection_dim=8).train()
    x = torch.rand(4, 3, 32, 32)
    torch.testing.assert_close(model(x)[:1], model(x[:1]), rtol=1e-4, atol=1e-5)


def test_seeded_initialization_and_global_rng_untouched() -> None:
    state = torch.get_rng_state()
    a = get_parameters(build_ssl_model("cnn", (1, 28, 28), seed=3))
    b = get_parameters(build_ssl_model("cnn", (1, 28, 28), seed=3))
    c = get_parameters(build_ssl_model("cnn", (1, 28, 28), seed=4))
    assert torch.equal(torch.get_rng_state(), state)
    assert list(a) == list(b)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["backbone.0.0.weight"], c["backbone.0.0.weight"])
    assert not np.array_equal(a["projector.2.weight"], c["projector.2.weight"])


def test_parameters_round_trip_through_the_silofl_helpers() -> None:
    source = build_ssl_model("resnet20", (1, 8, 8), projection_dim=8, seed=1)
    target = build_ssl_model("resnet20", (1, 8, 8), projection_dim=8, seed=2)
    x = torch.rand(2, 1, 8, 8)
    assert not torch.allclose(source(x), target(x))
    set_parameters(target, get_parameters(source))
    torch.testing.assert_close(target(x), source(x))


def test_every_parameter_gets_a_gradient() -> None:
    model = build_ssl_model("cnn", (1, 8, 8), projection_dim=4)
    model(torch.rand(5, 1, 8, 8)).square().mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        build_ssl_model("vit", (1, 28, 28))
    with pytest.raises(ValueError, match="image_shape must be"):
        build_ssl_model("cnn", (28, 28))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width must be an integer >= 1"):
        build_ssl_model("cnn", (1, 28, 28), width=0)
    with pytest.raises(ValueError, match="projection_dim must be an integer >= 1"):
        build_ssl_model("cnn", (1, 28, 28), projection_dim=0)
    model = build_ssl_model("cnn", (1, 28, 28))
    with pytest.raises(ValueError, match=r"expects images \(N, 1, H, W\) or flattened records \(N, 784\)"):
        model(torch.rand(2, 3, 28, 28))
    with pytest.raises(ValueError, match="must be an SSLModel"):
        feature_dim(nn.Linear(2, 2))
    assert isinstance(model, SSLModel)
