"""Run options, declared once, in groups that algorithms compose.

Each group is a pydantic model of run-config keys (field `lam` is the key `lambda`, `batch_size` is `batch-size`). An
algorithm's registry entry (:mod:`protocols.algorithms`) lists the groups it reads and the defaults that suit it; from
that one declaration silofl derives the algorithm's run configuration (:class:`protocols.config.RunConfig`
subclass), its `silofl run ALG` flags, its keys in `flwr run --run-config` and sweep files, and the train instruction
its silos receive (the fields marked :data:`SILO`).

:class:`CommonOptions` are every algorithm's: where the data is and how it is split across silos, how long the run is,
the seed, evaluation and fault handling.
"""

from __future__ import annotations

import codecs
import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from silofl.protocols.devices import Device
from silofl.protocols.fairness_metrics import MIN_SUPPORT
from silofl.protocols.messages import MAX_SERVER_VALUE
from silofl.protocols.model_names import MODEL_HELP, SSL_MODEL_HELP, check_ssl_model_name, check_tabular_model_name

#: `json_schema_extra` of a field that the silos receive in every train instruction (:mod:`protocols.messages`).
SILO: dict[str, Any] = {"silo": True}

Partition = Literal["iid", "attribute", "classes", "dirichlet"]
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
#: The built-in tabular datasets: their sensitive and feature columns may be chosen (`sensitive`, `features`); their
#: target is fixed. The image datasets have no sensitive attribute (one group) and take neither.
TABULAR_BUILTINS: tuple[str, ...] = ("adult", "credit", "parkinsons", "synthetic")


def is_silo_field(info: Any) -> bool:
    """Whether a field is sent to the silos in the train instruction."""
    extra = getattr(info, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("silo"))


class OptionGroup(BaseModel):
    """Base of every option group: kebab-case keys, unknown keys refused, NaN and infinity refused unless a field
    allows them (epsilon), booleans refused where a number is expected (`rounds = true` would run one round)."""

    #: The group's title in `silofl run ALG --help`.
    heading: ClassVar[str] = "options"

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=lambda s: s.replace("_", "-"),
        allow_inf_nan=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError("a boolean is not a number: give the value itself")
        return value


def csv_separator(value: str) -> str:
    """`csv-sep` checked: one character that can separate fields ('tab' and a typed '\\t' mean a tab), or "" to
    detect it. pandas would read a longer separator as a regular expression. Raises ValueError."""
    value = "\t" if value.lower() in ("tab", "\\t") else value
    if len(value) > 1 or value.isalnum() or value in ('"', "\n", "\r"):
        raise ValueError(
            "give one character that is not a letter, a digit, a quote or a line break (e.g. ';' or tab), or nothing "
            "to detect it"
        )
    return value


def csv_encoding(value: str) -> str:
    """`csv-encoding` checked: an encoding Python knows, or "" to detect it. Raises ValueError."""
    if value:
        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError("not an encoding Python knows; e.g. utf-8, latin-1, cp1252") from None
    return value


