"""`silofl export RUN --format onnx --out FILE`: a run's model as an ONNX file, checked against torch before it is kept.

Two kinds of run have a model to export:

* a tabular run (logistic regression or MLP, its artifact `model.json` + `model.safetensors`): input ``features``,
  float32 ``(batch, num_features)``, the ENCODED row (one-hot and z-scored as the manifest's ``preprocessing`` says:
  `protocols.preprocessing.Preprocessing.encode_features` produces it); outputs ``logits`` and ``probabilities``
  (softmax), float32 ``(batch, num_labels)``, columns in the manifest's ``label_names`` order. The preprocessing is
  NOT in the ONNX file: it stays the manifest's JSON (it is not differentially private, and an ONNX file travels
  further than a run folder);
* a FedSC / FedAvg+SC run (its encoder in model.npz beside result.json): input ``pixels``, float32
  ``(batch, C*H*W)``, a flattened image with values in [0, 1] (the loaders' layout: `protocols.ssl_models`); outputs
  ``features`` (the backbone's, what the linear probe and the kNN monitor read) and ``z`` (the projector's
  representation). A user's encoder (``--model module:factory``) is built again by importing its factory
  (`protocols.ssl_encoder`): the module must be importable where `silofl export` runs.

The batch dimension is dynamic. The exporter is torch's `torch.export`-based one (`torch.onnx.export(dynamo=True)`,
which needs `onnxscript`); it runs offline. Every export is run once with onnxruntime on random inputs and compared to
torch (largest absolute difference at most :data:`TOLERANCE`) before the file is moved into place. The file carries
a few `metadata_props` (``silofl.*``: algorithm, model kind, input and output meaning, epsilon and delta, the label
names). `onnx`, `onnxscript` and `onnxruntime` are the `export` extra (`pip install "silofl[export]"`; the `dev`
extra has them).
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from silofl.server.model_artifact import (
    MANIFEST_FILE,
    ArtifactError,
    is_tabular_result,
    read_result,
    user_code_importable,
)

__all__ = ["TOLERANCE", "ExportReport", "export_onnx"]

#: Largest absolute difference between onnxruntime's and torch's outputs that an export may show.
TOLERANCE = 1e-5
_CHECK_ROWS = 64


@dataclass(frozen=True)
class ExportReport:
    """What was exported: the file, its input and outputs, and the largest difference to torch on the check rows."""

    path: Path
    input_name: str
    input_width: int
    output_names: tuple[str, ...]
    max_abs_diff: float
    what: str


class _Scores(nn.Module):
    """A tabular model with two outputs: its logits and their softmax."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(features)
        return logits, torch.softmax(logits, dim=-1)


