"""What an algorithm is to silofl: one :class:`Algorithm` entry, data only.

An entry names the option groups the algorithm reads (:mod:`protocols.options`) with the defaults that suit it, how
its rounds follow from epochs, and where its code is: the server's strategy builder and the silo's handler of each
message kind, as ``"module:function"`` references imported when first used (a deployed ClientApp is a fresh process
per message, and a silo never needs the server's code). The core (orchestrator, ClientApp, result, progress, CLI,
sweeps, plots) asks the entry and never compares algorithm names.

From the option groups the entry derives, once, at registration:

* :attr:`Algorithm.config_model`: the algorithm's run configuration, a :class:`protocols.config.RunConfig` subclass
  whose fields are the common options and the algorithm's own, with the algorithm's defaults;
* :attr:`Algorithm.instruction_model`: the :class:`protocols.messages.TrainInstruction` subclass its silos receive
  (the fields marked :data:`protocols.options.SILO`, plus `instruction_fields` the server computes per round).
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, create_model

from silofl.protocols.options import PrivacyOptions, is_silo_field

if TYPE_CHECKING:
    from silofl.protocols.config import RunConfig
    from silofl.protocols.messages import TrainInstruction

#: What the privacy report lists as not covered when the silos answer evaluations exactly (`server.result` drops it
#: from a run whose every evaluation every silo answered noised, under its operator's policy).
EXACT_EVALUATION = "federated evaluation: exact confusion counts of each silo's held-out test split"
#: `Algorithm.protects` of the record-level algorithms (every release of a silo noised over its whole records).
RECORD_PROTECTED = (
    "every training record of a silo (its features, label and sensitive attribute; neighbours: one record added or "
    "removed)"
)
#: `Algorithm.protects` of SteFFLe and Tran et al. (only the sensitive division's releases are noised).
SENSITIVE_PROTECTED = (
    "the sensitive attribute of each training record only (neighbours: one record's sensitive attribute replaced)"
)

#: How rounds follow from `epochs`: (config, each silo's training records) -> rounds.
RoundsRule = Callable[["RunConfig", Sequence[int]], int]


def minibatch_rounds(config: RunConfig, silo_records: Sequence[int]) -> int:
    """One step per round on a Poisson batch of `batch-size`: `epochs` passes over the mean silo's data."""
    mean_n = sum(silo_records) / len(silo_records)
    return max(1, math.ceil(config.epochs * mean_n / config.batch_size))  # type: ignore[attr-defined]


def local_epochs_rounds(config: RunConfig, silo_records: Sequence[int]) -> int:
    """`local-epochs` passes per round: `epochs / local-epochs` rounds."""
    return max(1, math.ceil(config.epochs / config.local_epochs))  # type: ignore[attr-defined]


