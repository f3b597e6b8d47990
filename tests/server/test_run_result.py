"""`server.run_result.RunResult`: every algorithm's result.json validates and writes back byte for byte, older and
partial result files load, and a file that is not a run's result is refused with its file and field named."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from silofl.server.plots import PlotError, load_runs
from silofl.server.result import write_result
from silofl.server.run_result import FinalMetrics, RunResult, RunResultError, as_float

#: The explicit small configuration of each algorithm's case (tests/system/test_same_numbers.py records their numbers),
#: and FedFDP (not among them) on DP-FedSGD's, without the learning-rate decay it does not have.
GOLDEN_RUNS = Path(__file__).resolve().parents[1] / "data" / "golden_runs.json"
CASES: dict[str, dict[str, Any]] = {
    name: case["config"] for name, case in json.loads(GOLDEN_RUNS.read_text())["cases"].items()
}
CASES["fedfdp"] = {
    **{k: v for k, v in CASES["dp-fedsgd"].items() if not k.startswith("lr-decay")},
    "algorithm": "fedfdp",
}


#: silofl's own algorithms (a test may register a plugin beside them): each must have a case.
BUILTIN = ("fedavg", "dp-fedsgd", "steffle", "tran", "mu2fl", "noisy-sgd", "fedsc", "fedavg-sc", "fedfdp")


def _run(config: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run `config` on the in-process engine into `out`; the result the orchestrator returned."""
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    return run_job(RunConfig.parse({**config, "out-dir": str(out)}), engine="inprocess", progress=False)


