"""`silofl data split`: load a dataset, partition it among silos and write one silo directory per silo.

    silofl data split DATASET --silos N [--partition iid|attribute|classes|dirichlet] [--heterogeneity H]
        [--classes-per-silo K] [--dirichlet-alpha A] [--seed S] [--test-fraction F] [--data-dir D] [--no-download]
        [--target COL --sensitive COL[,COL] --features COL,...] [--csv-sep SEP] [--csv-encoding ENC]
        [--topology silos|divided|central-sensitive|general [--sensitive-parties S]] --out DIR [--overwrite]

Writes DIR/silo_0, DIR/silo_1, ... (see `silo_store.py`), or with a topology other than `silos` one directory per
party (`client.data.topology`, `party_store.py`): DIR/features_0 ... DIR/features_<N-1> (N = --silos feature
parties, split as the silos would be) and DIR/sensitive_0 ...; and DIR/preprocessing.json, how a raw record is
encoded (`client.data.preprocessing_file`: what `silofl model pack RUN --preprocessing FILE` needs to turn a run
trained on these folders into a usable model; not differentially private, it stays with the data); prints a summary
table. `add_data_parser` registers the command on the `silofl` console script's subparsers; the parsed namespace
carries ``func=split_command``.

Before anything is written the input gets the checks of `silofl run` that apply without an algorithm
(`client.data.preflight`): a missing or header-only file, missing columns, a training or test split too small for
--silos and a silo or party below the minimum are refused; a detected separator or encoding, a numeric column read as
text and a single sensitive group are warned about on stderr (`silofl: warning: ...`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from silofl.client.data.generic import recording_preprocessing
from silofl.client.data.loaders import BUILTIN_DATASETS, load_dataset
from silofl.client.data.partition import PARTITIONS, partition_dataset
from silofl.client.data.party_store import save_party
from silofl.client.data.preflight import (
    Node,
    check_nodes,
    check_table,
    is_file_dataset,
    single_group_warning,
    split_problem,
)
from silofl.client.data.preprocessing_file import PREPROCESSING_FILE, write_preprocessing
from silofl.client.data.silo_store import INFO_FILE, save_silo
from silofl.client.data.sources import DATA_DIR_ENV
from silofl.client.data.tabular import DataError, DatasetInfo, SiloData, TabularDataset
from silofl.client.data.topology import TOPOLOGIES, FeaturePartyData, SensitivePartyData, split_parties
from silofl.protocols.config import ConfigError
from silofl.protocols.options import csv_encoding, csv_separator
from silofl.protocols.preprocessing import Preprocessing, PreprocessingError

__all__ = ["add_data_parser", "split_command"]


def _columns(text: str) -> list[str]:
    columns = [c.strip() for c in text.split(",") if c.strip()]
    if not columns:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated column names, got {text!r}")
    return columns


def _checked(check: Any) -> Any:
    """An argparse type from a `protocols.options` check, its message kept (argparse would print only its name)."""

    def parse(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_data_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `data split` on an argparse subparsers object (e.g. the `silofl` command's)."""
    data = subparsers.add_parser("data", help="prepare silo data", description="Prepare silo data.")
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    split = data_sub.add_parser(
        "split",
        help="partition a dataset among silos and write one directory per silo",
        description="Load a dataset, partition its train and test splits among silos, write DIR/silo_<k>.",
    )
    split.add_argument(
        "dataset", metavar="DATASET", help=f"a built-in dataset ({', '.join(BUILTIN_DATASETS)}) or a .csv/.parquet file"
    )
    split.add_argument("--silos", type=int, required=True, metavar="N", help="number of silos")
    split.add_argument("--partition", choices=PARTITIONS, default="iid", help="how to split records (default iid)")
    split.add_argument(
        "--heterogeneity",
        type=float,
        default=0.0,
        metavar="H",
        help="Algorithm 3 level h in [0, 1] for --partition attribute (default 0)",
    )
    split.add_argument(
        "--classes-per-silo",
        type=int,
        default=2,
        metavar="K",
        help="labels per silo for --partition classes (default 2)",
    )
    split.add_argument(
        "--dirichlet-alpha",
        type=float,
        default=0.5,
        metavar="A",
        help="concentration for --partition dirichlet (default 0.5)",
    )
    split.add_argument("--seed", type=int, default=0, help="seed of the train/test split and the partition")
    split.add_argument("--test-fraction", type=float, default=0.25, metavar="F", help="test share (default 0.25)")
    split.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="D",
        help=f"raw data directory (default ${DATA_DIR_ENV}, else ~/.cache/silofl/data)",
    )
    split.add_argument("--no-download", action="store_true", help="fail instead of downloading missing files")
    split.add_argument("--target", default=None, metavar="COL", help="label column (file datasets)")
    split.add_argument(
        "--sensitive",
        type=_columns,
        default=None,
        metavar="COL[,COL]",
        help="sensitive column(s); several form one joint category",
    )
    split.add_argument(
        "--features",
        type=_columns,
        default=None,
        metavar="COL,...",
        help="feature columns (default: all other columns)",
    )
    split.add_argument(
        "--missing",
        choices=("error", "drop"),
        default="error",
        help="file datasets: rows with a missing value in a used column: error (default) or drop them",
    )
    split.add_argument(
        "--csv-sep",
        type=_checked(csv_separator),
        default="",
        metavar="SEP",
        help="separator of a .csv file, one character (';', '|', tab, ...); default: detected among , ; tab |",
    )
    split.add_argument(
        "--csv-encoding",
        type=_checked(csv_encoding),
        default="",
        metavar="ENC",
        help="encoding of a .csv file (utf-8, latin-1, cp1252, ...); default: utf-8, else latin-1 when not valid UTF-8",
    )
    split.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default="silos",
        help="silos: both divisions per silo (default); divided: each silo's divisions as two parties; "
        "central-sensitive: N feature parties and one sensitive party; general: N feature and S sensitive parties",
    )
    split.add_argument(
        "--sensitive-parties",
        type=int,
        default=0,
        metavar="S",
        help="sensitive parties of --topology general (ids dealt at random with --seed); default: as the topology",
    )
    split.add_argument(
        "--sensitive-by",
        default="",
        metavar="COL",
        help="--topology general: deal the ids to the sensitive parties by this feature column (categorical: one "
        "value per party, round robin; numeric: equal-frequency bins) instead of at random",
    )
    split.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    split.add_argument("--overwrite", action="store_true", help="replace silo directories already in DIR")
    split.set_defaults(func=split_command)


