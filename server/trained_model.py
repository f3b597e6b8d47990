"""Use a model silofl trained: `load_model(RUN)` -> :class:`TrainedModel` (`predict`, `predict_proba`, `evaluate`).

    from silofl.server.trained_model import load_model
    model = load_model("runs/20261126-steffle-loans")
    frame = pandas.read_csv("new_applicants.csv")
    model.predict(frame)              # label names, one per row
    model.predict_proba(frame)        # (n, num_labels) probabilities, columns in model.label_names order
    model.evaluate(frame, sensitive=["sex"]).to_json()   # accuracy and the fairness violations, by group

It reads the run's artifact (`server.model_artifact`: model.safetensors and model.json); raw rows are encoded by the
recorded preprocessing (`protocols.preprocessing`), exactly as the training data was, and scored by the same torch
module the silos evaluated (`protocols.models`). The metrics are silofl's own (`protocols.fairness_metrics`), named
in fairlearn's vocabulary: for two labels, with label index 1 the positive one, `demographic_parity_difference`,
`equalized_odds_difference` and `equal_opportunity_difference` are fairlearn's `demographic_parity_difference`,
`equalized_odds_difference` and `equal_opportunity_difference` on the same predictions (tested); for more labels
they are silofl's generalizations (the largest gap over every label taken in turn as the positive one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from silofl.protocols.fairness_metrics import MIN_SUPPORT, confusion_counts, fairness_from_counts, group_report
from silofl.protocols.preprocessing import (
    EncodedFrame,
    Preprocessing,
    PreprocessingError,
    Unseen,
    group_vocabulary,
    joint_group_names,
)
from silofl.server.model_artifact import ArtifactError, read_artifact

__all__ = ["ModelEvaluation", "TrainedModel", "load_model"]


@dataclass(frozen=True)
class ModelEvaluation:
    """Accuracy and fairness of a model on labelled rows, from the exact confusion counts by group.

    The three violations are over all groups; the ``*_min_support`` ones over `groups_kept`, the groups with at least
    `min_support` rows (0.0 with fewer than two: a small group's rates move by sampling alone; see
    `protocols.fairness_metrics`). `groups`: per group its
    ``support`` and rates (``selection_rate`` = P[prediction = label], ``true_positive_rate``,
    ``false_positive_rate``, each a list over the labels; for two labels index 1 is fairlearn's positive label), as
    `group_report` gives them, renamed.
    """

    n: int
    accuracy: float
    error: float
    demographic_parity_difference: float
    equalized_odds_difference: float
    equal_opportunity_difference: float
    sensitive_columns: tuple[str, ...]
    label_names: tuple[str, ...]
    min_support: int
    groups_kept: tuple[str, ...]
    demographic_parity_difference_min_support: float
    equalized_odds_difference_min_support: float
    equal_opportunity_difference_min_support: float
    groups: tuple[dict[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what `silofl evaluate --json` prints)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["sensitive_columns"] = list(self.sensitive_columns)
        out["label_names"] = list(self.label_names)
        out["groups_kept"] = list(self.groups_kept)
        out["groups"] = [dict(g) for g in self.groups]
        return out


class TrainedModel:
    """A trained logistic regression or MLP with its preprocessing; build it with :func:`load_model`."""

    def __init__(
        self,
        run_dir: Path,
        manifest: dict[str, Any],
        arrays: dict[str, np.ndarray],
        preprocessing: Preprocessing | None,
    ) -> None:
        from silofl.protocols.models import ModelError, build_model, set_parameters
        from silofl.server.model_artifact import user_code_importable

        spec = manifest["model"]
        self.run_dir = run_dir
        self.manifest = manifest
        self.preprocessing = preprocessing
        user_code_importable()  # a user's model (module:factory) is rebuilt by importing its factory again
        try:
            self.module = build_model(
                spec["kind"], int(spec["num_features"]), int(spec["num_labels"]), hidden=spec.get("hidden") or 64
            )
        except ModelError as exc:
            raise ArtifactError(
                f"{run_dir}: the run trained your model {spec['kind']!r}, which must be importable to use it: {exc}; "
                "run silofl from the folder that holds its module, or install it"
            ) from exc
        set_parameters(self.module, arrays)
        self.module.eval()

    @property
    def kind(self) -> str:
        """``logreg`` or ``mlp``."""
        return str(self.manifest["model"]["kind"])

    @property
    def num_features(self) -> int:
        return int(self.manifest["model"]["num_features"])

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(self.manifest["label_names"])

    @property
    def feature_names(self) -> tuple[str, ...] | None:
        names = self.manifest.get("feature_names")
        return None if names is None else tuple(names)

    @property
    def privacy(self) -> dict[str, Any]:
        """The run's privacy summary (epsilon, delta, mechanism, what is and is not protected)."""
        return dict(self.manifest["privacy"])

    def _require_preprocessing(self) -> Preprocessing:
        if self.preprocessing is None:
            why = self.manifest.get("preprocessing_source") or "none recorded"
            raise ArtifactError(
                f"the model in {self.run_dir} has no preprocessing ({why}), so raw rows cannot be encoded for it. A "
                f"deployed run: `silofl model pack {self.run_dir} --preprocessing DIR/preprocessing.json` (the file "
                "`silofl data split` wrote); an image model: feed it encoded rows (logits_of) or export it to ONNX"
            )
        return self.preprocessing

    def encode(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> EncodedFrame:
        """Raw rows encoded as the training data was: features, and labels / groups when their columns are there."""
        return self._require_preprocessing().encode(frame, unseen=unseen)

    def logits_of(self, features: np.ndarray) -> np.ndarray:
        """Logits float32 ``(n, num_labels)`` of ENCODED rows (float32 ``(n, num_features)``)."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise PreprocessingError(
                f"encoded rows must have shape (n, {self.num_features}), got {x.shape}; encode raw rows with encode()"
            )
        with torch.no_grad():
            return self.module(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    def predict_proba(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> np.ndarray:
        """Class probabilities float32 ``(n, num_labels)`` (softmax of the logits), columns in `label_names` order."""
        logits = self.logits_of(self.encode(frame, unseen=unseen).features)
        return torch.softmax(torch.from_numpy(logits), dim=1).numpy()

    def predict_indices(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> np.ndarray:
        """Predicted label indices int64 ``(n,)``: the argmax of the logits, as the silos' evaluation predicts."""
        return self.logits_of(self.encode(frame, unseen=unseen).features).argmax(axis=1).astype(np.int64)

    def predict(self, frame: pd.DataFrame, *, unseen: Unseen = "error") -> np.ndarray:
        """Predicted label names, one per row (object array)."""
        names = np.asarray(self.label_names, dtype=object)
        return names[self.predict_indices(frame, unseen=unseen)]

    def evaluate(
        self,
        frame: pd.DataFrame,
        *,
        sensitive: Sequence[str] | str | None = None,
        min_support: int = MIN_SUPPORT,
        unseen: Unseen = "error",
    ) -> ModelEvaluation:
        """Accuracy and the fairness violations on labelled raw rows (the target column is required).

        sensitive: the column(s) whose (joint) values form the groups; default the run's sensitive columns with the
        run's group names (a value the run did not know is refused). Other columns are grouped by the values found in
        `frame` (sorted as the training encoder sorts them), after the dataset reader's recoding (credit's SEX 1/2 are
        Male/Female whichever way the rows come).
        """
        preprocessing = self._require_preprocessing()
        columns = [sensitive] if isinstance(sensitive, str) else list(sensitive or preprocessing.sensitive_columns)
        if not columns:
            raise PreprocessingError("sensitive: name at least one column to group the rows by")
        if preprocessing.target.column not in frame.columns:
            raise PreprocessingError(
                f"the table has no target column {preprocessing.target.column!r}: evaluate needs the true labels; "
                "add the column (predict needs none)"
            )
        frame = preprocessing.recode(frame)  # other grouping columns read as the dataset's reader reads them
        features = preprocessing.encode_features(frame, unseen=unseen)
        labels = preprocessing.encode_labels(frame)
        if tuple(columns) == preprocessing.sensitive_columns:
            vocabulary = preprocessing.sensitive
        else:
            vocabulary = group_vocabulary(frame, columns)
        group_names = joint_group_names(vocabulary)
        groups = preprocessing.encode_groups(frame, vocabulary)
        predictions = self.logits_of(features).argmax(axis=1).astype(np.int64)
        counts = confusion_counts(groups, labels, predictions, len(group_names), len(self.label_names))
        overall = fairness_from_counts(counts)
        report = group_report(counts, min_support=min_support, group_names=list(group_names))
        renamed = tuple(
            {
                "name": g["name"],
                "support": g["support"],
                "label_support": g["label_support"],
                "selection_rate": g["prediction_rate"],
                "selection_rate_se": g["prediction_rate_se"],
                "true_positive_rate": g["hit_rate"],
                "false_positive_rate": g["false_rate"],
                "counts": g["counts"],
            }
            for g in report["groups"]
        )
        return ModelEvaluation(
            n=overall.n,
            accuracy=overall.accuracy,
            error=overall.error,
            demographic_parity_difference=overall.dp_violation,
            equalized_odds_difference=overall.eo_violation,
            equal_opportunity_difference=overall.eopp_violation,
            sensitive_columns=tuple(columns),
            label_names=self.label_names,
            min_support=int(report["min_support"]),
            groups_kept=tuple(report["groups_kept"]),
            demographic_parity_difference_min_support=float(report["dp_violation_min_support"]),
            equalized_odds_difference_min_support=float(report["eo_violation_min_support"]),
            equal_opportunity_difference_min_support=float(report["eopp_violation_min_support"]),
            groups=renamed,
        )


def load_model(run_dir: str | Path) -> TrainedModel:
    """The model of the run folder `run_dir` (its artifact, checked); an ArtifactError says how to write a missing
    one (`silofl model pack`)."""
    run = Path(run_dir)
    manifest, arrays, preprocessing = read_artifact(run)
    return TrainedModel(run, manifest, arrays, preprocessing)