class _Encoder(nn.Module):
    """An SSL model with two outputs: the backbone's features and the projector's z."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.model.features(pixels)
        return features, self.model.projector(features)


def _require_exporter() -> None:
    missing = []
    for module in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ArtifactError(
            f"ONNX export needs {', '.join(missing)}: install the export extra (pip install -e '.[export]' in a "
            "checkout, or pip install onnx onnxscript onnxruntime)"
        )


def _tabular(run: Path) -> tuple[nn.Module, str, int, tuple[str, ...], dict[str, str], str, np.ndarray]:
    from silofl.server.trained_model import load_model

    model = load_model(run)
    manifest = model.manifest
    meta = {
        "silofl.model_kind": model.kind,
        "silofl.input": "features: encoded rows, float32 (batch, num_features), one-hot and z-scored as the run's "
        f"{MANIFEST_FILE} 'preprocessing' says (not embedded here)",
        "silofl.outputs": "logits, probabilities (softmax), float32 (batch, num_labels)",
        "silofl.label_names": json.dumps(list(model.label_names)),
    }
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((_CHECK_ROWS, model.num_features)).astype(np.float32)
    what = f"{manifest['run']['algorithm']} {model.kind} ({model.num_features} encoded features)"
    return _Scores(model.module), "features", model.num_features, ("logits", "probabilities"), meta, what, sample


def _encoder(
    run: Path, result: dict[str, Any]
) -> tuple[nn.Module, str, int, tuple[str, ...], dict[str, str], str, np.ndarray]:
    from silofl.protocols.model_names import check_ssl_model_name, is_custom_model
    from silofl.protocols.models import ModelError
    from silofl.protocols.ssl_models import build_ssl_model, image_shape

    config, federation = result["config"], result["federation"]
    try:
        check_ssl_model_name(config.get("model"))
    except ValueError:
        raise ArtifactError(
            f"{run}: the {config.get('algorithm')} run's model {config.get('model')!r} is neither a tabular model nor "
            "an image encoder; silofl cannot export it"
        ) from None
    npz = run / "model.npz"
    if not npz.is_file():
        raise ArtifactError(f"{npz}: missing; a {config.get('algorithm')} run keeps its encoder there: rerun it")
    width = int(federation["num_features"])
    if is_custom_model(config["model"]):
        user_code_importable()
    try:
        model = build_ssl_model(
            config["model"],
            image_shape(width),
            projection_dim=int(config.get("projection-dim", 128)),
            width=int(config.get("width", 1)),
        )
    except ModelError as exc:
        raise ArtifactError(
            f"{run}: the run trained your own encoder, which silofl export builds again to load model.npz into it: "
            f"{exc}"
        ) from None
    from silofl.protocols.models import set_parameters

    with np.load(npz) as stored:
        try:
            set_parameters(model, {name: stored[name] for name in stored.files})
        except ValueError as exc:
            raise ArtifactError(f"{npz} does not fit the run's {config['model']} encoder: {exc}") from exc
    model.eval()
    meta = {
        "silofl.model_kind": str(config["model"]),
        "silofl.input": f"pixels: float32 (batch, {width}), a flattened {image_shape(width)} image, values in [0, 1]",
        "silofl.outputs": "features (backbone, for a linear probe or kNN), z (projector representation)",
    }
    sample = np.random.default_rng(0).random((_CHECK_ROWS, width), dtype=np.float32)
    what = f"{config.get('algorithm')} {config['model']} encoder ({width} pixels -> {model.feature_dim} features)"
    return _Encoder(model), "pixels", width, ("features", "z"), meta, what, sample


def export_onnx(run_dir: str | Path, out: str | Path) -> ExportReport:
    """Export RUN's model to the ONNX file `out` (see the module docstring); raises ArtifactError when RUN has no
    exportable model or the exported file does not reproduce torch."""
    _require_exporter()
    import onnx
    import onnxruntime as ort

    run = Path(run_dir)
    result = read_result(run)
    if is_tabular_result(result):
        module, input_name, width, outputs, meta, what, sample = _tabular(run)
    else:
        module, input_name, width, outputs, meta, what, sample = _encoder(run, result)
    privacy = result.get("privacy") or {}
    meta.update(
        {
            "silofl.algorithm": str(result["config"].get("algorithm")),
            "silofl.epsilon_spent": str(privacy.get("epsilon_spent")),
            "silofl.delta": str(privacy.get("delta")),
            "silofl.run": str(run.resolve()),
        }
    )
    out = Path(out)
    if out.suffix.lower() != ".onnx":
        raise ArtifactError(f"--out {out}: give a file name ending in .onnx")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: the folder {out.parent} does not exist; create it first")
    module.eval()
    example = torch.from_numpy(sample[:2])
    tmp = out.with_name(out.name + ".tmp")
    with warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            input_names=[input_name],
            output_names=list(outputs),
            dynamic_shapes=({0: torch.export.Dim.DYNAMIC},),
            external_data=False,
            verbose=False,
        )
        if program is None:  # pragma: no cover - dynamo=True always returns a program
            raise ArtifactError("torch.onnx.export returned no program")
        proto = program.model_proto
    for value_info in (*proto.graph.input, *proto.graph.output):  # the dynamic dimension's name, for readers
        value_info.type.tensor_type.shape.dim[0].dim_param = "batch"
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    tmp.write_bytes(proto.SerializeToString())
    try:
        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        got = session.run(list(outputs), {input_name: sample})
        with torch.no_grad():
            want = [t.numpy() for t in module(torch.from_numpy(sample))]
        diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
        if not diff <= TOLERANCE:
            raise ArtifactError(
                f"the ONNX export of {run} differs from torch by {diff:.2e} (> {TOLERANCE:g}) on random inputs; "
                "the file was not written (a bug: report it with the run folder)"
            )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    return ExportReport(out, input_name, width, tuple(outputs), diff, what)


class _quiet_exporter:
    """Silence torch's ONNX exporter's logging (e.g. 'torchvision is not installed') for the duration of a block."""

    _names = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")

    def __enter__(self) -> None:
        self._levels = {}
        for name in self._names:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