def _counts(values: np.ndarray, names: tuple[str, ...]) -> str:
    counts = np.bincount(values, minlength=len(names))
    return ", ".join(f"{name} {count}" for name, count in zip(names, counts, strict=True))


def _summary(info: DatasetInfo, silos: list[SiloData], out: Path) -> Table:
    table = Table(title=f"{info.name}: {len(silos)} silos, {info.num_features} features -> {out}")
    for column in ("silo", "train", "test", "train labels", f"train groups ({'|'.join(info.sensitive_columns)})"):
        table.add_column(column, justify="right" if column in ("silo", "train", "test") else "left")
    for silo in silos:
        table.add_row(
            str(silo.silo_id),
            str(len(silo.train)),
            str(len(silo.test)),
            _counts(silo.train.nonsensitive.labels, info.label_names),
            _counts(silo.train.sensitive.groups, info.group_names),
        )
    return table


def _party_summary(
    info: DatasetInfo, features: list[FeaturePartyData], sensitive: list[SensitivePartyData], out: Path
) -> Table:
    table = Table(
        title=f"{info.name}: {len(features)} feature and {len(sensitive)} sensitive parties, "
        f"{info.num_features} features -> {out}"
    )
    for column in ("party", "train", "test", "holds"):
        table.add_column(column, justify="right" if column in ("train", "test") else "left")
    for party in features:
        labels = _counts(party.train.labels, info.label_names)
        table.add_row(f"features_{party.party_id}", str(len(party.train_ids)), str(len(party.test_ids)), labels)
    for party in sensitive:
        groups = f"{'|'.join(info.sensitive_columns)}: {_counts(party.train_groups, info.group_names)}"
        table.add_row(f"sensitive_{party.party_id}", str(len(party.train_ids)), str(len(party.test_ids)), groups)
    return table


def _source(args: argparse.Namespace) -> dict[str, Any]:
    """The dataset loader's arguments (the same records for silos and parties)."""
    return {
        "data_dir": args.data_dir,
        "seed": args.seed,
        "test_fraction": args.test_fraction,
        "target": args.target,
        "sensitive": args.sensitive,
        "features": args.features,
        "download": not args.no_download,
        "missing": args.missing,
        "csv_sep": args.csv_sep,
        "csv_encoding": args.csv_encoding,
    }


def _warn(lines: list[str]) -> None:
    """Print each warning of the checks on stderr, one line each, as `silofl run` does."""
    for line in lines:
        print(f"silofl: warning: {line}", file=sys.stderr)


def _load_checked(args: argparse.Namespace) -> TabularDataset:
    """The dataset, after the checks of `client.data.preflight` that apply without an algorithm: the file and its
    columns before loading (warnings printed), the training and test splits against --silos after."""
    if is_file_dataset(args.dataset):
        _warn(
            check_table(
                args.dataset,
                target=args.target,
                sensitive=args.sensitive or [],
                features=args.features,
                csv_sep=args.csv_sep,
                csv_encoding=args.csv_encoding,
                silos=args.silos,
                flag="DATASET",
            )
        )
    ds = load_dataset(args.dataset, **_source(args))
    problem = split_problem(len(ds.train), len(ds.test), args.silos)
    if problem:
        raise ConfigError(problem)
    warning = single_group_warning(ds.info, args.dataset)
    _warn([warning] if warning else [])
    return ds


