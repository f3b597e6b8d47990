"""`--model module:factory`: a user's torch model trained by the algorithms whose maths allow any differentiable
model (docs/CUSTOM_MODEL.md).

What is checked: the name is validated where every run config is; the module is built deterministically from the
seed; the server refuses, before any round, a model silofl cannot train (BatchNorm, a batch-mixing forward, a wrong
output, float64, a missing module), naming `--model` and the fix; a user's model takes the torch.func route and
gets the numbers of silofl's own closed-form routes for the same model; a run through the real `silofl` entry point
trains it; a deployed silo imports a user's module only when its operator's policy lists it (`model-modules`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from silofl.protocols import messages as msg
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.models import ModelError, build_model, check_model, get_parameters, parameter_spec, set_parameters
from silofl.protocols.silo_policy import PolicyError, parse_policy
from silofl.server.cli import main
from tests import custom_models
from tests import malicious_server as ms

TINY = "tests.custom_models:tiny"
SMALL_RUN = ["--rounds", "3", "--silos", "2", "--max-train-records", "120", "--batch-size", "64", "--no-progress"]


# -- the name -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["logreg", "mlp", TINY, "pkg:f", "a.b.c:make_model"])
def test_a_model_is_a_built_in_name_or_module_colon_factory(name: str) -> None:
    config = RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 1, "model": name})
    assert config.model == name
    instruction = config.spec.instruction_model(algorithm="dp-fedsgd", server_round=1, total_rounds=1, model=name)
    assert instruction.model == name


@pytest.mark.parametrize("name", ["cnn", "tests.custom_models", "a b:c", "a.:f", ":f", "a:b:c", "os.system(1):x"])
def test_anything_else_is_refused_where_the_config_is_read(name: str) -> None:
    with pytest.raises(ConfigError, match="MODULE:FACTORY"):
        RunConfig.parse({"algorithm": "steffle", "rounds": 1, "model": name})


def test_the_train_instruction_refuses_a_bad_name_too() -> None:
    """The silo reads the name from the instruction, whose field is a copy of the option: the check came along."""
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        msg.TrainInstruction.for_algorithm("dp-fedsgd", server_round=1, total_rounds=1, model="no-colon")
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        msg.EvaluateInstruction(server_round=1, model="no-colon")
    assert msg.EvaluateInstruction(server_round=1, model=TINY).model == TINY


# -- building and checking -------------------------------------------------------------------------------------------


def test_the_model_is_built_from_the_seed_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    a, b = build_model(TINY, 7, 3, seed=5), build_model(TINY, 7, 3, seed=5)
    c = build_model(TINY, 7, 3, seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
    pa, pb, pc = get_parameters(a), get_parameters(b), get_parameters(c)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert not np.array_equal(pa["inner.weight"], pc["inner.weight"])
    assert [name for name, _ in parameter_spec(a)] == [
        "inner.weight",
        "inner.bias",
        "norm.weight",
        "norm.bias",
        "out.weight",
        "out.bias",
    ]
    check_model(TINY, 7, 3)  # passes: output (n, 3), per-record, per-sample gradients


@pytest.mark.parametrize(
    ("factory", "needles"),
    [
        ("with_batchnorm", ["--model tests.custom_models:with_batchnorm", "layer '1' (BatchNorm1d)", "LayerNorm"]),
        ("batch_mixing", ["depends on the other records of its batch"]),
        ("one_logit", ["(4, 1)", "(n, num_labels) = (4, 2)", "two for a binary target"]),
        ("float64", ["parameter 'weight' is torch.float64", ".float()"]),
        ("NOT_A_FACTORY", ["not a function"]),
        ("missing", ["has no attribute 'missing'"]),
    ],
)
def test_the_server_refuses_a_model_it_cannot_train_naming_what_and_the_fix(factory: str, needles: list[str]) -> None:
    with pytest.raises(ModelError) as caught:
        check_model(f"tests.custom_models:{factory}", 5, 2)
    for needle in needles:
        assert needle in str(caught.value)


def test_a_module_that_is_not_installed_is_named_with_the_fix() -> None:
    with pytest.raises(ModelError, match=r"--model nosuch_pkg_xyz\.models:f: module 'nosuch_pkg_xyz\.models' cannot"):
        check_model("nosuch_pkg_xyz.models:f", 5, 2)


def test_dropout_and_buffers_are_refused() -> None:
    from silofl.protocols.models import check_model_structure

    with pytest.raises(ModelError, match="Dropout"):
        check_model_structure("m:f", torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.1)))

    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(3, 2)
            self.register_buffer("scale", torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x * self.scale)

    with pytest.raises(ModelError, match=r"state_dict also holds \['scale'\].*persistent=False"):
        check_model_structure("m:f", WithBuffer())


# -- the maths: a user's model takes the torch.func route, with the built-in routes' numbers ----------------------


def _twins(d: int = 6) -> tuple[torch.nn.Module, torch.nn.Module]:
    builtin = build_model("logreg", d, 2, seed=1)
    user = custom_models.logreg_twin(d, 2)
    set_parameters(user, get_parameters(builtin))
    return builtin, user


def _batch(n: int = 12, d: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, generator=g) * 2
    y = torch.randint(0, 2, (n,), generator=g)
    s = torch.randint(0, 3, (n,), generator=g)
    return x, y, s


def test_dp_sgd_clipped_sums_agree_with_the_built_in_route() -> None:
    from silofl.client.gradients import clipped_gradient_sum, mean_gradient, weighted_clipped_gradient_sum

    builtin, user = _twins()
    x, y, _ = _batch()
    for clip in (0.05, 1.0, 100.0):  # most records clipped, some, none
        torch.testing.assert_close(clipped_gradient_sum(user, x, y, clip), clipped_gradient_sum(builtin, x, y, clip))
    weights = torch.linspace(0.0, 2.0, len(y))
    torch.testing.assert_close(
        weighted_clipped_gradient_sum(user, x, y, weights, 0.3),
        weighted_clipped_gradient_sum(builtin, x, y, weights, 0.3),
    )
    torch.testing.assert_close(mean_gradient(user, x, y), mean_gradient(builtin, x, y))


def test_fairness_gradients_agree_with_the_built_in_route() -> None:
    from silofl.protocols import tran
    from silofl.protocols.steffle import GroupPrior, clipped_psi_theta_sum

    builtin, user = _twins()
    x, y, s = _batch()
    prior = GroupPrior("dp", np.array([0.5, 0.3, 0.2]), num_labels=2)
    w = torch.randn(3, 2, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        clipped_psi_theta_sum(user, x, s, w, prior, 0.2, labels=y),
        clipped_psi_theta_sum(builtin, x, s, w, prior, 0.2, labels=y),
    )
    c = torch.randn(3, 2, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        tran.clipped_constraint_gradient_sum(user, x, s, c, prior, 0.2, labels=y),
        tran.clipped_constraint_gradient_sum(builtin, x, s, c, prior, 0.2, labels=y),
    )


# -- through the real entry point ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_silofl_run_trains_a_user_model_with_dp_fedsgd(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["run", "dp-fedsgd", "--model", TINY, "--epsilon", "2", "--lr", "1.0", "--out", str(out), *SMALL_RUN])
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "result.json").read_text())
    assert result["config"]["model"] == TINY and result["status"]["state"] == "completed"
    info = result["federation"]
    initial = get_parameters(build_model(TINY, info["num_features"], info["num_labels"], seed=result["config"]["seed"]))
    assert list(result["model"]) == list(initial)  # the user's parameters, in their order
    trained = {name: np.asarray(value, dtype=np.float32) for name, value in result["model"].items()}
    assert all(np.isfinite(a).all() and a.shape == initial[n].shape for n, a in trained.items())
    assert any(not np.array_equal(trained[n], initial[n]) for n in initial)  # the rounds moved it
    assert 0 < result["privacy"]["epsilon_spent"] <= 2.0 + 1e-9
    assert result["final"]["accuracy"] is not None
    assert (out / "model.json").exists()  # the artifact: predict / evaluate / export import the factory again


def test_silofl_run_trains_a_user_model_with_steffle(tmp_path: Path, capsys) -> None:
    """SteFFLe's fairness gradients of a user's model: per-sample Jacobians through torch.func at the silos."""
    out = tmp_path / "run"
    argv = ["run", "steffle", "--model", TINY, "--epsilon", "1", "--lambda", "1", "--out", str(out), *SMALL_RUN]
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads((out / "result.json").read_text())
    assert result["status"]["state"] == "completed" and next(iter(result["model"])) == "inner.weight"
    assert np.abs(np.asarray(result["server_state"]["w"])).sum() > 0  # W moved with the silos' W-gradients


def test_silofl_run_refuses_a_batchnorm_model_before_the_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["run", "dp-fedsgd", "--model", "tests.custom_models:with_batchnorm", "--out", str(out), *SMALL_RUN]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--model tests.custom_models:with_batchnorm" in err and "BatchNorm1d" in err and "LayerNorm" in err
    assert not (out / "result.json").exists()  # refused before the federation started


def test_the_server_checks_the_model_when_no_command_line_did(tmp_path: Path) -> None:
    """`flwr run` and a deployment enter at the ServerApp: the orchestrator checks the model after the setup round,
    before any round."""
    from silofl.client.app import app as client_app
    from silofl.server.orchestrator import run_federation
    from tests.recording_grid import RecordingGrid

    config = RunConfig.parse(
        {
            "algorithm": "dp-fedsgd",
            "rounds": 1,
            "num-silos": 2,
            "max-train-records": 120,
            "model": "tests.custom_models:one_logit",
        }
    )
    grid = RecordingGrid(client_app, config.num_nodes)
    with pytest.raises(ConfigError, match="one_logit: the model returns"):
        run_federation(grid, config)
    assert {m.metadata.message_type for m, _ in grid.log} == {msg.SETUP}  # nothing but the setup round was asked


# -- the silo's operator decides whether a user's module is imported ------------------------------------------------


FIELDS = {"total_rounds": 2, "batch_size": 50, "lr": 0.1, "delta": 1e-6, "epsilon": 1.0}


def _zeros(node: ms.Node) -> dict[str, np.ndarray]:
    """Zero parameters of `tiny`'s architecture (built from tests.custom_models, never from the module the message
    names: building it here would import it in this process)."""
    return {name: np.zeros(shape, np.float32) for name, shape in ms.tabular_spec(TINY, node.info.num_features, 2)}


def _train(node: ms.Node, model: str) -> object:
    return node.send(msg.TRAIN, ms.train("dp-fedsgd", _zeros(node), server_round=1, model=model, **FIELDS), 1)


def _evaluate(node: ms.Node, model: str) -> object:
    from flwr.app import RecordDict

    params = _zeros(node)
    instr = msg.EvaluateInstruction(server_round=1, model=model).to_config_record()
    return node.send(msg.EVALUATE, RecordDict({msg.MODEL: msg.arrays_record(params), msg.CONFIG: instr}), 1)


def _deployed(tmp_path: Path, policy: str | None, name: str = "silo") -> ms.Node:
    extra = {"state-dir": str(tmp_path / f"{name}.state")}
    if policy is not None:
        (tmp_path / f"{name}.toml").write_text(policy)
        extra["policy"] = str(tmp_path / f"{name}.toml")
    node = ms.Node(ms.make_silo(200, n_test=100), tmp_path / name, **extra)
    node.info = node.setup()
    return node


def test_a_deployed_silo_refuses_a_user_model_without_its_operators_consent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SILOFL_TEST_UNTRUSTED_IMPORTED", raising=False)
    monkeypatch.delitem(sys.modules, "tests.custom_model_untrusted", raising=False)
    node = _deployed(tmp_path, None)
    untrusted = "tests.custom_model_untrusted:tiny"
    for reply in (_train(node, untrusted), _evaluate(node, untrusted)):
        reason = ms.error_reason(reply)
        assert "would make this node import module 'tests.custom_model_untrusted'" in reason
        assert 'model-modules = ["tests.custom_model_untrusted"]' in reason
    # refused before the module was imported: it never ran here
    assert "SILOFL_TEST_UNTRUSTED_IMPORTED" not in os.environ
    assert "tests.custom_model_untrusted" not in sys.modules
    # a policy without the module refuses as well, naming what it lists
    other = _deployed(tmp_path, 'model-modules = ["mypkg"]\n', name="other")
    assert "lists model-modules = ['mypkg']" in ms.error_reason(_train(other, untrusted))


@pytest.mark.slow
def test_a_deployed_silo_whose_policy_lists_the_package_trains_the_user_model(tmp_path: Path) -> None:
    node = _deployed(tmp_path, 'model-modules = ["tests"]\n')
    reply = _train(node, TINY)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    update = ms.arrays_of(reply, msg.UPDATE)
    assert list(update) == [name for name, _ in ms.tabular_spec(TINY, node.info.num_features, 2)]
    assert all(np.isfinite(a).all() for a in update.values())
    assert not _evaluate(node, TINY).has_error()


def test_a_simulated_silo_needs_no_consent(tmp_path: Path) -> None:
    """In simulation the user runs the server and every silo in their own processes: nothing to opt into."""
    node = ms.SimulatedNode(ms.make_silo(200, n_test=100))
    node.info = node.setup()
    assert not _train(node, TINY).has_error()


@pytest.mark.parametrize("value", ['["a:b"]', '["*"]', '["a b"]', '"mypkg"'])
def test_the_policy_key_takes_module_names_only(value: str) -> None:
    import tomllib

    with pytest.raises(PolicyError, match="model-modules"):
        parse_policy(tomllib.loads(f"model-modules = {value}\n"))


def test_a_package_allows_its_modules_not_the_other_way_round() -> None:
    policy = parse_policy({"model-modules": ["mypkg", "other.models"]})
    assert policy.allows_model_module("mypkg") and policy.allows_model_module("mypkg.models.deep")
    assert policy.allows_model_module("other.models")
    assert not policy.allows_model_module("other") and not policy.allows_model_module("mypkgx.models")
