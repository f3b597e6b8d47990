"""A run's result (`result.json`) as typed pydantic models: :class:`RunResult` and its parts.

`silofl.server.result` builds a `RunResult` at the end of a run and writes it; plots, sweeps and the benchmarks'
tables read run folders back with :meth:`RunResult.load`, so every reader sees the same typed document instead of
digging through dicts.

What every algorithm writes is typed (the federation, a round's time and epsilon, the final metrics, the privacy
block and each silo's entry in it, timing, status, the fairness-group report); what an algorithm adds of its own is
kept as extra fields in the order written (SteFFLe's closed-form noise and FedSC's shares in `privacy`, a round's
evaluation metrics, `server_state`), so a result.json validates and writes back byte for byte (:meth:`RunResult.dumps`
is `json.dumps(indent=2, allow_nan=False)` of the fields present, in the order silofl writes them).

Presence: only `config` and `final` are required (every silofl version wrote both; a file without them is not a run's
result). The other blocks and the fields inside them are optional, typed when present: silofl versions before
`engine`, `status`, `server_state` or `fairness_groups` existed lack them, and a test's synthetic run folder holds only
what it needs. A field that was absent stays absent when written back (`exclude_unset`). An infinite epsilon is the
string "inf" (JSON has no infinity); :func:`as_float` reads it back as `math.inf`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, PlainValidator, StrictBool, StrictInt, StrictStr, ValidationError

#: The file a run folder holds its result in.
RESULT_FILE = "result.json"
#: The blocks every result.json has (the others are optional: older versions, partial files).
REQUIRED = frozenset({"config", "final"})
#: What `RunResult.load(..., skip=SUMMARY_SKIP)` leaves out: the per-round entries and the model arrays.
SUMMARY_SKIP = ("rounds", "model")


class RunResultError(ValueError):
    """A file that is not a silofl run result; the message names the file, the field and the fix."""


def _number(value: Any) -> int | float:
    """A JSON number as written (an int stays an int, so the file writes back the same); bool and text refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def _epsilon(value: Any) -> int | float | str:
    """A number, or "inf" (how result.json writes an infinite epsilon)."""
    if value == "inf" or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ValueError(f'expected a number or "inf", got {value!r}')


def _number_or_exact(value: Any) -> int | float | str:
    """A silo's evaluation noise: its std, or "exact" (it answered without noise)."""
    if value == "exact" or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ValueError(f'expected a noise std or "exact", got {value!r}')


def _model(value: Any) -> str | dict[str, Any]:
    """The model's arrays by name (nested lists), or the note saying where they are (model.npz)."""
    if not isinstance(value, str | dict):
        raise ValueError(f"expected the arrays by name or a note, got {type(value).__name__}")
    return value


def _config(value: Any) -> dict[str, Any]:
    """The run's config (kebab-case keys as `RunConfig.to_json` writes them); `algorithm`, where present, a name."""
    if not isinstance(value, dict):
        raise ValueError(f"expected the run's config as an object, got {type(value).__name__}")
    if "algorithm" in value and not isinstance(value["algorithm"], str):
        raise ValueError(f"config.algorithm must be an algorithm's name, got {value['algorithm']!r}")
    return value


#: A JSON number (int or float, kept as written); an epsilon also "inf"; a silo's evaluation noise also "exact".
Number = Annotated[int | float, PlainValidator(_number)]
Epsilon = Annotated[int | float | Literal["inf"], PlainValidator(_epsilon)]
NoiseOrExact = Annotated[int | float | Literal["exact"], PlainValidator(_number_or_exact)]


def as_float(value: Any) -> float:
    """A result value as a float: "inf" / "infinity" (an infinite epsilon as result.json stores it) is math.inf."""
    if isinstance(value, str):
        return math.inf if value.strip().lower() in {"inf", "infinity"} else float(value)
    return float(value)