def _partition(args: argparse.Namespace) -> dict[str, Any]:
    """The silo split's arguments (the feature parties are split as silos are)."""
    return {
        "partition": args.partition,
        "heterogeneity": args.heterogeneity,
        "classes_per_silo": args.classes_per_silo,
        "dirichlet_alpha": args.dirichlet_alpha,
    }


def _split_parties(args: argparse.Namespace, console: Console) -> None:
    """`data split --topology T`: one directory per feature and per sensitive party."""
    defaults = {"divided": args.silos, "central-sensitive": 1}
    if args.sensitive_parties and args.topology != "general":
        raise DataError(f"--sensitive-parties is for --topology general; {args.topology!r} fixes the number")
    if args.sensitive_by and args.topology != "general":
        raise DataError(f"--sensitive-by is for --topology general; {args.topology!r} fixes who holds which id")
    count = args.sensitive_parties or defaults.get(args.topology, 0)
    if count < 1:
        raise DataError("--topology general needs --sensitive-parties S (S >= 1)")
    with recording_preprocessing() as recorded:
        ds = _load_checked(args)
    features, sensitive = split_parties(
        ds,
        args.topology,
        feature_parties=args.silos,
        sensitive_parties=count,
        seed=args.seed,
        sensitive_by=args.sensitive_by,
        **_partition(args),
    )
    check_nodes(
        [Node(f"features_{p.party_id}", len(p.train_ids), len(p.test_ids)) for p in features]
        + [Node(f"sensitive_{p.party_id}", len(p.train_ids), len(p.test_ids)) for p in sensitive]
    )
    _prepare_out(args.out, args.overwrite)
    for party in features:
        save_party(party, args.out / f"features_{party.party_id}", num_parties=len(features))
    for party in sensitive:
        save_party(party, args.out / f"sensitive_{party.party_id}", num_parties=len(sensitive))
    note = _save_preprocessing(args.out, recorded, args.dataset)
    console.print(_party_summary(ds.info, features, sensitive, args.out))
    console.print(note, highlight=False, soft_wrap=True)


def _save_preprocessing(out: Path, recorded: list[Preprocessing | PreprocessingError], dataset: str) -> str:
    """Write OUT/preprocessing.json from a `recording_preprocessing` block and say so (or why there is none) in a
    line for the summary."""
    try:
        path = write_preprocessing(out, recorded, dataset)
    except PreprocessingError as exc:
        return f"no {PREPROCESSING_FILE}: {escape(str(exc))}"
    return (
        f"preprocessing: {escape(str(path))} (how a raw record is encoded; not differentially private: keep it with "
        f"the data; `silofl model pack RUN --preprocessing {escape(str(path))}` makes a run on these folders usable)"
    )


_OUTPUT_DIRS = ("silo_*", "features_*", "sensitive_*")


def _prepare_out(out: Path, overwrite: bool) -> None:
    existing = sorted(p for pattern in _OUTPUT_DIRS for p in out.glob(pattern) if p.is_dir()) if out.is_dir() else []
    if existing and not overwrite:
        raise FileExistsError(
            f"{out} already holds {', '.join(p.name for p in existing)}; pass --overwrite to "
            "replace them or choose another --out"
        )
    for path in existing:  # stale silos of an earlier, larger split would otherwise survive
        if (path / INFO_FILE).is_file() or not any(path.iterdir()):
            shutil.rmtree(path)
        else:
            raise FileExistsError(f"{path} is not a silo or party directory (no {INFO_FILE}); remove it yourself")


def split_command(args: argparse.Namespace) -> int:
    """Run `data split` from parsed arguments; 0 on success, 2 with a message on stderr for bad input."""
    console = Console()
    try:
        if args.topology != "silos":
            _split_parties(args, console)
            return 0
        for flag, given in (("--sensitive-parties", args.sensitive_parties), ("--sensitive-by", args.sensitive_by)):
            if given:
                raise DataError(f"{flag} is for --topology general")
        with recording_preprocessing() as recorded:
            ds = _load_checked(args)
        options = _partition(args)
        silos = partition_dataset(ds, args.silos, method=options.pop("partition"), seed=args.seed, **options)
        check_nodes([Node(f"silo_{s.silo_id}", len(s.train), len(s.test)) for s in silos])
        _prepare_out(args.out, args.overwrite)
        for silo in silos:
            save_silo(silo, args.out / f"silo_{silo.silo_id}")
        note = _save_preprocessing(args.out, recorded, args.dataset)
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    console.print(_summary(ds.info, silos, args.out))
    console.print(note, highlight=False, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (`python -m silofl.client.data.split_cli data split ...`) until `silofl` wires it in."""
    parser = argparse.ArgumentParser(prog="silofl")
    add_data_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