class DataOptions(OptionGroup):
    """Which data, and how it is dealt to the silos when they are simulated."""

    heading: ClassVar[str] = "data and simulated silos"

    dataset: str = Field(default="synthetic", min_length=1, description="builtin name or path to a .csv/.parquet file")
    data_dir: str = Field(default="", description="folder with the datasets; empty: $SILOFL_DATA_DIR")
    target: str = Field(default="", description="label column of a CSV/Parquet dataset")
    sensitive: str = Field(
        default="",
        description="comma-separated sensitive column(s) (several form one joint attribute) of a CSV/Parquet file or "
        "of a built-in tabular dataset (e.g. race on adult, EDUCATION on credit); empty: the dataset's default",
    )
    features: str = Field(default="", description="comma-separated feature columns; empty: all other columns")
    missing: Literal["error", "drop"] = Field(
        default="error",
        description="a .csv/.parquet dataset's rows with a missing value in a used column: error (name the columns) "
        "or drop those rows",
    )
    csv_sep: str = Field(
        default="",
        max_length=3,
        description="separator of a .csv dataset, one character (',', ';', '|', tab or '\\t' for a tab, ...); empty: "
        "detected among , ; tab | (said when it is not ',')",
    )
    csv_encoding: str = Field(
        default="",
        max_length=64,
        description="text encoding of a .csv dataset (utf-8, latin-1, cp1252, ...); empty: utf-8, or latin-1 when the "
        "file is not valid UTF-8 (said when it is latin-1)",
    )
    num_silos: int = Field(default=3, ge=1, le=1000, description="silos of a simulated federation")
    partition: Partition = Field(default="iid", description="how records are dealt to simulated silos")
    heterogeneity: float = Field(default=0.0, ge=0.0, le=1.0, description="h in [0, 1] for partition 'attribute'")
    classes_per_silo: int = Field(default=2, ge=1, description="labels per silo for partition 'classes'")
    dirichlet_alpha: float = Field(default=0.5, gt=0.0, description="concentration for partition 'dirichlet'")
    max_train_records: int = Field(
        default=0, ge=0, description="cap on each silo's training records (seeded subsample); 0: all"
    )

    @field_validator("csv_sep")
    @classmethod
    def _one_separator(cls, value: str) -> str:
        return csv_separator(value)

    @field_validator("csv_encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        return csv_encoding(value)

    @model_validator(mode="after")
    def _csv_options_for_csv(self) -> DataOptions:
        if (self.csv_sep or self.csv_encoding) and not self.dataset.lower().endswith(".csv"):
            raise ValueError(
                f"'csv-sep' and 'csv-encoding' say how to read a .csv 'dataset'; {self.dataset!r} is not one: drop them"
            )
        return self


class RunLengthOptions(OptionGroup):
    """How long the run is: rounds, or passes over the data (the algorithm's entry turns epochs into rounds)."""

    heading: ClassVar[str] = "run length"

    rounds: int = Field(default=0, ge=0, le=10_000_000, description="communication rounds; 0: derived from epochs")
    epochs: float = Field(default=0.0, ge=0.0, le=100_000, description="passes over the data; 0: use rounds")


class RunControlOptions(OptionGroup):
    """Seed, evaluation schedule, time-outs, output and checkpoints."""

    heading: ClassVar[str] = "seed, evaluation, output"

    seed: int = Field(default=0, ge=0, le=2**31 - 1, json_schema_extra=SILO)
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


class CommonOptions(DataOptions, RunLengthOptions, RunControlOptions):
    """The options of every algorithm."""


class PrivacyOptions(OptionGroup):
    """The privacy target of an algorithm whose silos add noise and keep a ledger."""

    heading: ClassVar[str] = "privacy (per silo)"

    epsilon: float = Field(
        default=math.inf,
        gt=0.0,
        allow_inf_nan=True,
        description="target epsilon per silo; inf: no noise",
        json_schema_extra=SILO,
    )
    delta: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="target delta; 0: 1/n^2 with n the training records",
        json_schema_extra=SILO,
    )
    accountant: Literal["rdp", "pld", "best"] = Field(
        default="best", description="privacy accountant (best: the tighter of RDP and PLD)", json_schema_extra=SILO
    )

    @field_validator("epsilon", mode="before")
    @classmethod
    def _parse_infinity(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in {"inf", "infinity", "none"}:
            return math.inf
        return value


#: A tabular model's name: ``logreg``, ``mlp`` or a user's ``module:factory`` (`protocols.model_names`). A type, not a
#: validator of the group, so that the train instruction's copy of the field checks it too.
TabularModelName = Annotated[str, AfterValidator(check_tabular_model_name)]

#: FedSC's backbone: ``cnn``, ``resnet20`` or a user's encoder ``module:factory`` (`protocols.ssl_encoder`).
SslModelName = Annotated[str, AfterValidator(check_ssl_model_name)]


class TabularModelOptions(OptionGroup):
    """A supervised model on feature vectors: silofl's own or the user's (docs/CUSTOM_MODEL.md)."""

    heading: ClassVar[str] = "model"

    model: TabularModelName = Field(default="logreg", max_length=300, description=MODEL_HELP, json_schema_extra=SILO)
    hidden: int = Field(default=64, ge=1, le=65536, description="hidden units of model mlp", json_schema_extra=SILO)


class DeviceOptions(OptionGroup):
    """Where the silos' torch maths run (`protocols.devices`)."""

    heading: ClassVar[str] = "hardware"

    device: Device = Field(
        default="cpu",
        description="torch device of the silos' model, per-sample gradients and sums (the noise is drawn on the CPU "
        "from the silo's seeded generator, so cpu gives the same numbers as before); auto: cuda where the silo "
        "sees a GPU, else cpu; cuda is refused on a machine without one. mu2fl and noisy-sgd compute with numpy on "
        "the CPU and have no device option",
        json_schema_extra=SILO,
    )


class SgdOptions(OptionGroup):
    """Minibatch SGD at the silos: the batch and the learning rate."""

    heading: ClassVar[str] = "minibatch SGD"

    batch_size: int = Field(
        default=256,
        ge=1,
        description="expected records per silo per step (Poisson rate m / n_j)",
        json_schema_extra=SILO,
    )
    lr: float = Field(default=0.5, gt=0.0, le=1e4, description="learning rate", json_schema_extra=SILO)


class SamplingOptions(OptionGroup):
    """How each silo draws its minibatches: Poisson samples (what the accountants' amplification by sampling assumes)
    or shuffled epochs (the SteFFLe paper's released code), accounted without amplification
    (`protocols.shuffled_epochs`)."""

    heading: ClassVar[str] = "minibatch sampling"

    sampling: Literal["poisson", "shuffle"] = Field(
        default="poisson",
        description="poisson: each round each record joins the batch with probability m / n_j (accounted with "
        "amplification by sampling); shuffle: shuffled epochs, every record exactly once per epoch in batches of m "
        "(the last one smaller), accounted WITHOUT amplification, one unsampled Gaussian release per epoch (far more "
        "noise at the same epsilon); topology silos only",
        json_schema_extra=SILO,
    )

    def sampling_problem(self, topology: str) -> str | None:
        """Why this sampling cannot run on `topology` (None: it can): shuffled epochs are implemented for silos."""
        if self.sampling == "shuffle" and topology != "silos":
            return (
                f"'sampling' = 'shuffle' is implemented for topology 'silos' only (the separate feature and sensitive "
                f"parties of topology {topology!r} draw Poisson samples); use 'sampling' = 'poisson' or topology silos"
            )
        return None


#: The values of `protect` (:class:`ProtectOptions`).
Protect = Literal["sensitive", "record"]


class ProtectOptions(OptionGroup):
    """What the silos' noise protects (SteFFLe and Tran et al.): the sensitive attribute, or the whole record (DP-FERMI
    Theorem D.2, second part; issue 34)."""

    heading: ClassVar[str] = "what the noise protects"

    protect: Protect = Field(
        default="sensitive",
        description="sensitive: DP of each record's sensitive attribute only (replace-one of s); the loss gradient "
        "leaves the silo un-noised, so features and labels are not protected; record: DP of the whole record "
        "(features, label and sensitive attribute; add/remove one record): every release, the loss gradient "
        "included, is clipped per record and noised, all on one Poisson sample (DP-FERMI Theorem D.2, second part); "
        "topology silos and sampling poisson only",
        json_schema_extra=SILO,
    )

    def protect_problem(self, topology: str, sampling: str) -> str | None:
        """Why `protect` = record cannot run with this topology or sampling (None: it can)."""
        if self.protect != "record":
            return None
        if topology != "silos":
            return (
                f"'protect' = 'record' is implemented for topology 'silos' only: with topology {topology!r} the "
                "feature parties send their loss gradients un-noised and each party keeps its own ledger; use "
                "'protect' = 'sensitive' or topology silos"
            )
        if sampling != "poisson":
            return (
                "'protect' = 'record' needs 'sampling' = 'poisson': under add/remove of a record a shuffled epoch's "
                "batches are all different (every record moves), which its accounting does not cover; use sampling "
                "poisson"
            )
        return None


class LrDecayOptions(OptionGroup):
    """A step-decay schedule of the server's learning rate."""

    heading: ClassVar[str] = "learning-rate schedule"

    lr_decay: float = Field(default=1.0, gt=0.0, le=1.0, description="factor applied every lr-decay-epochs")
    lr_decay_epochs: float = Field(default=0.0, ge=0.0, description="0: constant learning rate")


class LocalEpochsOptions(OptionGroup):
    """Local passes over a silo's data per round (FedAvg-style algorithms)."""

    heading: ClassVar[str] = "local training"

    local_epochs: int = Field(default=1, ge=1, le=1000, description="local passes per round", json_schema_extra=SILO)


class ClipOptions(OptionGroup):
    """Per-sample gradient clipping."""

    heading: ClassVar[str] = "clipping"

    clip: float = Field(
        default=1.0,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description="per-sample gradient L2 clip norm C",
        json_schema_extra=SILO,
    )


class FairnessOptions(OptionGroup):
    """A fairness notion and the (noised) group counts the server's prior comes from."""

    heading: ClassVar[str] = "fairness"

    fairness: Literal["dp", "eo", "eopp"] = Field(
        default="dp", description="demographic parity, equalized odds, equal opportunity", json_schema_extra=SILO
    )
    counts_share: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="share of each silo's epsilon spent on its group counts",
        json_schema_extra=SILO,
    )


