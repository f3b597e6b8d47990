"""Input checks before anything starts: the data of a run loaded as its silos will load it, then refused in the
command line's words or warned about, before a federation is started.

`silofl run` (simulation: the command line's process can read the data) calls :func:`preflight` before it starts the
job; `silofl data split` (`client.data.split_cli`) calls the checks that apply without an algorithm
(:func:`check_table`, :func:`split_problem`, :func:`check_nodes`, :func:`single_group_warning`). A refusal raises
:class:`protocols.config.ConfigError` (the command line prints it and exits 2); a warning is a returned line for the
caller to print (`silofl: warning: LINE` on stderr).

Refused:

* a dataset file that is missing, a folder or unreadable (naming the path and `--dataset`), a built-in dataset's
  missing files, a file that cannot be read as CSV/Parquet with the `--csv-sep` / `--csv-encoding` in force;
* a header-only file, and a training or test split too small for the silos (naming the split, as the partition's
  own errors do not);
* target, sensitive or feature columns that the table does not have (hinting at `--csv-sep` when the header reads as
  one column);
* a silo (or party) with fewer than :data:`MIN_TRAIN_RECORDS` training records or no test record, and a
  `--max-train-records` below that minimum;
* one sensitive group for an algorithm whose registry entry has a group-fairness regularizer (it reads
  :class:`protocols.options.FairnessOptions`: a fairness notion over the groups and the group counts its prior comes
  from; SteFFLe and Tran et al. today): it would spend part of its epsilon on those counts and report no fairness;
* a single-pass algorithm (its entry's rounds rule is `single_pass_rounds`) whose rounds x batch exceed a silo's
  records: the silo would refuse the first round;
* a user's model (`--model module:factory`) that silofl cannot train on this data's dimensions
  (`protocols.algorithms.common.check_run_model`: it must import, build, return float32 logits (n, num_labels)
  record by record and give per-sample gradients), so that a Ray run does not start its workers for it.

Warned, one line each:

* how a CSV file was read, when the separator or the encoding was detected and is not the default (',' and utf-8);
* a column read as text although >= 90% of its values are numbers (one stray word makes pandas read the whole column
  as text, and the preprocessing one-hot encodes it: 23 -> 93 features), naming the values that are not numbers;
* one sensitive group for an algorithm that reports fairness without a regularizer (no violation will be reported);
* a sensitive group or a label that no training record has;
* a batch size above a silo's training records: the Poisson sampling rate m / n_j is capped at 1, every step uses
  all of that silo's records, and a private run gets no amplification by sampling there;
* a delta above 1/n, n the federation's training records (the n of the default delta 1/n^2).

Why :data:`MIN_TRAIN_RECORDS` = 10: it is a floor for a run that means something, not a statistical guarantee.
Below it a silo's Poisson sample is its whole data at any batch size above its size (rate capped at 1: no
amplification by sampling for the accountant), one record is more than a tenth of everything the silo releases (the
noise a private silo adds to hide one record then swamps its signal), its noised group counts are mostly noise, and
its test split (a quarter of its records at the 3:1 split) holds 3 records or fewer. The repository's smallest
silos (tests, sweeps) hold 24 training records.

Cost: :func:`preflight` loads the data through the silos' own cached loader (`client.silo_data`, keyed by the run's
:class:`protocols.messages.DataSpec`), so the in-process engine's silos, in the same process, take the partitioned
dataset from that cache instead of loading it again: the checks add one extra read of a CSV/Parquet file (the raw
table, for the column checks) and nothing for a built-in dataset. Silos in other processes (Ray) load their own;
``share_with_silos=False`` then drops the cached copy after the checks. The load also records its preprocessing
(`client.data.preprocessing_cache`, about a fifth of a load's time: the encoding checked once more), which the run's
model artifact takes instead of loading the dataset again after the run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.client.data.numeric_columns import MostlyNumeric, mostly_numeric_columns
from silofl.client.data.table_files import CSV_SEPARATORS, read_table_with_format, separator_name
from silofl.client.data.tabular import DataError, DatasetInfo
from silofl.protocols.algorithms.common import check_run_model
from silofl.protocols.config import ConfigError
from silofl.protocols.options import TABULAR_BUILTINS, FairnessOptions

if TYPE_CHECKING:
    from silofl.protocols.algorithms.base import Algorithm
    from silofl.protocols.config import RunConfig

__all__ = [
    "MIN_TEST_RECORDS",
    "MIN_TRAIN_RECORDS",
    "Node",
    "check_nodes",
    "check_table",
    "forget_shared_data",
    "is_file_dataset",
    "preflight",
    "single_group_warning",
    "split_problem",
    "uses_group_fairness",
]

#: The fewest training records a silo (or a feature or sensitive party) may hold; see the module docstring.
MIN_TRAIN_RECORDS = 10
#: The fewest test records a silo may hold: its evaluation needs one.
MIN_TEST_RECORDS = 1
#: Nodes named one by one in a message before "and N more".
_NAMED = 3


@dataclass(frozen=True)
class Node:
    """One node's share of the records as the checks see it: its name ("silo 0", "feature party 1"), its training
    and test record counts, its training labels (silos and feature parties: the side that samples minibatches) and
    its training groups (silos and sensitive parties)."""

    name: str
    n_train: int
    n_test: int
    labels: np.ndarray | None = None
    groups: np.ndarray | None = None


def is_file_dataset(dataset: str) -> bool:
    """Whether `dataset` names a .csv/.parquet file (else a built-in dataset)."""
    return Path(str(dataset)).suffix.lower() in (".csv", ".parquet")


def uses_group_fairness(spec: Algorithm) -> bool:
    """Whether the algorithm's registry entry has a group-fairness regularizer: it reads FairnessOptions (a fairness
    notion over the sensitive groups, and the noised group counts its prior comes from)."""
    return any(issubclass(group, FairnessOptions) for group in spec.options)


def _columns(text: str) -> list[str]:
    """A comma-separated run-config list of columns, split as the simulated silos split it (client/silo_data.py)."""
    return [c for c in text.split(",") if c]


def _records(n: int) -> str:
    return f"{n} record{'' if n == 1 else 's'}"


def _named(nodes: Sequence[Node]) -> str:
    """'silo 0 (3 records), silo 2 (5 records) and 4 more' (smallest first)."""
    ordered = sorted(nodes, key=lambda n: n.n_train)
    text = ", ".join(f"{n.name} ({_records(n.n_train)})" for n in ordered[:_NAMED])
    return text + (f" and {len(ordered) - _NAMED} more" if len(ordered) > _NAMED else "")


# -- the table ----------------------------------------------------------------------------------------------------
def check_table(
    path: str | Path,
    *,
    target: str | None,
    sensitive: Sequence[str],
    features: Sequence[str] | None,
    csv_sep: str = "",
    csv_encoding: str = "",
    silos: int = 1,
    flag: str = "--dataset",
) -> list[str]:
    """Check a .csv/.parquet dataset file before it is loaded: it exists and reads (with `csv_sep` and `csv_encoding`,
    "" detecting them), it has records, and the target, sensitive and feature columns are in it. Return the warnings:
    how a CSV file was read when that was detected and not the default, and the columns read as text although their
    values are mostly numbers. `flag` names the dataset in messages (`--dataset`, or `DATASET` for `data split`).
    Raises ConfigError."""
    path = Path(path)
    where = f"{flag} {path}"
    if not path.exists():
        raise ConfigError(f"{where}: no such file (relative paths start at {Path.cwd()}); check the path")
    if path.is_dir():
        raise ConfigError(f"{where} is a folder; give a .csv or .parquet file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{where}: the file is not readable (permission denied)")
    try:
        frame, fmt = read_table_with_format(path, csv_sep=csv_sep, csv_encoding=csv_encoding)
    except (DataError, OSError) as exc:
        text = str(exc)
        raise ConfigError(f"{flag} {text}" if text.startswith(str(path)) else f"{where}: {text}") from None
    warnings = []
    note = fmt.note(path) if fmt is not None else None
    if note:
        warnings.append(note)
    if frame.empty:
        raise ConfigError(
            f"{where} has a header row and no records: the training split needs at least {MIN_TRAIN_RECORDS} records "
            f"per silo and the test split at least {MIN_TEST_RECORDS} ({MIN_TRAIN_RECORDS * silos} and "
            f"{MIN_TEST_RECORDS * silos} for {silos} silo{'' if silos == 1 else 's'}); add records"
        )
    named = {"--target": [target] if target else [], "--sensitive": list(sensitive), "--features": list(features or [])}
    for option, columns in named.items():
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ConfigError(
                f"{option}: {', '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} not a column of "
                f"{path}; its columns: {', '.join(map(str, frame.columns))}{_separator_hint(frame, fmt)}"
            )
    roles = {target: "target"} if target else {}
    roles.update({c: "sensitive" for c in sensitive})
    used = list(features) if features else [c for c in frame.columns if c not in roles]
    roles.update({c: "feature" for c in used})
    for found in mostly_numeric_columns(frame, list(roles)):
        warnings.append(_numeric_warning(found, roles[found.column], path))
    return warnings


def _separator_hint(frame: Any, fmt: Any) -> str:
    """When a column name holds another separator (the header was split at the wrong one): the `--csv-sep` that would
    split it there."""
    if fmt is None:
        return ""
    header = "".join(str(c) for c in frame.columns)
    other = next((sep for sep in CSV_SEPARATORS if sep != fmt.sep and sep in header), None)
    if other is None:
        return ""
    return f" (if the file is separated by {separator_name(other)}, give --csv-sep {separator_name(other)})"


def _numeric_warning(found: MostlyNumeric, role: str, path: Path) -> str:
    column = f"column {found.column!r} of {path.name}"
    effect = {
        "feature": f"one-hot encoded into {found.distinct} features instead of 1",
        "target": f"each of its {found.distinct} values a class",
        "sensitive": f"each of its {found.distinct} values a group",
    }[role]
    out = ", or leave the column out with --features" if role == "feature" else ""
    numbers = f"{found.numbers} of its {found.values} values are numbers"
    if found.decimal_comma:
        return (
            f"{column} is read as text ({effect}) although {numbers} written with a decimal comma; write them with "
            f"decimal points in the file{out}"
        )
    values = ", ".join(repr(v) for v in found.offending)
    more = f" and {found.not_numbers - len(found.offending)} more" if found.not_numbers > len(found.offending) else ""
    shown = f"not numbers: {values}{more} ({_records(found.records)})" if found.records else "all of them"
    return f"{column} is read as text ({effect}) although {numbers}; {shown}; fix those values in the file{out}"


# -- the splits and the nodes --------------------------------------------------------------------------------------
def split_problem(n_train: int, n_test: int, silos: int) -> str | None:
    """Why a training split of `n_train` and a test split of `n_test` records cannot be dealt to `silos` silos
    (naming the split that is short and the `--silos` that would fit), or None."""
    if n_train < MIN_TRAIN_RECORDS * silos:
        fit = n_train // MIN_TRAIN_RECORDS
        fix = f"use --silos {fit} or fewer, or add records" if fit else "add records"
        return (
            f"the training split has {_records(n_train)}, {n_train / silos:.3g} per silo for --silos {silos}; each "
            f"silo needs at least {MIN_TRAIN_RECORDS} training records: {fix}"
        )
    if n_test < MIN_TEST_RECORDS * silos:
        return (
            f"the test split has {_records(n_test)}, fewer than {MIN_TEST_RECORDS} per silo for --silos {silos}: use "
            f"--silos {max(1, n_test // MIN_TEST_RECORDS)} or fewer, or add records"
        )
    return None


def check_nodes(nodes: Sequence[Node]) -> None:
    """Refuse nodes with fewer than :data:`MIN_TRAIN_RECORDS` training or :data:`MIN_TEST_RECORDS` test records (a
    skewed partition can leave a silo short although the totals suffice). Raises ConfigError."""
    short = [n for n in nodes if n.n_train < MIN_TRAIN_RECORDS]
    if short:
        raise ConfigError(
            f"the training split of {_named(short)} is below the {MIN_TRAIN_RECORDS} records each silo needs: use "
            "fewer --silos, a milder --partition (or --heterogeneity, --dirichlet-alpha), or more records"
        )
    no_test = [n for n in nodes if n.n_test < MIN_TEST_RECORDS]
    if no_test:
        names = ", ".join(n.name for n in no_test[:_NAMED]) + (
            f" and {len(no_test) - _NAMED} more" if len(no_test) > _NAMED else ""
        )
        raise ConfigError(
            f"the test split of {names} has no record: each silo needs at least {MIN_TEST_RECORDS} to be evaluated; "
            "use fewer --silos, a milder --partition, or more records"
        )


def _group_fairness_names(*, uses: bool) -> list[str]:
    from silofl.protocols import algorithms

    return [s.name for s in algorithms.specs() if uses_group_fairness(s) == uses]


def _one_group(info: DatasetInfo, dataset: str) -> str:
    """The dataset's single group in the user's words."""
    if dataset not in TABULAR_BUILTINS and not is_file_dataset(dataset):
        return (
            f"--dataset {dataset} has no sensitive attribute (every record is in the one group {info.group_names[0]!r})"
        )
    return (
        f"--sensitive {','.join(info.sensitive_columns)}: every record has the value {info.group_names[0]!r}, a "
        "single group"
    )


def single_group_warning(info: DatasetInfo, dataset: str) -> str | None:
    """`silofl data split`'s warning for a dataset with one sensitive group (no algorithm known yet): which algorithms
    will refuse the silos (from the registry), or None when there are several groups."""
    if info.num_groups >= 2:
        return None
    names = ", ".join(_group_fairness_names(uses=True))
    return f"{_one_group(info, dataset)}: the algorithms with a fairness regularizer ({names}) will refuse these silos"


def _group_checks(config: RunConfig, info: DatasetInfo, nodes: Sequence[Node]) -> list[str]:
    spec = config.spec
    warnings = []
    if info.num_groups < 2:
        tabular = config.dataset in TABULAR_BUILTINS or is_file_dataset(config.dataset)
        if uses_group_fairness(spec):
            others = ", ".join(_group_fairness_names(uses=False))
            raise ConfigError(
                f"{_one_group(info, config.dataset)}; {spec.name}'s fairness regularizer needs at least two groups (it "
                "would spend part of its epsilon on the group counts and report no fairness): choose a sensitive "
                f"column with two or more values (--sensitive), or an algorithm without one ({others})"
            )
        if spec.fairness_metrics and tabular:
            warnings.append(f"{_one_group(info, config.dataset)}: the run reports no fairness violation")
        return warnings
    absent = _absent([n.groups for n in nodes if n.groups is not None], info.group_names)
    if absent:
        warnings.append(
            f"sensitive group(s) {', '.join(map(repr, absent))} of --sensitive "
            f"{','.join(info.sensitive_columns)} have no training record: the training never sees them"
        )
    absent = _absent([n.labels for n in nodes if n.labels is not None], info.label_names)
    if absent:
        warnings.append(f"label(s) {', '.join(map(repr, absent))} have no training record: the model never learns them")
    return warnings


def _absent(columns: list[np.ndarray], names: Sequence[str]) -> list[str]:
    """The `names` whose index occurs in none of `columns` (none when no node reported the column)."""
    if not columns:
        return []
    counts = np.bincount(np.concatenate(columns), minlength=len(names))
    return [names[k] for k in np.flatnonzero(counts == 0)]


def _batch_checks(config: RunConfig, nodes: Sequence[Node]) -> list[str]:
    """The batch size against each silo's training records, as the algorithm's rounds rule uses it."""
    from silofl.protocols.algorithms.base import minibatch_rounds, single_pass_rounds

    m = getattr(config, "batch_size", None)
    samplers = [n for n in nodes if n.labels is not None]  # silos and feature parties draw the minibatches
    if m is None or not samplers:
        return []
    rule = config.spec.rounds
    if rule is single_pass_rounds:
        smallest = min(samplers, key=lambda n: n.n_train)
        try:
            rounds = config.rounds or rule(config, [n.n_train for n in samplers])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if rounds * m > smallest.n_train:
            length = f"--rounds {rounds}" if config.rounds else f"{rounds} round{'' if rounds == 1 else 's'}"
            raise ConfigError(
                f"--batch-size {m} x {length} needs {rounds * m} training records per silo, and {smallest.name} has "
                f"{smallest.n_train}: {config.spec.name} makes a single pass (each record used once); use --batch-size "
                f"{max(1, smallest.n_train // rounds)} or less" + (" or fewer --rounds" if config.rounds else "")
            )
        return []
    over = [n for n in samplers if m > n.n_train]
    if not over:
        return []
    fewest = min(n.n_train for n in over)
    if rule is minibatch_rounds and getattr(config, "sampling", "poisson") == "poisson":
        loss = "; a private run gets no amplification by sampling there" if config.private else ""
        return [
            f"--batch-size {m} is more than the training records of {_named(over)}: the sampling rate m/n_j is "
            f"capped at 1 and every step uses all of their records{loss}; use --batch-size {fewest} or less to sample"
        ]
    return [
        f"--batch-size {m} is more than the training records of {_named(over)}: every batch holds all of their "
        f"records; use --batch-size {fewest} or less for minibatches"
    ]


def _delta_checks(config: RunConfig, nodes: Sequence[Node]) -> list[str]:
    delta = config.target_delta
    n = sum(node.n_train for node in nodes if node.labels is not None)
    if not config.private or delta <= 0 or n < 1 or delta <= 1 / n:
        return []
    return [
        f"--delta {delta:g} is more than 1/n = {1 / n:.2g} (n = {n} training records over the silos): at such a "
        "delta a mechanism may publish a few records outright and still meet (epsilon, delta); use a delta well "
        f"below 1/n, e.g. --delta 0, the default 1/n^2 = {1 / n**2:.2g}"
    ]


# -- the run ------------------------------------------------------------------------------------------------------
def _load_kwargs(config: RunConfig) -> dict[str, Any]:
    """`load_dataset`'s arguments for the run's data, as the simulated silos derive them from the DataSpec."""
    return {
        "data_dir": config.data_dir or None,
        "seed": config.seed,
        "target": config.target or None,
        "sensitive": _columns(config.sensitive) or None,
        "features": _columns(config.features) or None,
        "missing": config.missing,
        "csv_sep": config.csv_sep,
        "csv_encoding": config.csv_encoding,
    }


def _load_nodes(config: RunConfig, share_with_silos: bool) -> tuple[DatasetInfo, list[Node]]:
    """The run's nodes, loaded and dealt by the simulated silos' own (cached) code, so their counts are the run's. The
    load's preprocessing is kept (`client.data.preprocessing_cache`) for the run's model artifact."""
    from silofl.client import silo_data
    from silofl.client.data.preprocessing_cache import recording
    from silofl.protocols.messages import DataSpec

    spec = DataSpec.from_run_config(config)
    try:
        if spec.topology == "silos":
            with recording(spec):
                silos = silo_data._partitioned(spec)
            info = silos[0].info
            nodes = [
                Node(
                    f"silo {s.silo_id}",
                    len(s.train),
                    len(s.test),
                    s.train.nonsensitive.labels,
                    s.train.sensitive.groups,
                )
                for s in silos
            ]
        else:
            with recording(spec):
                features, sensitive = silo_data._parties(spec)
            info = features[0].info
            nodes = [
                Node(f"feature party {p.party_id}", len(p.train_ids), len(p.test_ids), labels=p.train.labels)
                for p in features
            ] + [
                Node(f"sensitive party {p.party_id}", len(p.train_ids), len(p.test_ids), groups=p.train_groups)
                for p in sensitive
            ]
    except (DataError, OSError, ValueError) as exc:
        raise ConfigError(_load_error(config, exc)) from None
    finally:
        if not share_with_silos:
            forget_shared_data()
    return info, nodes


def forget_shared_data() -> None:
    """Drop the data that :func:`preflight` (``share_with_silos=True``) left in this process's cache for its silos
    (`client.silo_data`): when no silo of this process will use it, e.g. after `silofl sweep` checked several runs of
    one data spec, each loading it once, before its worker processes run them."""
    from silofl.client import silo_data

    silo_data._partitioned.cache_clear()
    silo_data._parties.cache_clear()


def _load_error(config: RunConfig, exc: Exception) -> str:
    """A loading or dealing error in the command line's words: a split too small for the silos names that split
    (the partition's own message would not); any other error is the loader's, prefixed with the dataset."""
    text = f"--dataset {config.dataset}: {exc}"
    from silofl.client.data.loaders import load_dataset

    try:  # no second download attempt: a file that could not be fetched is the error
        ds = load_dataset(config.dataset, **_load_kwargs(config), download=False)
    except (DataError, OSError, ValueError):
        return text  # the error was the loading's own
    return split_problem(len(ds.train), len(ds.test), config.num_silos) or text


def preflight(config: RunConfig, *, share_with_silos: bool = True) -> list[str]:
    """Check the data of a simulated run before its federation starts (see the module docstring for what is refused
    and what is warned about); return the warnings, one line each. Raises ConfigError.

    share_with_silos: keep the loaded, partitioned dataset in this process's cache (`client.silo_data`), where the
    in-process engine's silos find it (no second load); False (`--engine ray`: the silos are other processes) drops
    it after the checks.
    """
    if 0 < config.max_train_records < MIN_TRAIN_RECORDS:
        raise ConfigError(
            f"--max-train-records {config.max_train_records} caps every silo below the {MIN_TRAIN_RECORDS} training "
            f"records a silo needs: use --max-train-records {MIN_TRAIN_RECORDS} or more (0: no cap)"
        )
    warnings: list[str] = []
    if is_file_dataset(config.dataset):
        warnings += check_table(
            config.dataset,
            target=config.target or None,
            sensitive=_columns(config.sensitive),
            features=_columns(config.features) or None,
            csv_sep=config.csv_sep,
            csv_encoding=config.csv_encoding,
            silos=config.num_silos,
        )
    info, nodes = _load_nodes(config, share_with_silos)
    samplers = [n for n in nodes if n.labels is not None]
    problem = split_problem(sum(n.n_train for n in samplers), sum(n.n_test for n in samplers), len(samplers))
    if problem:
        raise ConfigError(problem)
    check_nodes(nodes)
    check_run_model(config, info.num_features, info.num_labels)
    warnings += _group_checks(config, info, nodes)
    warnings += _batch_checks(config, nodes)
    warnings += _delta_checks(config, nodes)
    return warnings