def _written(document: dict[str, Any], path: Path) -> str:
    """`document` written as silofl writes result.json (indent 2, no NaN)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2, allow_nan=False)
    path.write_text(text)
    return text


# -- every algorithm's result.json ------------------------------------------------------------------------------------


def test_every_builtin_algorithm_has_a_case() -> None:
    from silofl.protocols import algorithms

    assert {c["algorithm"] for c in CASES.values()} == set(BUILTIN) and set(BUILTIN) <= set(algorithms.names())


@pytest.mark.slow  # a few seconds a case on 2 cores (the first pays torch's import; FedSC a CNN and a probe)
@pytest.mark.parametrize("case", list(CASES))
def test_every_algorithms_result_validates_and_writes_back_byte_for_byte(case: str, tmp_path: Path) -> None:
    returned = _run(CASES[case], tmp_path / case)
    text = (tmp_path / case / "result.json").read_text()
    result = RunResult.load(tmp_path / case)
    assert result.dumps() == text  # key order, float digits, indent: the same bytes
    assert result.to_json() == returned  # what the orchestrator returned is the document written
    assert result.algorithm == CASES[case]["algorithm"] and result.completed
    assert result.federation is not None and result.federation.rounds == CASES[case]["rounds"]
    assert result.rounds is not None and [r.round for r in result.rounds] == list(range(1, len(result.rounds) + 1))
    assert result.privacy is not None and result.privacy.per_silo
    assert result.privacy.spent == as_float(json.loads(text)["privacy"]["epsilon_spent"])
    assert result.final.has("accuracy") and 0.0 <= result.final.accuracy <= 1.0
    # what an algorithm adds of its own is kept, in order, beside the typed fields
    written = json.loads(text)
    assert list(result.privacy.extras) == [k for k in written["privacy"] if k not in type(result.privacy).model_fields]
    last = result.rounds[-1]
    assert {k: last.get(k) for k in written["rounds"][-1]} == written["rounds"][-1]


@pytest.mark.slow
def test_a_run_with_sensitive_parties_round_trips(tmp_path: Path) -> None:
    """SteFFLe with a central sensitive party: `federation` adds the topology and the sensitive parties."""
    config = {**CASES["steffle"], "topology": "central-sensitive", "rounds": 2}
    _run(config, tmp_path / "run")
    text = (tmp_path / "run" / "result.json").read_text()
    result = RunResult.load(tmp_path / "run" / "result.json")
    assert result.dumps() == text
    assert result.federation.topology == "central-sensitive"
    assert [p.party_id for p in result.federation.sensitive_parties] == [0]


# -- older and partial files ------------------------------------------------------------------------------------------


def _oldest_shape() -> dict[str, Any]:
    """result.json as the first silofl version wrote it: no engine-independent extras, no server_state, no
    fairness_groups, no status (it wrote a result only for a run that completed)."""
    return {
        "config": {"algorithm": "dp-fedsgd", "dataset": "adult", "epsilon": 1.0, "rounds": 2},
        "engine": "inprocess",
        "federation": {
            "silos": [{"silo_id": 0, "node_id": 11, "n_train": 100, "n_test": 20}],
            "num_features": 4,
            "num_labels": 2,
            "num_groups": 2,
            "label_names": ["0", "1"],
            "group_names": ["a", "b"],
            "rounds": 2,
        },
        "rounds": [
            {"round": 1, "seconds": 0.5, "lr": 0.1, "epsilon_spent": 0.7},
            {"round": 2, "seconds": 0.25, "lr": 0.1, "epsilon_spent": 1.0, "accuracy": 0.75, "num_examples": 100.0},
        ],
        "final": {
            "accuracy": 0.75,
            "error": 0.25,
            "loss": 0.5,
            "dp_violation": 0.1,
            "eo_violation": None,
            "eopp_violation": None,
        },
        "privacy": {
            "epsilon_target": 1.0,
            "epsilon_spent": 1.0,
            "delta": 1e-05,
            "per_silo": {
                "0": {
                    "epsilon_spent": 1.0,
                    "noise_multiplier": 1.5,
                    "sampling_rate": 0.01,
                    "n_train": 100,
                    "rounds_answered": 2,
                }
            },
            "accountant": "rdp",
            "mechanism": "each silo: Poisson sampling",
            "not_covered": "federated evaluation",
        },
        "timing": {"total_seconds": 3.0, "seconds_per_round": 1.5},
        "model": {"head.weight": [[0.5, -1.0]], "head.bias": [0.0]},
    }


def test_the_first_versions_result_loads_completed_and_writes_back(tmp_path: Path) -> None:
    text = _written(_oldest_shape(), tmp_path / "old" / "result.json")
    result = RunResult.load(tmp_path / "old")
    assert result.dumps() == text
    assert result.status is None and result.completed  # written only for completed runs
    assert result.server_state is None and result.fairness_groups is None
    assert result.rounds[1].get("accuracy") == 0.75 and result.rounds[0].get("accuracy") is None
    assert result.model["head.weight"] == [[0.5, -1.0]]


def test_a_partial_result_loads_and_keeps_only_what_it_has(tmp_path: Path) -> None:
    """A test's synthetic run folder holds config, final and a few blocks; nothing absent is added when written."""
    document = {
        "config": {"algorithm": "steffle", "epsilon": "inf"},
        "final": {"error": 0.2, "dp_violation": 0.05},
        "privacy": {"epsilon_spent": 1.0},
        "timing": {"total_seconds": 10},
        "status": {"completed": False},
    }
    text = _written(document, tmp_path / "r" / "result.json")
    result = RunResult.load(tmp_path / "r" / "result.json")
    assert result.dumps() == text and result.to_json() == document
    assert isinstance(result.timing.total_seconds, int)  # an int stays an int: the file writes back the same
    assert not result.completed and result.final.accuracy is None and not result.final.has("accuracy")
    assert result.privacy.spent == 1.0 and result.timing.seconds_per_round is None


def test_an_infinite_epsilon_is_inf_and_a_metric_must_be_finite_to_count() -> None:
    result = RunResult.from_json(
        {"config": {}, "final": {"accuracy": 0.9, "loss": None}, "privacy": {"epsilon_spent": "inf"}}
    )
    assert result.privacy.spent == math.inf and as_float("inf") == math.inf and as_float(2) == 2.0
    assert result.final.has("accuracy") and not result.final.has("loss") and not result.final.has("knn_accuracy")
    assert not FinalMetrics(error=math.inf).has("error")