class GroupReportOptions(OptionGroup):
    """How result.json's `fairness_groups` reports the violations beside those over every group."""

    heading: ClassVar[str] = "fairness report"

    min_support: int = Field(
        default=MIN_SUPPORT,
        ge=0,
        le=10_000_000,
        description="smallest number of test records of a sensitive group that enters the *_min_support violations of "
        "result.json's fairness_groups (a group of 60 test records moves a rate by ~0.05 by sampling alone); 0: every "
        "group",
    )


Topology = Literal["silos", "divided", "central-sensitive", "general"]


class TopologyOptions(OptionGroup):
    """Who holds which division of a record (SteFFLe Section 4 and Appendix F): silos holding both, or separate
    feature and sensitive parties over one universal record index."""

    heading: ClassVar[str] = "parties (features and sensitive attributes apart)"

    topology: Topology = Field(
        default="silos",
        description="silos: each silo holds both divisions; divided: each silo's divisions on two nodes; "
        "central-sensitive: one sensitive party (a census) and num-silos feature parties; general: num-silos feature "
        "and sensitive-parties sensitive parties",
    )
    sensitive_parties: int = Field(
        default=1, ge=1, le=1000, description="sensitive parties of topology general (the others fix it)"
    )
    sensitive_by: str = Field(
        default="",
        max_length=200,
        description="topology general: deal the ids to the sensitive parties by this feature column (categorical: "
        "one value per party, round robin; numeric: equal-frequency bins) instead of at random",
    )

    def sensitive_count(self, feature_parties: int) -> int:
        """Sensitive nodes of the topology (0 for silos)."""
        return {"silos": 0, "divided": feature_parties, "central-sensitive": 1}.get(
            self.topology, self.sensitive_parties
        )


