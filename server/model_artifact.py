"""A run's model artifact: the trained tabular model as two files beside result.json, usable without silofl's training.

    RUN/model.safetensors   the parameters, float32, named as `protocols.models.TabularModel`'s state_dict
                            (``head.weight``, ``head.bias``; an MLP also ``hidden.weight``, ``hidden.bias``)
    RUN/model.json          the manifest (:func:`build_manifest`): format and silofl version; the model (kind, hidden
                            size, input width, labels, parameter spec, the weights file and its sha256, what the
                            output is); the run (algorithm, dataset, seed, rounds, engine, its test metrics); the
                            privacy summary copied from result.json (epsilon target and spent, delta, accountant,
                            mechanism, what is protected and what is not); feature, label, sensitive-column and group
                            names; and the preprocessing (`protocols.preprocessing.Preprocessing`'s JSON) with where
                            it came from, or null and why

`silofl run` writes it at the end of every completed run of a logistic regression or MLP (`engines.run_job` calls
:func:`write_run_artifact`): the preprocessing is the one the command-line process recorded when its checks loaded
the run's dataset as the simulated silos load it (`client.data.preprocessing_cache`; loaded again only where no check
did), never sent over the network (the silos never send it). A deployed run's
server writes only result.json (it never sees the preprocessing, which is not differentially private); the data owner
adds the artifact with `silofl model pack RUN --preprocessing DIR/preprocessing.json` (:func:`pack`), the file
`silofl data split` wrote beside the silo folders. `silofl model pack RUN` without the file does the simulation's step
for a run folder that predates artifacts.

Which runs: those whose config's `model` is ``logreg`` or ``mlp`` and whose result holds the parameters inline
(fedavg, dp-fedsgd, steffle, tran, fedfdp; mu2fl and noisy-sgd too: their x_T is a logistic regression in the same
layout, kept in float64 by the server and cast to float32 here as their federated evaluation casts it). FedSC and
FedAvg+SC train an image encoder (model.npz): `silofl export RUN --format onnx` exports it without an artifact. Any
other run is left alone, at the cost of one dictionary look-up.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np

from silofl.protocols.preprocessing import Preprocessing, PreprocessingError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "WEIGHTS_FILE",
    "ArtifactError",
    "build_manifest",
    "is_tabular_result",
    "pack",
    "read_artifact",
    "read_result",
    "write_artifact",
    "write_run_artifact",
]

FORMAT = "silofl-model"
FORMAT_VERSION = 1
MANIFEST_FILE = "model.json"
WEIGHTS_FILE = "model.safetensors"
RESULT_FILE = "result.json"

#: What the model outputs, for the manifest's readers.
OUTPUT = (
    "logits (n, num_labels); class probabilities = softmax(logits); the prediction is the argmax (ties to the lower "
    "label). A binary model has one linear output z and returns the logits [0, z] (probability of label 1 = "
    "sigmoid(z))"
)
PREPROCESSING_PRIVACY = (
    "not differentially private: the one-hot vocabularies and the z-score statistics in 'preprocessing' are computed "
    "from the training records without noise (the model's parameters carry the run's guarantee, they do not); share "
    "this artifact only with those who may see them, or remove 'preprocessing' before sharing"
)


class ArtifactError(ValueError):
    """A run folder without a usable model artifact, or an artifact that does not fit its run; the message names the
    file and the fix."""


# --- reading a run ----------------------------------------------------------------------------------------------


def read_result(run_dir: str | Path) -> dict[str, Any]:
    """RUN/result.json, with clear errors for a missing folder or file and for a file that is not a run's result."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder; give the folder `silofl run --out` wrote")
    path = run / RESULT_FILE
    if not path.is_file():
        raise ArtifactError(f"{run} has no {RESULT_FILE}: it is not a silofl run folder (`silofl run --out DIR`)")
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not a JSON file ({exc}); it was damaged: rerun the job") from exc
    if not isinstance(result, dict) or not {"config", "federation", "model"} <= set(result):
        raise ArtifactError(f"{path}: not a silofl result (config, federation and model are missing)")
    return result


