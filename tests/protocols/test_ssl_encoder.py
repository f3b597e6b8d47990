"""`--model module:factory` for FedSC and FedAvg+SC: a user's image encoder (docs/CUSTOM_MODEL.md, "FedSC's encoder").

What is checked: the name is accepted where FedSC's config and train instruction are read, anything else refused;
silofl wraps the factory's backbone with its own projector, deterministically from the seed and without moving the
global RNG; the server refuses, before any round, an encoder silofl cannot train (each refusal names `--model` and
the fix); a run through the real `silofl` entry point trains it and `silofl export` writes its ONNX file, or says
why not when the factory cannot be imported again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from silofl.protocols import messages as msg
from silofl.protocols.algorithms.common import check_run_model
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.models import ModelError, parameter_spec
from silofl.protocols.ssl_encoder import check_encoder
from silofl.protocols.ssl_models import SSLModel, build_ssl_model
from silofl.server.cli import main
from tests import custom_models
from tests import malicious_server as ms

ENCODER = "tests.custom_models:small_encoder"
DIGITS = (1, 8, 8)


# -- the name -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedsc", "fedavg-sc"])
@pytest.mark.parametrize("name", ["cnn", "resnet20", ENCODER, "pkg:f"])
def test_the_ssl_model_is_a_backbone_or_module_colon_factory(algorithm: str, name: str) -> None:
    config = RunConfig.parse({"algorithm": algorithm, "rounds": 1, "model": name})
    assert config.model == name
    instruction = msg.TrainInstruction.for_algorithm(algorithm, server_round=1, total_rounds=1, model=name)
    assert instruction.model == name


@pytest.mark.parametrize("name", ["logreg", "mlp", "resnet", "a b:c", "a:b:c"])
def test_anything_else_is_refused_for_fedsc(name: str) -> None:
    with pytest.raises(ConfigError, match=r"built-in backbone \(cnn, resnet20\) nor MODULE:FACTORY"):
        RunConfig.parse({"algorithm": "fedsc", "rounds": 1, "model": name})
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        msg.TrainInstruction.for_algorithm("fedsc", server_round=1, total_rounds=1, model=name)


# -- building --------------------------------------------------------------------------------------------------------


def test_silofl_adds_its_projector_to_the_factory_backbone() -> None:
    model = build_ssl_model(ENCODER, DIGITS, projection_dim=8, seed=3)
    assert isinstance(model, SSLModel) and model.feature_dim == 16 and model.image_shape == DIGITS
    spec = dict(parameter_spec(model))
    assert spec["projector.0.weight"] == (32, 16) and spec["projector.2.weight"] == (8, 32)
    assert all(name.startswith(("backbone.", "projector.")) for name in spec)
    torch.manual_seed(3)  # the factory's weights: torch's global RNG seeded with the run's seed
    expected = custom_models.small_encoder(DIGITS)
    for (name, p), q in zip(model.backbone.named_parameters(), expected.parameters(), strict=True):
        assert torch.equal(p, q), name
    x = torch.rand(5, 64)
    assert model(x).shape == (5, 8) and model.features(x).shape == (5, 16)


def test_the_same_seed_builds_the_same_encoder_and_leaves_the_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a, b = (build_ssl_model(ENCODER, DIGITS, projection_dim=4, seed=7) for _ in range(2))
    c = build_ssl_model(ENCODER, DIGITS, projection_dim=4, seed=8)
    assert torch.equal(state, torch.get_rng_state())
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert not torch.equal(a.state_dict()["backbone.0.weight"], c.state_dict()["backbone.0.weight"])
    assert not torch.equal(a.state_dict()["projector.0.weight"], c.state_dict()["projector.0.weight"])


# -- the server's checks ---------------------------------------------------------------------------------------------


def test_a_good_encoder_passes_and_reports_its_feature_dimension() -> None:
    assert check_encoder(ENCODER, DIGITS) == 16
    assert check_encoder(ENCODER, (3, 32, 32)) == 16


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("encoder_not_a_module", "not a torch.nn.Module"),
        ("encoder_raises", "raised ValueError: this encoder is for 32x32 images"),
        ("encoder_4d", r"returns \(4, 2, 8, 8\) for 4 images of shape \(1, 8, 8\); FedSC needs features \(N, D\)"),
        ("encoder_nan", "NaN or inf features"),
        ("encoder_float64", "parameter 'conv.weight' is torch.float64"),
        ("encoder_frozen", r"parameter 'conv.bias' is frozen"),
        ("encoder_with_buffer", r"state_dict also holds \['scale'\]"),
        ("encoder_with_batchnorm", r"layer '1' \(BatchNorm2d\) is a BatchNorm.*GroupNorm"),
        ("encoder_batch_mixing", "features depend on the other records of its batch"),
        ("nope", r"has no attribute 'nope'; name a function nope\(image_shape\)"),
    ],
)
def test_an_encoder_silofl_cannot_train_is_refused_naming_model(factory: str, says: str) -> None:
    kind = f"tests.custom_models:{factory}"
    with pytest.raises(ModelError, match=rf"^--model {kind}: .*{says}"):
        check_encoder(kind, DIGITS)


def test_a_module_that_does_not_import_is_refused() -> None:
    with pytest.raises(ModelError, match="module 'nosuch_pkg_xyz' cannot be imported here"):
        check_encoder("nosuch_pkg_xyz:f", DIGITS)


def test_the_run_check_dispatches_on_the_algorithm() -> None:
    """FedSC's run check calls factory(image_shape), not the tabular factory(num_features, num_labels); --width,
    which scales the built-in backbones only, is refused with a user's encoder."""
    config = RunConfig.parse({"algorithm": "fedsc", "rounds": 1, "model": ENCODER})
    check_run_model(config, 64, 10)  # passes
    with pytest.raises(ConfigError, match=r"^--model tests.custom_models:encoder_4d: the encoder returns"):
        check_run_model(
            RunConfig.parse({"algorithm": "fedavg-sc", "rounds": 1, "model": "tests.custom_models:encoder_4d"}), 64, 10
        )
    with pytest.raises(ConfigError, match=r"--width 2 scales the built-in backbones.*drop --width"):
        check_run_model(RunConfig.parse({"algorithm": "fedsc", "rounds": 1, "model": ENCODER, "width": 2}), 64, 10)
    with pytest.raises(ConfigError, match=f"--model {ENCODER}: num_features=7 is not a known image size"):
        check_run_model(config, 7, 10)