class ErmiOptions(OptionGroup):
    """SteFFLe's ERMI regularizer: its weight and the W player of the min-max problem."""

    heading: ClassVar[str] = "ERMI regularizer (SteFFLe)"

    lam: float = Field(
        default=1.0,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="weight of the ERMI fairness term",
        json_schema_extra=SILO,
    )
    w_radius: float = Field(default=2.0, gt=0.0, description="radius D of the ball W is projected onto")
    w_lr: float = Field(
        default=0.02,
        gt=0.0,
        le=1e4,
        description="ascent step size of W: a smaller step averages the noised W-gradients over more rounds, W "
        "following the model more slowly (docs/RESULTS.md, many-valued attributes: 0.02 with per-group noise lowers "
        "the violation where 0.1 does not; the paper-reproduction sweeps use 0.1)",
    )
    w_noise: Literal["auto", "isotropic", "per-group"] = Field(
        default="auto",
        description="isotropic: the same noise on every entry of the W release, scaled to the smallest group's bound "
        "2/sqrt(rho); per-group: each group's row of W noised at its own bound 2/sqrt(p_S(r)) (the release scaled "
        "row by row to sensitivity 1, noised, scaled back: the same mechanism for the accountant), so the noise of a "
        "tiny group no longer lands on the large groups' rows; auto (the default): per-group, at silos and at "
        "separate sensitive parties alike",
        json_schema_extra=SILO,
    )
    group_weight: Literal["prior", "balanced"] = Field(
        default="prior",
        description="prior: the papers' ERMI, each group weighted by its share p_S(r); balanced: the ERMI of the "
        "group-balanced distribution (every group weighs 1/k; records weighted by 1/(k p_S(s)), W-noise radius "
        "2/(sqrt(k) rho) instead of 2/sqrt(rho)), for attributes whose gaps sit in small groups",
        json_schema_extra=SILO,
    )


