"""Tests for protocols.models: head rule, determinism, (de)serialisation, loss and prediction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from silofl.protocols.models import (
    MODEL_KINDS,
    build_model,
    get_parameters,
    loss_fn,
    parameter_spec,
    predict,
    set_parameters,
)


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("num_labels", [2, 3, 5])
def test_logits_shape_and_dtype(kind: str, num_labels: int) -> None:
    model = build_model(kind, 7, num_labels, hidden=4)
    logits = model(torch.randn(11, 7))
    assert logits.shape == (11, num_labels)
    assert logits.dtype == torch.float32


def test_parameter_spec_names_and_shapes() -> None:
    assert parameter_spec(build_model("logreg", 102, 2)) == [("head.weight", (1, 102)), ("head.bias", (1,))]
    assert parameter_spec(build_model("logreg", 5, 3)) == [("head.weight", (3, 5)), ("head.bias", (3,))]
    assert parameter_spec(build_model("mlp", 5, 2, hidden=8)) == [
        ("hidden.weight", (8, 5)),
        ("hidden.bias", (8,)),
        ("head.weight", (1, 8)),
        ("head.bias", (1,)),
    ]


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_binary_head_is_logistic_and_ce_equals_bce(kind: str) -> None:
    model = build_model(kind, 6, 2, hidden=5, seed=3)
    x = torch.randn(40, 6)
    y = torch.randint(0, 2, (40,))
    logits = model(x)
    assert torch.all(logits[:, 0] == 0)
    z = logits[:, 1]
    torch.testing.assert_close(torch.softmax(logits, dim=1)[:, 1], torch.sigmoid(z))
    torch.testing.assert_close(torch.softmax(logits, dim=1)[:, 0], 1 - torch.sigmoid(z))
    torch.testing.assert_close(loss_fn(logits, y), F.binary_cross_entropy_with_logits(z, y.float()))


def test_logreg_binary_z_is_affine_in_x() -> None:
    model = build_model("logreg", 4, 2, seed=1)
    params = get_parameters(model)
    x = np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32)
    expected = x @ params["head.weight"][0] + params["head.bias"][0]
    np.testing.assert_allclose(model(torch.from_numpy(x))[:, 1].detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_loss_fn_is_mean_cross_entropy() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    labels = torch.tensor([0, 2])
    manual = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 2]) / 2
    torch.testing.assert_close(loss_fn(logits, labels), manual)


def test_seed_determinism_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = get_parameters(build_model("mlp", 10, 3, hidden=6, seed=7))
    assert torch.equal(torch.get_rng_state(), before)
    b = get_parameters(build_model("mlp", 10, 3, hidden=6, seed=7))
    c = get_parameters(build_model("mlp", 10, 3, hidden=6, seed=8))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[name], c[name]) for name in a)


def test_init_scale_matches_default_linear() -> None:
    params = get_parameters(build_model("logreg", 400, 3, seed=0))
    bound = 1 / np.sqrt(400)
    assert np.abs(params["head.weight"]).max() <= bound
    assert np.abs(params["head.weight"]).max() > 0.9 * bound  # uniform over the full range, not all zero


def test_get_set_roundtrip() -> None:
    source = build_model("mlp", 6, 3, hidden=4, seed=1)
    target = build_model("mlp", 6, 3, hidden=4, seed=2)
    params = get_parameters(source)
    assert list(params) == [name for name, _ in parameter_spec(source)]
    assert all(v.dtype == np.float32 for v in params.values())
    set_parameters(target, params)
    x = torch.randn(5, 6)
    torch.testing.assert_close(target(x), source(x))
    # get_parameters returns copies: mutating them does not touch the model
    params["head.bias"][:] = 99.0
    assert not np.any(get_parameters(source)["head.bias"] == 99.0)
    # set_parameters copies too: mutating the input afterwards does not touch the model
    fresh = get_parameters(source)
    set_parameters(target, fresh)
    fresh["head.bias"][:] = -5.0
    assert not np.any(get_parameters(target)["head.bias"] == -5.0)


def test_set_parameters_accepts_float64() -> None:
    model = build_model("logreg", 3, 2)
    params = {k: v.astype(np.float64) + 1.0 for k, v in get_parameters(model).items()}
    set_parameters(model, params)
    np.testing.assert_allclose(get_parameters(model)["head.bias"], params["head.bias"].astype(np.float32))


def test_set_parameters_rejects_wrong_shape() -> None:
    model = build_model("logreg", 3, 2)
    original = get_parameters(model)
    params = dict(original)
    params["head.weight"] = np.zeros((2, 3), dtype=np.float32)
    params["head.bias"] = np.full((1,), 7.0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"'head.weight' has shape \(2, 3\), expected \(1, 3\)"):
        set_parameters(model, params)
    # nothing was loaded, not even the valid entry
    np.testing.assert_array_equal(get_parameters(model)["head.bias"], original["head.bias"])


def test_set_parameters_rejects_wrong_names() -> None:
    model = build_model("logreg", 3, 2)
    params = get_parameters(model)
    params["head.w"] = params.pop("head.weight")
    with pytest.raises(ValueError, match=r"missing \['head.weight'\], unexpected \['head.w'\]"):
        set_parameters(model, params)


def test_set_parameters_rejects_non_finite() -> None:
    model = build_model("logreg", 3, 2)
    params = get_parameters(model)
    params["head.bias"] = np.array([np.nan], dtype=np.float32)
    with pytest.raises(ValueError, match=r"'head\.bias' contains NaN"):
        set_parameters(model, params)


def test_predict_is_argmax_and_threshold() -> None:
    model = build_model("logreg", 2, 2)
    set_parameters(
        model, {"head.weight": np.array([[1.0, -1.0]], np.float32), "head.bias": np.array([0.0], np.float32)}
    )
    x = np.array([[2.0, 1.0], [1.0, 2.0], [0.5, 0.5]], dtype=np.float64)
    out = predict(model, x)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [1, 0, 0])  # z = 1, -1, 0 (tie -> label 0)
    multi = build_model("mlp", 4, 3, hidden=3)
    xt = torch.randn(8, 4)
    np.testing.assert_array_equal(predict(multi, xt), multi(xt).argmax(1).numpy())


def test_predict_does_not_track_gradients() -> None:
    model = build_model("logreg", 2, 2)
    predict(model, torch.randn(3, 2, requires_grad=True))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "cnn", "num_features": 3, "num_labels": 2}, "kind must be one of"),
        ({"kind": "logreg", "num_features": 0, "num_labels": 2}, "num_features must be an integer >= 1"),
        ({"kind": "logreg", "num_features": 3, "num_labels": 1}, "num_labels must be an integer >= 2"),
        ({"kind": "mlp", "num_features": 3, "num_labels": 2, "hidden": 0}, "hidden must be an integer >= 1"),
        ({"kind": "mlp", "num_features": 3.0, "num_labels": 2}, "num_features must be an integer"),
        ({"kind": "mlp", "num_features": 3, "num_labels": 2, "seed": -1}, "seed must be an integer >= 0"),
    ],
)
def test_build_model_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(**kwargs)


def test_wrong_feature_count_is_reported() -> None:
    model = build_model("logreg", 5, 2)
    with pytest.raises(ValueError, match="input has 4 features but the model was built with num_features=5"):
        model(torch.randn(2, 4))
    with pytest.raises(ValueError, match="x must be 2-D"):
        predict(model, np.zeros(5))