# -- files that are not a run's result --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"final": {}}, "config"),
        ({"config": {}}, "final"),
        ({"config": [], "final": {}}, "config"),
        ({"config": {"algorithm": 3}, "final": {}}, "config"),
        ({"config": {}, "final": {"accuracy": "0.9"}}, "final.accuracy"),
        ({"config": {}, "final": {}, "rounds": [{"round": 1}, {"round": 2, "seconds": "x"}]}, "rounds[1].seconds"),
        ({"config": {}, "final": {}, "status": {"completed": "yes"}}, "status.completed"),
        ({"config": {}, "final": {}, "privacy": {"epsilon_spent": "infinite"}}, "privacy.epsilon_spent"),
        ({"config": {}, "final": {}, "privacy": {"per_silo": {"0": {"n_train": 1.5}}}}, "privacy.per_silo.0.n_train"),
        ({"config": {}, "final": {}, "model": 3}, "model"),
    ],
)
def test_a_broken_result_names_its_file_and_field(tmp_path: Path, document: dict[str, Any], field: str) -> None:
    path = tmp_path / "run" / "result.json"
    _written(document, path)
    with pytest.raises(RunResultError) as info:
        RunResult.load(path.parent)
    message = str(info.value)
    assert message.startswith(f"{path}: not a silofl run result") and f"field `{field}`" in message
    assert "rerun" in message  # and what to do about it


def test_not_json_not_an_object_and_no_file_are_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "result.json").write_text('{"config": {')
    with pytest.raises(RunResultError, match=r"half/result.json: not a silofl run result: not valid JSON"):
        RunResult.load(tmp_path / "half")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(RunResultError, match=r"list.json: not a silofl run result: expected a JSON object"):
        RunResult.load(tmp_path / "list.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunResultError, match=r"empty holds no result.json"):
        RunResult.load(tmp_path / "empty")


def test_load_runs_reports_a_broken_file_as_a_plot_error(tmp_path: Path) -> None:
    _written({"config": {"algorithm": "fedavg"}, "final": {"error": "low"}}, tmp_path / "a" / "result.json")
    with pytest.raises(PlotError, match=r"a/result.json: not a silofl run result: field `final.error`"):
        load_runs([tmp_path])


def test_load_runs_keeps_each_records_typed_result_without_its_bulk(tmp_path: Path) -> None:
    """The model arrays are never kept, the per-round entries only `with_rounds` (a sweep's thousands of long runs)."""
    old = _oldest_shape()
    _written(old, tmp_path / "old" / "result.json")
    (record,), incomplete = load_runs([tmp_path])
    assert incomplete == 0 and record.result is not None and record.rounds == ()
    assert record.result.to_json() == {k: v for k, v in old.items() if k not in ("rounds", "model")}
    assert record.final == old["final"] and record.result.privacy.per_silo["0"].noise_multiplier == 1.5
    (record,), _ = load_runs([tmp_path], with_rounds=True)
    assert record.rounds == tuple(old["rounds"]) and record.result.model is None
    assert [r.get("accuracy") for r in record.result.rounds] == [None, 0.75]


def test_load_can_skip_blocks_but_never_config_or_final(tmp_path: Path) -> None:
    _written(_oldest_shape(), tmp_path / "old" / "result.json")
    light = RunResult.load(tmp_path / "old", skip=("rounds", "model", "federation"))
    assert light.rounds is None and light.model is None and light.federation is None
    assert "rounds" not in light.to_json() and light.timing.seconds_per_round == 1.5
    with pytest.raises(ValueError, match="config and final are always read"):
        RunResult.load(tmp_path / "old", skip=("final",))


def test_write_result_validates_what_it_writes(tmp_path: Path) -> None:
    document = _oldest_shape()
    path = write_result(document, tmp_path / "out")
    assert path.read_text() == json.dumps(document, indent=2, allow_nan=False)
    with pytest.raises(RunResultError, match=r"field `timing.total_seconds`"):
        write_result({**document, "timing": {"total_seconds": "3 s"}}, tmp_path / "bad")
    assert not (tmp_path / "bad" / "result.json").exists()
    with pytest.raises(ValueError, match="Out of range float values"):  # NaN is not JSON: refused, as before
        write_result({**document, "final": {"accuracy": math.nan}}, tmp_path / "nan")