class DualOptions(OptionGroup):
    """Tran et al.'s Lagrangian dual."""

    heading: ClassVar[str] = "Lagrangian dual (Tran et al.)"

    lam: float = Field(
        default=0.0,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="initial value of every Lagrange multiplier",
        json_schema_extra=SILO,
    )
    dual_lr: float = Field(default=0.01, ge=0.0, le=1e4, description="dual ascent step s of the multipliers")


class LossFairnessOptions(OptionGroup):
    """FedFDP's fairness: the weight of the variance of the silos' losses (balanced performance fairness, Eq. 6)."""

    heading: ClassVar[str] = "loss-variance fairness (FedFDP)"

    lam: float = Field(
        default=0.1,
        ge=0.0,
        le=1e4,
        alias="lambda",
        description="weight of the variance of the silos' losses (0: DP-FedSGD's step)",
        json_schema_extra=SILO,
    )
    loss_bound: float = Field(
        default=0.0,
        ge=0.0,
        le=1e6,
        alias="loss-bound",
        description="clip bound C_l of the loss release; 0: the paper's adaptive bound (the silo's last release, "
        "floored at 1e-3, first 2.5), which shrinks to the floor; > 0: this fixed bound",
        json_schema_extra=SILO,
    )


class SinglePassOptions(OptionGroup):
    """DP-mu2-FL and its noisy-SGD baseline: one pass, logistic regression in a ball, the paper's rho."""

    heading: ClassVar[str] = "single pass (DP-mu2-FL)"

    model: Literal["logreg"] = Field(
        default="logreg", description="multinomial logistic regression (a convex loss)", json_schema_extra=SILO
    )
    batch_size: int = Field(default=256, ge=1, description="records per silo per round (b)", json_schema_extra=SILO)
    trust: Literal["untrusted", "trusted"] = Field(
        default="untrusted", description="noise at the silos (untrusted) or at the server", json_schema_extra=SILO
    )
    rho: float = Field(
        default=0.0,
        ge=0.0,
        description="the paper's rho ((alpha, alpha rho^2/2)-RDP); 0: use epsilon",
        json_schema_extra=SILO,
    )
    domain_diameter: float = Field(
        default=0.1,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description=f"diameter D of the ball K the iterates stay in (at most {MAX_SERVER_VALUE:g})",
        json_schema_extra=SILO,
    )