def is_tabular_result(result: Mapping[str, Any]) -> bool:
    """Whether a result holds a tabular classifier inline (the runs that get an artifact): a logistic regression, an
    MLP, or a user's `module:factory` model, which reading the artifact rebuilds by importing that factory again."""
    from silofl.protocols.model_names import is_custom_model
    from silofl.protocols.models import MODEL_KINDS

    config = result.get("config")
    if not isinstance(config, Mapping) or not isinstance(result.get("model"), dict):
        return False
    model = config.get("model")
    return model in MODEL_KINDS or (isinstance(model, str) and is_custom_model(model))


def user_code_importable() -> None:
    """Let a user's model (``module:factory``) come from the current folder, as `silofl run` lets it (`server.cli`):
    the folder goes at the END of the import path, so an installed package of that name wins."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _hidden(config: Mapping[str, Any]) -> int | None:
    return int(config.get("hidden", 64)) if config.get("model") == "mlp" else None


def _result_arrays(result: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The result's parameters as float32 arrays, checked against the architecture its config and federation name
    (names, order and shapes of `protocols.models.build_model`'s state_dict)."""
    from silofl.protocols.models import build_model, parameter_spec

    config, federation = result["config"], result["federation"]
    hidden = _hidden(config)
    user_code_importable()
    try:
        spec = parameter_spec(
            build_model(
                config["model"], int(federation["num_features"]), int(federation["num_labels"]), hidden=hidden or 64
            )
        )
    except (KeyError, TypeError, ValueError, ImportError) as exc:
        raise ArtifactError(f"result.json does not describe a tabular model silofl can build here ({exc})") from exc
    model = result["model"]
    if [name for name, _ in spec] != list(model):
        raise ArtifactError(
            f"result.json's model has parameters {list(model)}, a {config['model']} needs {[n for n, _ in spec]}"
        )
    arrays = {}
    for name, shape in spec:
        array = np.asarray(model[name], dtype=np.float32)
        if array.shape != shape:
            raise ArtifactError(f"result.json's parameter {name!r} has shape {array.shape}, the model needs {shape}")
        if not np.isfinite(array).all():
            raise ArtifactError(f"result.json's parameter {name!r} holds NaN or inf values: the run diverged")
        arrays[name] = np.ascontiguousarray(array)
    return arrays


def _silofl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("silofl")
    except PackageNotFoundError:
        return "unknown"


def _privacy(result: Mapping[str, Any]) -> dict[str, Any]:
    """The result's privacy block without the per-silo detail, plus what the algorithm's entry says it protects."""
    privacy = {k: v for k, v in dict(result.get("privacy") or {}).items() if k != "per_silo"}
    name = result["config"].get("algorithm", "")
    try:
        from silofl.protocols import algorithms

        spec = algorithms.get(name)
    except (KeyError, ValueError, ImportError):
        spec = None
    for field in ("protects", "in_clear"):
        value = getattr(spec, field, "") if spec is not None else ""
        if value and field not in privacy:
            privacy[field] = value
    privacy["preprocessing"] = PREPROCESSING_PRIVACY
    return privacy


def _check_fits(preprocessing: Preprocessing, result: Mapping[str, Any], source: str) -> None:
    """Refuse a preprocessing record that does not describe the data the run was trained on."""
    federation = result["federation"]
    fix = (
        "give the preprocessing.json that `silofl data split` wrote beside the folders the silos were trained on"
        if source
        else "the run's dataset changed since the run: rerun it"
    )
    where = source or "the dataset loaded again"
    if preprocessing.num_features != int(federation["num_features"]):
        raise ArtifactError(
            f"{where} encodes {preprocessing.num_features} features but the model takes "
            f"{federation['num_features']}: it is not the encoding of this run's data; {fix}"
        )
    for field in ("label_names", "group_names"):
        ours, theirs = list(getattr(preprocessing, field)), list(federation.get(field) or [])
        if theirs and ours != theirs:
            raise ArtifactError(f"{where} has {field} {ours[:10]}, the run {theirs[:10]}; {fix}")


