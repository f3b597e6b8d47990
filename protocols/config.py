"""The run configuration: what a user asks for, validated once at the boundary.

The same model validates every way a run is described: `silofl run` flags, the `[tool.flwr.app.config]` table of
`pyproject.toml` and `flwr run . --run-config` overrides (Flower passes them to the ServerApp as
`context.run_config`, with kebab-case keys). An unknown, missing or out-of-range key is a :class:`ConfigError` that
names the key and the allowed values, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

Algorithm = Literal["fedavg", "dp-fedsgd", "steffle", "mu2fl", "noisy-sgd", "fedsc", "fedavg-sc", "tran"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
#: Algorithms whose silos add Gaussian noise and keep a privacy ledger.
PRIVATE_ALGORITHMS: frozenset[str] = frozenset({"dp-fedsgd", "steffle", "mu2fl", "noisy-sgd", "fedsc", "tran"})
#: Federated self-supervised learning (spectral contrastive): FedSC and its baseline FedAvg+SC.
SSL_ALGORITHMS: frozenset[str] = frozenset({"fedsc", "fedavg-sc"})
#: Single-pass convex algorithms on logistic regression (DP-mu2-FL and its noisy-SGD baseline).
SINGLE_PASS_ALGORITHMS: frozenset[str] = frozenset({"mu2fl", "noisy-sgd"})
Partition = Literal["iid", "attribute", "classes", "dirichlet"]
ModelKind = Literal["logreg", "mlp", "cnn", "resnet20"]
#: Backbones of the self-supervised algorithms (`protocols.ssl_models`).
SSL_MODELS: frozenset[str] = frozenset({"cnn", "resnet20"})
CalrRelation = Literal["replace_one", "add_remove"]
ServerOptimizer = Literal["avg", "adam"]
Device = Literal["cpu", "cuda", "auto"]
EvalData = Literal["central", "none"]
Accountant = Literal["rdp", "pld", "best"]
Fairness = Literal["dp", "eo", "eopp"]
Trust = Literal["untrusted", "trusted"]
#: Built-in datasets (the silo's loaders, `client.data.loaders.BUILTIN_DATASETS`, serve exactly these).
BUILTIN_DATASETS: tuple[str, ...] = (
    "adult",
    "credit",
    "parkinsons",
    "synthetic",
    "mnist",
    "fashion-mnist",
    "digits",
    "cifar10",
)


class ConfigError(ValueError):
    """A run configuration that cannot be run; the message names each bad key and what it accepts."""


class RunConfig(BaseModel):
    """Everything needed to (re)run one federated job. Field names are the run-config keys with `-` for `_`."""

    # allow_inf_nan=False: NaN and infinity are refused for every number except where a field allows them (epsilon)
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=lambda s: s.replace("_", "-"),
        allow_inf_nan=False,
    )

    algorithm: Algorithm
    dataset: str = Field(default="synthetic", min_length=1, description="builtin name or path to a .csv/.parquet file")
    data_dir: str = Field(default="", description="folder with the datasets; empty: $SILOFL_DATA_DIR")
    target: str = Field(default="", description="label column of a CSV/Parquet dataset")
    sensitive: str = Field(default="", description="comma-separated sensitive column(s) of a CSV/Parquet dataset")
    features: str = Field(default="", description="comma-separated feature columns; empty: all other columns")
    num_silos: int = Field(default=3, ge=1, le=1000)
    partition: Partition = "iid"
    heterogeneity: float = Field(default=0.0, ge=0.0, le=1.0)
    classes_per_silo: int = Field(default=2, ge=1)
    dirichlet_alpha: float = Field(default=0.5, gt=0.0)
    max_train_records: int = Field(
        default=0, ge=0, description="cap on each silo's training records (seeded subsample); 0: all"
    )
    model: ModelKind = "logreg"
    hidden: int = Field(default=64, ge=1, le=65536)
    rounds: int = Field(default=0, ge=0, le=10_000_000, description="communication rounds; 0: derived from epochs")
    epochs: float = Field(default=0.0, ge=0.0, le=100_000, description="passes over the data; 0: use rounds")
    batch_size: int = Field(default=256, ge=1, description="expected records per silo per step (Poisson rate m / n_j)")
    lr: float = Field(default=0.5, gt=0.0, le=1e4)
    lr_decay: float = Field(default=1.0, gt=0.0, le=1.0, description="factor applied every lr-decay-epochs")
    lr_decay_epochs: float = Field(default=0.0, ge=0.0, description="0: constant learning rate")
    local_epochs: int = Field(default=1, ge=1, le=1000, description="fedavg: local passes per round")
    clip: float = Field(default=1.0, gt=0.0, description="per-sample gradient L2 clip norm C")
    fairness: Fairness = Field(default="dp", description="steffle: demographic parity, equalized odds, equal opp.")
    lam: float = Field(
        default=1.0,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="steffle: weight of the ERMI term; tran: initial value of every Lagrange multiplier",
    )
    w_radius: float = Field(default=2.0, gt=0.0, description="steffle: radius D of the ball W is projected onto")
    w_lr: float = Field(default=0.1, gt=0.0, le=1e4, description="steffle: ascent step size of W")
    dual_lr: float = Field(default=0.01, ge=0.0, le=1e4, description="tran: dual ascent step s of the multipliers")
    counts_share: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="steffle: share of each silo's epsilon spent on its group counts"
    )
    trust: Trust = Field(default="untrusted", description="mu2fl: noise at the silos (untrusted) or at the server")
    rho: float = Field(
        default=0.0, ge=0.0, description="mu2fl: the paper's rho ((alpha, alpha rho^2/2)-RDP); 0: use epsilon"
    )
    domain_diameter: float = Field(
        default=0.1, gt=0.0, description="mu2fl: diameter D of the ball K the iterates stay in"
    )
    projection_dim: int = Field(default=128, ge=1, le=8192, description="fedsc: dimension H of the representation z")
    width: int = Field(default=1, ge=1, le=64, description="fedsc: backbone width multiplier (resnet20 x8: 512-d)")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="fedsc: local SGD momentum")
    weight_decay: float = Field(default=5e-4, ge=0.0, description="fedsc: local SGD weight decay")
    grad_clip: float = Field(default=3.0, gt=0.0, description="fedsc: local gradient-norm clip (not a DP clip)")
    mu: float = Field(default=4.0, gt=0.0, description="fedsc: representations are clipped to norm sqrt(mu)")
    views: int = Field(default=2, ge=1, le=64, description="fedsc: augmented views per record in DP-CalR")
    alpha_start: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="fedsc: alpha at the first share (paper eq. 80: 1; q_j = 1/num-silos for equal silos is eq. 6's "
        "exact weight)",
    )
    alpha_end: float = Field(
        default=0.2, ge=0.0, le=1.0, description="fedsc: alpha decays linearly from alpha-start to this (eq. 80)"
    )
    share_start: int = Field(default=1, ge=1, description="fedsc: first round the silos share correlation matrices")
    share_every: int = Field(default=1, ge=1, description="fedsc: rounds between two shares")
    participation: float = Field(
        default=1.0, gt=0.0, le=1.0, description="fedsc: fraction of silos sampled per round (all in round 1)"
    )
    calr_sampling_rate: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="fedsc: each DP-CalR share uses a Poisson sample of the silo's records at this rate (accounted as "
        "a subsampled Gaussian); 1: every record (the paper)",
    )
    local_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="fedsc: minibatch steps per round (batches drawn without replacement, reshuffled when the silo's "
        "records run out); 0: local-epochs passes",
    )
    server_optimizer: ServerOptimizer = Field(
        default="avg",
        description="fedsc: 'avg' = the new model is the mean of the silos' models (FedAvg, the paper); 'adam' = "
        "Adam at the server on the mean update (FedAdam, Reddi et al. 2021) with server-lr",
    )
    server_lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="fedsc: learning rate of server-optimizer adam")
    calr_relation: CalrRelation = Field(
        default="replace_one", description="fedsc: neighbouring relation of DP-CalR's sensitivity"
    )
    eval_data: EvalData = Field(
        default="central",
        description="fedsc: 'central' = linear probe and kNN on the dataset's train/test split at the server "
        "(the paper's protocol; simulation or a server with its own copy); 'none' = no evaluation",
    )
    device: Device = Field(
        default="cpu", description="fedsc: torch device of silo training and evaluation; auto: cuda if available"
    )
    probe_epochs: int = Field(default=30, ge=1, le=10_000, description="fedsc: linear-probe epochs (Adam 3e-3)")
    knn_k: int = Field(default=200, ge=1, description="fedsc: neighbours of the kNN monitor")
    knn_tau: float = Field(default=0.1, gt=0.0, description="fedsc: temperature of the kNN monitor")
    epsilon: float = Field(
        default=math.inf, gt=0.0, allow_inf_nan=True, description="target epsilon per silo; inf: no noise"
    )
    delta: float = Field(default=0.0, ge=0.0, lt=1.0, description="target delta; 0: 1/n^2 with n the training records")
    accountant: Accountant = "best"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    eval_every: int = Field(default=0, ge=0, description="rounds between federated evaluations; 0: about 20 in a run")
    round_timeout: float = Field(default=600.0, gt=0.0, description="seconds to wait for the silos' replies")
    out_dir: str = Field(default="", description="where result.json is written; empty: do not write")
    checkpoint_every: int = Field(
        default=0,
        ge=0,
        description="rounds between server checkpoints in out-dir; 0: after a round once 2 s have passed since the "
        "last (server/checkpoint.py)",
    )
    resume: bool = Field(default=False, description="continue the run from the checkpoint in out-dir (same config)")

    @field_validator("epsilon", mode="before")
    @classmethod
    def _parse_infinity(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in {"inf", "infinity", "none"}:
            return math.inf
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1: `rounds = true` would silently run one round
        if isinstance(value, bool) and cls.model_fields[info.field_name].annotation in (int, float):
            raise ValueError("a boolean is not a number: give the value itself")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        if self.rounds and self.epochs:
            raise ValueError("give either 'rounds' or 'epochs', not both (set the other to 0)")
        if not self.rounds and not self.epochs:
            raise ValueError("give 'rounds' (communication rounds) or 'epochs' (passes over each silo's data)")
        if self.algorithm in SSL_ALGORITHMS and self.model not in SSL_MODELS:
            raise ValueError(
                f"{self.algorithm} learns representations of images: 'model' must be one of {sorted(SSL_MODELS)} "
                f"(got {self.model!r})"
            )
        if self.algorithm not in SSL_ALGORITHMS and self.model in SSL_MODELS:
            raise ValueError(f"model {self.model!r} is a self-supervised backbone: use it with fedsc or fedavg-sc")
        if self.algorithm in SINGLE_PASS_ALGORITHMS and self.model != "logreg":
            raise ValueError(
                f"{self.algorithm} is for convex losses: 'model' must be 'logreg' (multinomial logistic regression)"
            )
        if self.rho and self.algorithm not in SINGLE_PASS_ALGORITHMS:
            raise ValueError(f"'rho' applies to mu2fl and noisy-sgd only, not {self.algorithm!r}; use 'epsilon'")
        if self.rho and math.isfinite(self.epsilon):
            raise ValueError(f"give either 'rho' or 'epsilon' for {self.algorithm}, not both")
        if self.algorithm not in PRIVATE_ALGORITHMS and not math.isinf(self.epsilon):
            raise ValueError(
                f"'epsilon' = {self.epsilon} was given but algorithm '{self.algorithm}' adds no noise; "
                f"use one of {sorted(PRIVATE_ALGORITHMS)} or drop 'epsilon'"
            )
        is_file = self.dataset.endswith((".csv", ".parquet"))
        if not is_file and self.dataset not in BUILTIN_DATASETS:
            raise ValueError(
                f"'dataset' = {self.dataset!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}) nor a "
                ".csv/.parquet file"
            )
        if not is_file and (self.target or self.sensitive or self.features):
            raise ValueError("'target', 'sensitive' and 'features' apply only to a .csv/.parquet 'dataset'")
        if self.dataset.endswith((".csv", ".parquet")) and not (self.target and self.sensitive):
            raise ValueError(f"dataset '{self.dataset}' is a file: also give 'target' and 'sensitive' columns")
        return self

    @property
    def private(self) -> bool:
        """Whether the silos add noise (a finite epsilon on a private algorithm)."""
        return self.algorithm in PRIVATE_ALGORITHMS and (math.isfinite(self.epsilon) or self.rho > 0)

    def to_run_config(self) -> dict[str, str | int | float | bool]:
        """Flower run-config form (kebab-case keys, only scalars; infinity as the string 'inf')."""
        out: dict[str, str | int | float | bool] = {}
        for key, value in self.model_dump(by_alias=True).items():
            out[key] = "inf" if isinstance(value, float) and math.isinf(value) else value
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (the `config` block of result.json); `RunConfig.parse(...)` reads it back."""
        return self.to_run_config()

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> RunConfig:
        """Validate a run config; raise :class:`ConfigError` naming each bad key and what it accepts."""
        if not isinstance(values, Mapping):
            kind = type(values).__name__
            raise ConfigError(f"invalid run configuration: expected a table of key = value, got {kind}")
        try:
            return cls.model_validate(dict(values))
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None


