"""Every algorithm's options (:class:`CommonOptions`): which data and how it is dealt to simulated silos, how long
the run is, the seed, evaluation, output and checkpoints; and the checks of a CSV file's separator and encoding."""

from __future__ import annotations

import codecs
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from silofl.protocols.options.base import SILO, OptionGroup

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