def build_manifest(
    result: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    weights_sha256: str,
    preprocessing: Preprocessing | None,
    preprocessing_source: str,
) -> dict[str, Any]:
    """The manifest (model.json) of a tabular run's artifact; see the module docstring for its fields."""
    config, federation = result["config"], result["federation"]
    status = result.get("status") or {}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "silofl_version": _silofl_version(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": {
            "kind": config["model"],
            "hidden": _hidden(config),
            "num_features": int(federation["num_features"]),
            "num_labels": int(federation["num_labels"]),
            "parameters": [{"name": k, "shape": list(a.shape), "dtype": "float32"} for k, a in arrays.items()],
            "weights": WEIGHTS_FILE,
            "weights_sha256": weights_sha256,
            "input": "float32 (n, num_features): rows encoded by 'preprocessing' (feature_names gives each column)",
            "output": OUTPUT,
        },
        "run": {
            "algorithm": config.get("algorithm"),
            "dataset": config.get("dataset"),
            "seed": config.get("seed"),
            "rounds": federation.get("rounds"),
            "engine": result.get("engine"),
            "state": status.get("state", "completed"),
            "result": RESULT_FILE,
            "test_metrics": result.get("final"),
        },
        "privacy": _privacy(result),
        "feature_names": list(preprocessing.feature_names) if preprocessing is not None else None,
        "label_names": list(federation.get("label_names") or []),
        "sensitive_columns": list(preprocessing.sensitive_columns) if preprocessing is not None else None,
        "group_names": list(federation.get("group_names") or []),
        "preprocessing": preprocessing.to_json() if preprocessing is not None else None,
        "preprocessing_source": preprocessing_source,
    }


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def write_artifact(
    run_dir: str | Path,
    result: Mapping[str, Any],
    preprocessing: Preprocessing | None,
    preprocessing_source: str,
) -> Path:
    """Write RUN/model.safetensors and RUN/model.json for a tabular run's `result`; return the manifest's path.

    `preprocessing` (checked to fit the run: width, label and group names) may be None (an image dataset, or a
    deployed run not packed yet): `preprocessing_source` then says why, and `predict`/`evaluate` refuse with it while
    `export` still works. Written weights first, manifest last (each atomically), so a manifest always names
    complete weights.
    """
    from safetensors.numpy import save

    if not is_tabular_result(result):
        raise ArtifactError("the run's model is not a logistic regression or MLP held in result.json")
    if result.get("status", {}).get("state", "completed") != "completed":
        raise ArtifactError(
            f"the run stopped after round {result['status'].get('rounds_completed')} "
            f"({result['status'].get('error')}); finish it first (silofl run ... --resume RUN)"
        )
    arrays = _result_arrays(result)
    if preprocessing is not None:
        _check_fits(preprocessing, result, preprocessing_source)
    run = Path(run_dir)
    data = save(dict(arrays), metadata={"format": FORMAT})  # one key: the bytes do not depend on a hash order
    _write_atomic(run / WEIGHTS_FILE, data)
    manifest = build_manifest(result, arrays, hashlib.sha256(data).hexdigest(), preprocessing, preprocessing_source)
    path = run / MANIFEST_FILE
    _write_atomic(path, (json.dumps(manifest, indent=2, allow_nan=False) + "\n").encode())
    return path


# --- when a run ends, and afterwards ----------------------------------------------------------------------------