def single_pass_rounds(config: RunConfig, silo_records: Sequence[int]) -> int:
    """One pass: every record of the smallest silo is used once (`epochs` <= 1 is the fraction of it)."""
    if config.epochs > 1:
        raise ValueError(
            f"{config.algorithm} makes a single pass over the data: 'epochs' must be <= 1, got {config.epochs}"
        )
    return max(1, math.floor(config.epochs * min(silo_records) / config.batch_size))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, described once. Everything but `name`, `summary`, `options` and `strategy` has a default."""

    name: str
    summary: str
    #: Option groups (pydantic models of :mod:`protocols.options`) beyond the common ones, in help order.
    options: tuple[type[BaseModel], ...]
    #: The server side: ``"module:function"``, called with a :class:`strategies.base.StrategyInputs`.
    strategy: str
    #: The silo side: message kind (``train``, ``query.groups``, ``query.correlation``) -> ``"module:function"``; a
    #: feature or sensitive party's handlers as ``"ROLE:kind"`` (``features:train``, ``sensitive:query.sensitive``:
    #: `protocols.parties`). An algorithm without them runs on silos only.
    silo: Mapping[str, str] = field(default_factory=dict)
    #: Defaults of this algorithm that differ from the option groups' (run-config keys, kebab-case).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    rounds: RoundsRule = minibatch_rounds
    #: Fields the server computes and sends in the train instruction besides the options (a pydantic model).
    instruction_fields: type[BaseModel] | None = None
    #: Extra checks of a whole configuration: raise ValueError naming the keys.
    check: Callable[[Any], None] | None = None
    #: Whether the server can checkpoint and resume the run (strategies on the shared round loop).
    resumable: bool = True
    #: ``"module:function"`` giving the starting model's arrays (config, SiloInfo) -> ArrayRecord, when the strategy
    #: does not fix one itself.
    initial_model: str = "silofl.protocols.algorithms.common:tabular_initial_arrays"
    #: The model in result.json ("json": the arrays inline) or next to it ("npz": model.npz, for large models).
    model_output: str = "json"
    #: The final metrics the CLI summary shows: label -> key of result.json's `final`. `fairness` adds the
    #: violations when the data has more than one group.
    summary_metrics: Mapping[str, str] = field(default_factory=lambda: {"accuracy": "accuracy", "loss": "loss"})
    fairness_metrics: bool = True
    #: The metrics of an evaluation the progress bar shows: label -> evaluation key.
    progress_metrics: Mapping[str, str] = field(default_factory=lambda: {"loss": "loss", "acc": "accuracy"})
    #: The `silofl plot` kinds this algorithm's runs appear in.
    plots: tuple[str, ...] = ()
    #: The node roles (``silo``, ``features``, ``sensitive``) for which every release of the algorithm is noised over
    #: everything that node holds: what a silo policy with a budget answers by default (`protocols.silo_policy`).
    #: DP-FedSGD noises a silo's whole records; SteFFLe noises only the sensitive attribute, which is all a sensitive
    #: party holds but not all a silo holds (its loss gradient is in the clear).
    noised_for: tuple[str, ...] = ()
    #: The roles added to `noised_for` for a job that protects whole records (the run option `protect` = record,
    #: `protocols.options.ProtectOptions`): SteFFLe and Tran et al. then noise every release of a silo, its loss
    #: gradient included.
    noised_for_record: tuple[str, ...] = ()
    #: What a private run's (epsilon, delta) covers, in plain words for the console's last lines
    #: (`server.privacy_statement`): whose data, which part of a record, the neighbour relation when the privacy
    #: block names none, against whom. Empty: the algorithm adds no noise.
    protects: str = ""
    #: What leaves a node un-noised although it depends on its data, beyond `not_covered` (e.g. SteFFLe's loss
    #: gradient): the console says it is not protected.
    in_clear: str = ""
    #: Whether the run asks the nodes for evaluations (confusion counts of their test splits); FedSC evaluates its
    #: encoder on the server's own probe data instead. The server checks at setup that every node answers them.
    federated_evaluation: bool = True
    #: The privacy report: what the mechanism is (text or config -> text) and what it does not cover.
    mechanism: str | Callable[[Any], str] = "none"
    not_covered: str = EXACT_EVALUATION
    #: ``"module:function"`` adding algorithm-specific entries to the privacy block: (config, history, rounds, delta)
    #: -> dict (an ``epsilon_spent`` entry there replaces the silos' largest; a ``per_silo`` entry, silo id -> dict,
    #: is merged into the block's per-silo entries).
    privacy_report: str = ""
    #: ``"module:function"`` building the server's own evaluator of the run, (config) -> object or None, e.g. FedSC's
    #: linear probe on labelled data the server holds. The ServerApp (server/) builds it and hands it to the strategy
    #: as :attr:`strategies.base.StrategyInputs.evaluator`, so that a strategy imports no server or silo code.
    server_evaluator: str = ""
    #: A plot label for a run without a sweep method name: config dict -> label (default: the name).
    label: Callable[[Mapping[str, Any]], str] | None = None
    config_model: type[RunConfig] = field(init=False, repr=False, compare=False)
    instruction_model: type[TrainInstruction] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_model", _config_model(self))
        object.__setattr__(self, "instruction_model", _instruction_model(self))

    @property
    def private(self) -> bool:
        """Whether the algorithm's silos can add noise (it takes a privacy target)."""
        return any(issubclass(group, PrivacyOptions) for group in self.options)

    def noised_roles(self, job: Any = None) -> tuple[str, ...]:
        """The roles for which every release of a job is noised over everything the node holds: `noised_for`, and
        `noised_for_record` when the job (an instruction or a run configuration; or its `protect` value) protects
        whole records."""
        protect = job if isinstance(job, str) else getattr(job, "protect", "sensitive")
        return self.noised_for + (self.noised_for_record if protect == "record" else ())

    def silo_handler(self, kind: str, role: str = "silo") -> Callable[..., Any] | None:
        """The function of a node of `role` for message kind `kind`, or None if the algorithm does not use it."""
        ref = self.silo.get(kind if role == "silo" else f"{role}:{kind}")
        return resolve(ref) if ref else None

    @property
    def runs_on_parties(self) -> bool:
        """Whether the algorithm runs with separate feature and sensitive parties (protocols/parties.py)."""
        return any(key.startswith("features:") for key in self.silo)

    def build_strategy(self, inputs: Any) -> Any:
        return resolve(self.strategy)(inputs)

    def describe_mechanism(self, config: Any) -> str:
        return self.mechanism(config) if callable(self.mechanism) else self.mechanism

    def display_label(self, config: Mapping[str, Any]) -> str:
        return self.label(config) if self.label is not None else self.name