@pytest.mark.slow  # ~2.5-5 s: the run machinery's first import
def test_silofl_run_refuses_a_bad_encoder_before_the_run(tmp_path: Path, capsys) -> None:
    argv = ["run", "fedsc", "--model", "tests.custom_models:encoder_batch_mixing", "--rounds", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--model tests.custom_models:encoder_batch_mixing" in err and "GroupNorm" in err
    assert not (tmp_path / "run" / "result.json").exists()


# -- at the silo --------------------------------------------------------------------------------------------------


def _correlation(model: str) -> object:
    spec = parameter_spec(build_ssl_model(ENCODER, DIGITS, projection_dim=8))
    params = {name: np.zeros(shape, np.float32) for name, shape in spec}
    fields = {"total_rounds": 1, "projection_dim": 8, "views": 2, "calr_sampling_rate": 1.0, "planned_shares": 1}
    return ms.correlation(params, server_round=1, model=model, **fields)


def test_a_simulated_silo_answers_with_the_user_encoder_or_says_why_not(tmp_path: Path) -> None:
    node = ms.SimulatedNode(ms.make_silo(40, num_features=64))
    node.info = node.setup()
    reply = node.send(msg.CORRELATION, _correlation(ENCODER), 1)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    other = ms.SimulatedNode(ms.make_silo(40, num_features=64))  # a new job: the first one's model is bound
    other.info = other.setup()
    reason = ms.error_reason(other.send(msg.CORRELATION, _correlation("nosuch_pkg_xyz.enc:small"), 1))
    assert "correlation query to silo" in reason and "module 'nosuch_pkg_xyz.enc' cannot be imported" in reason


def test_a_deployed_silo_imports_a_user_encoder_only_with_its_operators_consent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SILOFL_TEST_UNTRUSTED_IMPORTED", raising=False)
    monkeypatch.delitem(sys.modules, "tests.custom_model_untrusted", raising=False)
    node = ms.Node(ms.make_silo(40, num_features=64), tmp_path / "silo", **{"state-dir": str(tmp_path / "state")})
    node.info = node.setup()
    reason = ms.error_reason(node.send(msg.CORRELATION, _correlation("tests.custom_model_untrusted:small_encoder"), 1))
    assert 'model-modules = ["tests.custom_model_untrusted"]' in reason
    assert "tests.custom_model_untrusted" not in sys.modules  # refused before the module was imported


# -- through the real entry point ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_silofl_run_trains_a_user_encoder_and_exports_it(tmp_path: Path, capsys) -> None:
    import onnxruntime as ort

    from silofl.protocols.models import set_parameters

    run = tmp_path / "sc"
    argv = ["run", "fedsc", "--model", ENCODER, "--rounds", "2", "--eval-every", "2", "--probe-epochs", "2"]
    argv += ["--max-train-records", "300", "--projection-dim", "8", "--no-progress", "--out", str(run)]
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads((run / "result.json").read_text())
    assert result["status"]["state"] == "completed" and result["config"]["model"] == ENCODER
    assert 0.0 <= result["final"]["accuracy"] <= 1.0 and 0.0 <= result["final"]["knn_accuracy"] <= 1.0
    initial = build_ssl_model(ENCODER, DIGITS, projection_dim=8, seed=result["config"]["seed"])
    with np.load(run / "model.npz") as stored:
        trained = {k: stored[k] for k in stored.files}
    assert list(trained) == [name for name, _ in parameter_spec(initial)]
    assert any(not np.array_equal(trained[n], p.detach().numpy()) for n, p in initial.named_parameters())

    out = tmp_path / "encoder.onnx"
    assert main(["export", str(run), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "16 features" in capsys.readouterr().out
    set_parameters(initial, trained)
    pixels = np.random.default_rng(1).random((6, 64), dtype=np.float32)
    features, z = ort.InferenceSession(str(out)).run(["features", "z"], {"pixels": pixels})
    with torch.no_grad():
        want = initial.features(torch.from_numpy(pixels))
        np.testing.assert_allclose(features, want.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(z, initial.projector(want).numpy(), atol=1e-5, rtol=0)

    # the export imports the factory again: a run whose module is gone here says so
    result["config"]["model"] = "nosuch_pkg_xyz.encoders:small"
    (run / "result.json").write_text(json.dumps(result))
    assert main(["export", str(run), "--out", str(tmp_path / "gone.onnx")]) == 2
    err = capsys.readouterr().err
    assert "builds again to load model.npz" in err and "module 'nosuch_pkg_xyz.encoders' cannot be imported" in err