def simulation_preprocessing(
    config: Any, node_configs: Sequence[Mapping[str, Any]] | None = None
) -> tuple[Preprocessing, str]:
    """The preprocessing of a simulated run's data and where it came from.

    Simulated silos derive their partition from the run's dataset: its encoding as the command line recorded it when
    it loaded the data for the silos (`silofl run`'s checks; `client.data.preprocessing_cache`), else the dataset is
    loaded here with their own loader arguments (`client.silo_data._source`, the same records) and recorded (and
    kept: a sweep's worker loads it once per data spec). Silos that read their own folders
    (node config `data-path`) were prepared by `silofl data split`: the preprocessing.json it wrote beside them.
    Raises PreprocessingError (image datasets, folders without the file) or the loader's errors.
    """
    from silofl.client.data.preprocessing_file import PREPROCESSING_FILE, load_preprocessing

    paths = [c["data-path"] for c in node_configs or () if "data-path" in c]
    if paths:
        parents = {Path(str(p)).expanduser().resolve().parent for p in paths}
        files = [p / PREPROCESSING_FILE for p in parents]
        if len(files) != 1 or not files[0].is_file():
            raise PreprocessingError(
                f"the silos read their own data folders ({', '.join(map(str, paths))}) with no single "
                f"{PREPROCESSING_FILE} beside them; write the artifact with `silofl model pack RUN --preprocessing "
                "FILE`, FILE the one `silofl data split` wrote"
            )
        return Preprocessing.load(files[0]), f"{files[0]} (silofl data split, beside the silos' folders)"
    from silofl.client.data.preprocessing_cache import preprocessing_of
    from silofl.client.silo_data import _source  # the simulated silos' loader arguments: the very records they loaded
    from silofl.protocols.messages import DataSpec

    # what `silofl run`'s checks recorded when they loaded the data (or an earlier run of this process), else a load
    preprocessing = preprocessing_of(
        DataSpec.from_run_config(config), lambda: load_preprocessing(config.dataset, **_source(config))
    )
    return preprocessing, f"dataset {config.dataset!r} loaded by the command line with the silos' loader arguments"


def write_run_artifact(
    config: Any, result: Mapping[str, Any], node_configs: Sequence[Mapping[str, Any]] | None = None
) -> Path | None:
    """The hook at the end of `silofl run` (`server.engines.run_job`): the artifact of a completed tabular run in
    its out-dir, or None for any other run (nothing loaded, nothing written).

    A failure here never fails the run, whose result.json is already written: it is logged with the command that
    writes the artifact later (`silofl model pack`). Without a preprocessing record (an image dataset), the artifact
    is written without one and says why.
    """
    from flwr.common.logger import log

    if not is_tabular_result(result) or not getattr(config, "out_dir", ""):
        return None
    run = Path(config.out_dir)
    try:
        preprocessing: Preprocessing | None
        preprocessing, source = simulation_preprocessing(config, node_configs)
    except (PreprocessingError, FileNotFoundError) as exc:
        preprocessing, source = None, f"none: {exc}"
    except (ValueError, OSError) as exc:
        preprocessing, source = None, f"none: the dataset could not be loaded again ({exc})"
    try:
        path = write_artifact(run, result, preprocessing, source)
    except (ArtifactError, OSError) as exc:
        log(WARNING, "no model artifact in %s: %s; write it with `silofl model pack %s`", run, exc, run)
        return None
    log(INFO, "model artifact: %s (silofl predict | evaluate | export %s)", path, run)
    return path


def pack(run_dir: str | Path, preprocessing_file: str | Path | None = None) -> Path:
    """`silofl model pack RUN [--preprocessing FILE]`: write RUN's artifact from its result.json and FILE (a deployed
    run: the preprocessing.json of the split its silos were trained on), or, without FILE, from the run's dataset
    loaded again as in simulation (a `silofl run` folder from before artifacts; a run under Flower's `flwr run` needs
    FILE: its silos may have held their own data). Returns the manifest's path."""
    run = Path(run_dir)
    result = read_result(run)
    if not is_tabular_result(result):
        raise ArtifactError(_not_tabular_message(run, result))
    if preprocessing_file is not None:
        preprocessing = Preprocessing.load(preprocessing_file)
        return write_artifact(run, result, preprocessing, str(Path(preprocessing_file).resolve()))
    if result.get("engine") not in ("inprocess", "ray"):
        raise ArtifactError(
            f"{run} ran under Flower ({result.get('engine')!r} engine: `flwr run`), whose silos may hold data of their "
            "own: give the preprocessing of the data they were trained on, --preprocessing DIR/preprocessing.json "
            "(`silofl data split` writes it beside the silo folders; for silos that simulated their partitions, "
            "`silofl data split` on the run's dataset, with its options, writes the same file)"
        )
    from silofl.protocols.config import RunConfig

    config = RunConfig.parse(result["config"])
    if str(config.dataset).lower().endswith((".csv", ".parquet")) and not Path(config.dataset).is_file():
        raise FileNotFoundError(
            f"{config.dataset}: the run's dataset is not there any more (relative paths start at {Path.cwd()}); run "
            "the command from where the run was started, or give --preprocessing FILE"
        )
    try:
        preprocessing, source = simulation_preprocessing(config)
    except PreprocessingError as exc:
        raise ArtifactError(f"{exc}; give --preprocessing FILE, the file `silofl data split` wrote") from exc
    return write_artifact(run, result, preprocessing, source)