class SslOptions(OptionGroup):
    """Federated spectral contrastive learning on images: the backbone, local training, the server's optimizer and
    the central evaluation."""

    heading: ClassVar[str] = "self-supervised learning (images)"

    model: SslModelName = Field(default="cnn", max_length=300, description=SSL_MODEL_HELP, json_schema_extra=SILO)
    local_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="minibatch steps per round (batches drawn without replacement, reshuffled when the silo's "
        "records run out); 0: local-epochs passes",
        json_schema_extra=SILO,
    )
    projection_dim: int = Field(
        default=128, ge=1, le=8192, description="dimension H of the representation z", json_schema_extra=SILO
    )
    width: int = Field(
        default=1, ge=1, le=64, description="backbone width multiplier (resnet20 x8: 512-d)", json_schema_extra=SILO
    )
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="local SGD momentum", json_schema_extra=SILO)
    weight_decay: float = Field(default=5e-4, ge=0.0, description="local SGD weight decay", json_schema_extra=SILO)
    grad_clip: float = Field(
        default=3.0, gt=0.0, description="local gradient-norm clip (not a DP clip)", json_schema_extra=SILO
    )
    mu: float = Field(
        default=4.0,
        gt=0.0,
        le=MAX_SERVER_VALUE,
        description="representations are clipped to norm sqrt(mu)",
        json_schema_extra=SILO,
    )
    participation: float = Field(
        default=1.0, gt=0.0, le=1.0, description="fraction of silos sampled per round (all in round 1)"
    )
    server_optimizer: Literal["avg", "adam"] = Field(
        default="avg",
        description="'avg' = the new model is the mean of the silos' models (FedAvg, the paper); 'adam' = "
        "Adam at the server on the mean update (FedAdam, Reddi et al. 2021) with server-lr",
    )
    server_lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="learning rate of server-optimizer adam")
    eval_data: Literal["central", "none"] = Field(
        default="central",
        description="'central' = linear probe and kNN on the dataset's train/test split at the server "
        "(the paper's protocol; simulation or a server with its own copy); 'none' = no evaluation",
    )
    device: Device = Field(
        default="cpu",
        description="torch device of silo training and evaluation; auto: cuda if available",
        json_schema_extra=SILO,
    )
    probe_epochs: int = Field(default=30, ge=1, le=10_000, description="linear-probe epochs (Adam 3e-3)")
    knn_k: int = Field(default=200, ge=1, description="neighbours of the kNN monitor")
    knn_tau: float = Field(default=0.1, gt=0.0, description="temperature of the kNN monitor")


class CalrOptions(OptionGroup):
    """FedSC's correlation sharing through DP-CalR and the alpha schedule of its local loss."""

    heading: ClassVar[str] = "correlation sharing (DP-CalR)"

    views: int = Field(
        default=2, ge=1, le=64, description="augmented views per record in DP-CalR", json_schema_extra=SILO
    )
    alpha_start: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="alpha at the first share (paper eq. 80: 1; q_j = 1/num-silos for equal silos is eq. 6's "
        "exact weight)",
    )
    alpha_end: float = Field(
        default=0.2, ge=0.0, le=1.0, description="alpha decays linearly from alpha-start to this (eq. 80)"
    )
    share_start: int = Field(default=1, ge=1, description="first round the silos share correlation matrices")
    share_every: int = Field(default=1, ge=1, description="rounds between two shares")
    calr_relation: Literal["replace_one", "add_remove"] = Field(
        default="replace_one", description="neighbouring relation of DP-CalR's sensitivity", json_schema_extra=SILO
    )
    calr_sampling_rate: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="each DP-CalR share uses a Poisson sample of the silo's records at this rate (accounted as "
        "a subsampled Gaussian); 1: every record (the paper)",
        json_schema_extra=SILO,
    )