def resolve(ref: str) -> Any:
    """The object a ``"module:attribute"`` reference names."""
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"cannot load {ref!r} named by an algorithm entry: {exc}") from exc


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("_", "-").replace("+", "-").split("-"))


def _field_with_default(info: Any, value: Any) -> Any:
    info = copy.copy(info)
    info.default = value
    return info


def _config_model(spec: Algorithm) -> type[RunConfig]:
    """The algorithm's RunConfig: the common options and its groups, with its defaults."""
    from silofl.protocols.config import RunConfig

    base = create_model(f"_{_camel(spec.name)}Options", __base__=(RunConfig, *spec.options))  # type: ignore[call-overload]
    by_alias = {(info.alias or name): name for name, info in base.model_fields.items()}
    overrides: dict[str, Any] = {}
    for key, value in spec.defaults.items():
        name = by_alias.get(key, key.replace("-", "_"))
        if name not in base.model_fields:
            raise ValueError(f"algorithm {spec.name!r}: default for {key!r}, which is none of its options")
        info = base.model_fields[name]
        overrides[name] = (info.annotation, _field_with_default(info, value))
    model = create_model(f"{_camel(spec.name)}Config", __base__=base, **overrides)  # type: ignore[call-overload]
    model.__doc__ = f"The run configuration of {spec.name}: {spec.summary}"
    return model


def _instruction_model(spec: Algorithm) -> type[TrainInstruction]:
    """The train instruction of the algorithm: the base fields, its silo options, and its per-round fields."""
    from silofl.protocols.messages import TrainInstruction

    base_fields = set(TrainInstruction.model_fields)
    fields: dict[str, Any] = {}
    for name, info in spec.config_model.model_fields.items():
        if is_silo_field(info) and name not in base_fields:
            fields[name] = (info.annotation, copy.copy(info))
    bases: tuple[type[BaseModel], ...] = (TrainInstruction,)
    if spec.instruction_fields is not None:
        bases = (TrainInstruction, spec.instruction_fields)
    model = create_model(f"{_camel(spec.name)}TrainInstruction", __base__=bases, **fields)  # type: ignore[call-overload]
    model.__doc__ = f"Server -> silo, every round of {spec.name}."
    return model