class _Part(BaseModel):
    """A block of result.json: typed fields, and whatever an algorithm or another version adds kept in order."""

    model_config = ConfigDict(extra="allow")

    @property
    def extras(self) -> dict[str, Any]:
        """The fields this version does not type (an algorithm's own, or a round's evaluation metrics)."""
        return dict(self.model_extra or {})

    def get(self, name: str) -> Any:
        """A field, typed or extra, by its name in result.json; None when absent."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.model_extra or {}).get(name)

    def to_json(self) -> dict[str, Any]:
        """The block as result.json holds it: the fields present, in order."""
        return self.model_dump(exclude_unset=True)


class SiloEntry(_Part):
    """A party of the federation: `federation.silos` (`silo_id`) or `federation.sensitive_parties` (`party_id`)."""

    silo_id: StrictInt | None = None
    party_id: StrictInt | None = None
    node_id: StrictInt | None = None
    n_train: StrictInt | None = None
    n_test: StrictInt | None = None


class FederationInfo(_Part):
    """Who took part: the silos (and the sensitive parties of a topology other than silos), the data's shape, the
    number of rounds planned."""

    silos: list[SiloEntry] | None = None
    topology: StrictStr | None = None
    sensitive_parties: list[SiloEntry] | None = None
    num_features: StrictInt | None = None
    num_labels: StrictInt | None = None
    num_groups: StrictInt | None = None
    label_names: list[StrictStr] | None = None
    group_names: list[StrictStr] | None = None
    rounds: StrictInt | None = None


class RoundEntry(_Part):
    """One round: its number, wall seconds, learning rate and epsilon spent so far; the evaluation metrics of a round
    that evaluated (accuracy, error, loss, violations, knn_accuracy, ..., as the algorithm reports them) are extras."""

    round: StrictInt | None = None
    seconds: Number | None = None
    lr: Number | None = None
    epsilon_spent: Epsilon | None = None


class FinalMetrics(_Part):
    """The last evaluation's metrics (None for one the algorithm does not compute: FedSC has no violation); other
    metrics an algorithm reports are extras."""

    accuracy: Number | None = None
    error: Number | None = None
    loss: Number | None = None
    dp_violation: Number | None = None
    eo_violation: Number | None = None
    eopp_violation: Number | None = None
    knn_accuracy: Number | None = None
    probe_train_accuracy: Number | None = None

    def has(self, metric: str) -> bool:
        """Whether `metric` was recorded as a finite number."""
        value = self.get(metric)
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class SiloPrivacy(_Part):
    """One silo's accounting: its ledger's epsilon, noise multiplier, sampling rate, records and rounds answered;
    what an algorithm adds per silo (SteFFLe's shuffled epochs) are extras."""

    epsilon_spent: Epsilon | None = None
    noise_multiplier: Number | None = None
    sampling_rate: Number | None = None
    n_train: StrictInt | None = None
    rounds_answered: StrictInt | None = None


class PrivacyReport(_Part):
    """The privacy block: target and spent epsilon (the largest silo ledger's, or the algorithm's own report), delta,
    each silo's accounting, the accountant, mechanism and what it does not cover, and how each silo answered the last
    evaluation; the algorithm's report (relation, sampling, closed form, ...) is extras."""

    epsilon_target: Epsilon | None = None
    epsilon_spent: Epsilon | None = None
    delta: Number | None = None
    per_silo: dict[str, SiloPrivacy] | None = None
    accountant: StrictStr | None = None
    mechanism: StrictStr | None = None
    not_covered: StrictStr | None = None
    evaluation: dict[str, NoiseOrExact] | None = None

    @property
    def spent(self) -> float:
        """The epsilon spent as a float (math.inf for no noise, or when the file does not say)."""
        return math.inf if self.epsilon_spent is None else as_float(self.epsilon_spent)


class Timing(_Part):
    """Wall seconds of the whole run and per round (setup and data loading excluded)."""

    total_seconds: Number | None = None
    seconds_per_round: Number | None = None


class RunStatus(_Part):
    """How the run ended: completed, interrupted (Ctrl-C) or stopped (an error), after how many rounds, and the
    checkpoint to resume from."""

    completed: StrictBool | None = None
    state: StrictStr | None = None
    rounds_completed: StrictInt | None = None
    error: StrictStr | None = None
    resumed_from: StrictInt | None = None
    checkpoint: StrictStr | None = None


class GroupRates(_Part):
    """One sensitive group at the last evaluation: its test support and rates per label (None: undefined)."""

    name: StrictStr | None = None
    support: StrictInt | None = None
    label_support: list[StrictInt] | None = None
    prediction_rate: list[Number | None] | None = None
    prediction_rate_se: list[Number | None] | None = None
    hit_rate: list[Number | None] | None = None
    false_rate: list[Number | None] | None = None
    counts: list[list[Number]] | None = None  # (true label, predicted label); noised counts are floats


class FairnessGroups(_Part):
    """Each sensitive group's support and rates at the last evaluation, and the violations over all groups and over
    the groups with at least `min_support` test records (`protocols.fairness_metrics.group_report`)."""

    label_names: list[StrictStr] | None = None
    min_support: StrictInt | None = None
    groups_kept: list[StrictStr] | None = None
    dp_violation: Number | None = None
    eo_violation: Number | None = None
    eopp_violation: Number | None = None
    dp_violation_min_support: Number | None = None
    eo_violation_min_support: Number | None = None
    eopp_violation_min_support: Number | None = None
    groups: list[GroupRates] | None = None


class RunResult(_Part):
    """A run's `result.json`: config, engine, federation, rounds, final metrics, privacy, timing, model, the
    strategy's server state, the fairness-group report and the status, in the order silofl writes them."""

    config: Annotated[dict[str, Any], PlainValidator(_config)]
    engine: StrictStr | None = None
    federation: FederationInfo | None = None
    rounds: list[RoundEntry] | None = None
    final: FinalMetrics
    privacy: PrivacyReport | None = None
    timing: Timing | None = None
    model: Annotated[str | dict[str, Any], PlainValidator(_model)] | None = None
    server_state: dict[str, Any] | None = None
    fairness_groups: FairnessGroups | None = None
    status: RunStatus | None = None

    @property
    def algorithm(self) -> str:
        """The algorithm's name as the config records it ("" when it does not)."""
        return str(self.config.get("algorithm", ""))

    @property
    def completed(self) -> bool:
        """Whether the run finished its rounds. A result without `status` was written by a version that wrote
        result.json only for a completed run."""
        return True if self.status is None or self.status.completed is None else self.status.completed

    def dumps(self) -> str:
        """result.json's text: the fields present, in order, indented by 2, no NaN or infinity (a ValueError)."""
        return json.dumps(self.to_json(), indent=2, allow_nan=False)

    def write(self, out_dir: Path) -> Path:
        """Write `out_dir`/result.json atomically (a temporary file renamed over it); return its path."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / RESULT_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.dumps())
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, document: Any, source: str | Path = RESULT_FILE) -> RunResult:
        """Validate a parsed result.json (`source` names it in the error)."""
        if isinstance(document, RunResult):
            return document
        if not isinstance(document, Mapping):
            raise RunResultError(
                f"{source}: not a silofl run result: expected a JSON object with `config` and `final`, got "
                f"{type(document).__name__}"
            )
        try:
            return cls.model_validate(document)
        except ValidationError as exc:
            raise RunResultError(_describe(exc, source)) from None

    @classmethod
    def load(cls, path: str | Path, *, skip: Collection[str] = ()) -> RunResult:
        """The result in a run folder (its result.json) or in a result.json file; a RunResultError naming the file
        and the field when it is missing, not JSON, or not a silofl run result.

        `skip`: top-level blocks left out, unread and unvalidated, as if the file had none (e.g. `SUMMARY_SKIP`: the
        per-round entries and the model arrays, the bulk of a long run's file, for readers of many runs)."""
        if REQUIRED & set(skip):
            raise ValueError(f"skip={sorted(skip)!r}: {' and '.join(sorted(REQUIRED))} are always read")
        path = Path(path)
        file = path / RESULT_FILE if path.is_dir() else path
        try:
            text = file.read_text()
        except FileNotFoundError:
            where = f"{path} holds no {RESULT_FILE}" if path.is_dir() else f"{file} does not exist"
            raise RunResultError(
                f"{where}: a run folder has one once `silofl run ... --out DIR` (or a sweep) ends; give a run folder "
                "or its result.json"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RunResultError(f"{file}: not readable ({exc})") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunResultError(
                f"{file}: not a silofl run result: not valid JSON ({exc}); a half-written file is from a run that "
                "was killed: rerun it"
            ) from None
        if skip and isinstance(document, dict):
            document = {k: v for k, v in document.items() if k not in skip}
        return cls.from_json(document, file)


def _describe(exc: ValidationError, source: str | Path) -> str:
    """The validation errors as `field.path: what is wrong` (the first three), with the fix."""
    parts = []
    for error in exc.errors()[:3]:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".") or "(top)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "missing (every silofl result.json has it)"
        elif error["type"] not in ("value_error",) and "input" in error:
            message += f", got {error['input']!r}"[:160]
        parts.append(f"field `{field}`: {message}")
    more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return (
        f"{source}: not a silofl run result: {'; '.join(parts)}{more}. A result.json is written by `silofl run` "
        "(or a sweep): fix that field, or remove the file and rerun the run"
    )