def allowed_values(key: str) -> str:
    """Human description of what run-config key `key` accepts (for error messages and `--help`)."""
    name = key.replace("-", "_")
    field = RunConfig.model_fields.get(name)
    if field is None:
        return "one of the keys " + ", ".join(
            sorted(RunConfig.model_fields[f].alias or f for f in RunConfig.model_fields)
        )
    choices = get_args(field.annotation)
    if choices and all(isinstance(c, str) for c in choices):
        return "one of " + ", ".join(repr(c) for c in choices)
    bounds = []
    for meta in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >=")):
            if getattr(meta, attr, None) is not None:
                bounds.append(f"{sym} {getattr(meta, attr)}")
    kind = getattr(field.annotation, "__name__", str(field.annotation))
    text = f"{kind} " + " and ".join(bounds) if bounds else kind
    return text + (f" ({field.description})" if field.description else "")


def _explain(exc: ValidationError) -> str:
    lines = ["invalid run configuration:"]
    known = sorted((RunConfig.model_fields[f].alias or f) for f in RunConfig.model_fields)
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            close = _closest(key, known)
            hint = f" (did you mean '{close}'?)" if close else ""
            lines.append(f"  - unknown key '{key}'{hint}; known keys: {', '.join(known)}")
        elif err["type"] == "missing":
            lines.append(f"  - missing key '{key}': give {allowed_values(key)}")
        elif not key:
            lines.append(f"  - {err['msg'].removeprefix('Value error, ')}")
        else:
            problem = err["msg"].removeprefix("Value error, ")
            lines.append(f"  - key '{key}' = {err.get('input')!r}: {problem}; allowed: {allowed_values(key)}")
    return "\n".join(lines)


def _closest(key: str, known: list[str]) -> str | None:
    """The known key `key` is most likely a typo of: a close spelling (difflib), else one containing it."""
    norm = key.lower().replace("_", "-")
    close = difflib.get_close_matches(norm, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    return next((k for k in known if len(norm) > 3 and _similar(k, key)), None)


def _similar(a: str, b: str) -> bool:
    a, b = a.lower().replace("_", "-"), b.lower().replace("_", "-")
    return a == b or (len(a) > 3 and (a in b or b in a))