def _not_tabular_message(run: Path, result: Mapping[str, Any]) -> str:
    config = result.get("config") or {}
    algorithm, model = config.get("algorithm"), config.get("model")
    if (run / "model.npz").is_file():
        return (
            f"{run} is a {algorithm} run: its model is an image encoder ({model}, in model.npz), not a classifier; "
            f"export it with `silofl export {run} --format onnx --out FILE`"
        )
    return f"{run}: the {algorithm} run's model ({model!r}) is not a logistic regression or MLP held in result.json"


def read_artifact(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray], Preprocessing | None]:
    """RUN's manifest, parameters (float32) and preprocessing (None when the artifact has none), checked: the
    format, the weights' sha256 against the manifest's, the parameter names and shapes. Every failure is an
    ArtifactError (or FileNotFoundError for a missing run folder) saying how to get a usable artifact."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder; give the folder `silofl run --out` wrote")
    path = run / MANIFEST_FILE
    if not path.is_file():
        result = read_result(run)
        if not is_tabular_result(result):
            raise ArtifactError(_not_tabular_message(run, result))
        raise ArtifactError(
            f"{run} has no model artifact ({MANIFEST_FILE}): the run predates model artifacts, stopped before its "
            f"end, or ran in a deployment. Write it with `silofl model pack {run}` (a simulated run: its dataset is "
            f"loaded again) or `silofl model pack {run} --preprocessing DIR/preprocessing.json` (the file `silofl "
            "data split` wrote beside the silo folders)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not a JSON file ({exc}); write it again with `silofl model pack {run}`") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a silofl model manifest (format {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path}: manifest format_version {manifest.get('format_version')!r}, this silofl reads {FORMAT_VERSION}; "
            f"write it again with `silofl model pack {run}`"
        )
    model = manifest["model"]
    weights = run / str(model["weights"])
    if not weights.is_file():
        raise ArtifactError(
            f"{weights}: missing; the manifest {path} needs it: `silofl model pack {run}` rewrites both"
        )
    data = weights.read_bytes()
    if hashlib.sha256(data).hexdigest() != model["weights_sha256"]:
        raise ArtifactError(
            f"{weights} is not the file {path} was written with (sha256 differs); `silofl model pack {run}` "
            "rewrites both"
        )
    try:
        arrays = load(data)
    except SafetensorError as exc:
        raise ArtifactError(f"{weights}: not a safetensors file ({exc})") from exc
    expected = [(p["name"], tuple(p["shape"])) for p in model["parameters"]]
    if sorted((k, tuple(a.shape)) for k, a in arrays.items()) != sorted(expected):
        raise ArtifactError(f"{weights}: parameters {list(arrays)} do not match the manifest's {expected}")
    ordered = {name: np.ascontiguousarray(arrays[name], dtype=np.float32) for name, _ in expected}
    preprocessing = None
    if manifest.get("preprocessing") is not None:
        try:
            preprocessing = Preprocessing.from_json(manifest["preprocessing"])
        except PreprocessingError as exc:
            raise ArtifactError(f"{path}: its preprocessing is malformed ({exc})") from exc
    return manifest, ordered, preprocessing
