"""`silofl predict | evaluate | export | model pack`: use the model a run trained.

    silofl predict RUN --data FILE.csv|.parquet [--out FILE.csv] [--unseen error|zeros] [--csv-sep SEP]
        [--csv-encoding ENC]
    silofl evaluate RUN --data FILE.csv|.parquet [--sensitive COL[,COL]] [--min-support N] [--json] [--unseen ...]
        [--csv-sep SEP] [--csv-encoding ENC]
    silofl export RUN --format onnx --out FILE.onnx
    silofl model pack RUN [--preprocessing DIR/preprocessing.json]

RUN is a run folder (`silofl run --out`). predict and evaluate read its artifact (`server.model_artifact`, written by
`silofl run`; `silofl model pack` writes it for a deployed run or an older folder), encode the raw rows of FILE as the
training data was encoded (`protocols.preprocessing`) and score them (`server.trained_model`). A CSV FILE is read as
`silofl run` reads a CSV dataset (`client.data.table_files.read_table_with_format`): with `--csv-sep` / `--csv-encoding`
where given, else detected, a detected separator or encoding other than ',' and utf-8 said on one `silofl: warning:`
line. export writes an ONNX file (`server.model_export`). Bad input (a missing file or column, an unseen category, a
run folder without an artifact) is a ValueError or FileNotFoundError naming the file or the column and the fix:
`silofl`'s `main` prints it and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["add_model_parsers"]

_UNSEEN_HELP = (
    "a feature category the training data did not have: error (default: name the column and values) or zeros "
    "(an all-zeros one-hot block, with a warning)"
)


def _columns(text: str) -> list[str]:
    columns = [c.strip() for c in text.split(",") if c.strip()]
    if not columns:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated column names, got {text!r}")
    return columns


#: How `predict` and `evaluate` read a CSV file: `silofl run`'s flags for a CSV dataset, same values and detection.
_CSV_FLAGS = (
    (
        "--csv-sep",
        "SEP",
        "separator of a .csv FILE, one character (',', ';', '|', tab or '\\t' for a tab, ...); default: detected among "
        ", ; tab | (said when it is not ',')",
    ),
    (
        "--csv-encoding",
        "ENC",
        "text encoding of a .csv FILE (utf-8, latin-1, cp1252, ...); default: utf-8, or latin-1 when the file is not "
        "valid UTF-8 (said when it is latin-1)",
    ),
)


def _rows_of_a_run(parser: argparse.ArgumentParser) -> None:
    """The arguments `predict` and `evaluate` share: the run folder and the raw rows; then, in their own section, how
    a CSV file of them is read (`_CSV_FLAGS`) and what to do with unseen categories."""
    parser.add_argument("run", metavar="RUN", type=Path, help="the run folder (silofl run --out)")
    parser.add_argument(
        "--data", required=True, type=Path, metavar="FILE", help="the raw rows: a .csv (with a header row) or .parquet"
    )
    reading = parser.add_argument_group("reading FILE")
    for flag, metavar, text in _CSV_FLAGS:
        reading.add_argument(flag, default="", metavar=metavar, help=text)
    reading.add_argument("--unseen", choices=("error", "zeros"), default="error", help=_UNSEEN_HELP)


def add_model_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register `predict`, `evaluate`, `export` and `model pack` on the `silofl` command's subparsers."""
    predict = subparsers.add_parser(
        "predict",
        help="predict labels and class probabilities of raw rows with a run's model",
        description="Encode the rows of FILE as the run's training data was encoded and print (or write) each row's "
        "predicted label and class probabilities, in the file's row order.",
    )
    _rows_of_a_run(predict)
    predict.add_argument(
        "--out", type=Path, default=None, metavar="FILE.csv", help="write the predictions here (default: stdout)"
    )
    predict.set_defaults(func=predict_command)

    evaluate = subparsers.add_parser(
        "evaluate",
        help="accuracy and fairness violations of a run's model on labelled raw rows",
        description="Accuracy, error and the fairness violations (demographic parity, equalized odds and equal "
        "opportunity differences, fairlearn's names) of the run's model on the labelled rows of FILE, over all "
        "groups and per group.",
    )
    _rows_of_a_run(evaluate)
    evaluate.add_argument(
        "--sensitive",
        type=_columns,
        default=None,
        metavar="COL[,COL]",
        help="group the rows by these columns (several: their joint values); default: the run's sensitive columns",
    )
    evaluate.add_argument(
        "--min-support",
        type=int,
        default=None,
        metavar="N",
        help="also report the violations over the groups with at least N rows (default 100)",
    )
    evaluate.add_argument("--json", action="store_true", help="print the evaluation as JSON instead of tables")
    evaluate.set_defaults(func=evaluate_command)

    export = subparsers.add_parser(
        "export",
        help="export a run's model (or FedSC encoder) to ONNX",
        description="Write the run's model as an ONNX file, checked against torch with onnxruntime. A tabular "
        "model's input is the ENCODED row ('features'; the preprocessing is the run's model.json 'preprocessing'); "
        "a FedSC encoder's is a flattened image in [0, 1] ('pixels').",
    )
    export.add_argument("run", metavar="RUN", type=Path, help="the run folder (silofl run --out)")
    export.add_argument("--format", choices=("onnx",), default="onnx", help="the file format (default: onnx)")
    export.add_argument("--out", required=True, type=Path, metavar="FILE.onnx", help="the file to write")
    export.set_defaults(func=export_command)

    model = subparsers.add_parser(
        "model", help="manage a run's model artifact", description="Manage a run's model artifact."
    )
    model_sub = model.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    pack = model_sub.add_parser(
        "pack",
        help="write a run's model artifact (model.json, model.safetensors)",
        description="Write RUN/model.safetensors and RUN/model.json from RUN/result.json and a preprocessing file: "
        "for a deployed run, the preprocessing.json `silofl data split` wrote beside the silo folders; without "
        "--preprocessing, the run's dataset is loaded here with the simulated silos' loader arguments (a simulated "
        "run).",
    )
    pack.add_argument("run", metavar="RUN", type=Path, help="the run folder (its result.json)")
    pack.add_argument(
        "--preprocessing",
        type=Path,
        default=None,
        metavar="FILE",
        help="the preprocessing.json of the data the silos were trained on (silofl data split wrote it)",
    )
    pack.set_defaults(func=pack_command)


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show the warnings of the block (e.g. unseen categories encoded as zeros) as `silofl: warning: ...` lines on
    stderr, not as Python's file-and-line warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for warning in caught:
                print(f"silofl: warning: {warning.message}", file=sys.stderr)


def _csv_options(args: argparse.Namespace) -> tuple[str, str]:
    """--csv-sep and --csv-encoding checked as `silofl run` checks them (`protocols.options`: 'tab' means a tab, an
    unknown encoding is refused); a bad value is a ValueError naming the flag and the fix."""
    from silofl.protocols.options import csv_encoding, csv_separator

    checked = []
    flags = (("--csv-sep", csv_separator, args.csv_sep), ("--csv-encoding", csv_encoding, args.csv_encoding))
    for flag, check, value in flags:
        try:
            checked.append(check(value))
        except ValueError as exc:
            raise ValueError(f"{flag} {value!r}: {exc}") from None
    return checked[0], checked[1]


def _read(args: argparse.Namespace):
    """The rows of --data, read as `silofl run` reads a CSV dataset (`client.data.table_files.read_table_with_format`,
    with --csv-sep and --csv-encoding, "" detecting them); a detected separator or encoding other than ',' and utf-8
    is said on one line, as `silofl run`'s checks say it."""
    from silofl.client.data.table_files import read_table_with_format

    path = args.data
    sep, encoding = _csv_options(args)
    frame, fmt = read_table_with_format(path, csv_sep=sep, csv_encoding=encoding)
    note = fmt.note(path) if fmt is not None else None
    if note:
        print(f"silofl: warning: {note}", file=sys.stderr)
    if frame.empty:
        raise ValueError(f"{path} has no rows (a header only?): nothing to score")
    return frame


def predict_command(args: argparse.Namespace) -> int:
    """`silofl predict`: one output row per input row: `prediction` (the label name) and `prob_<label>` columns."""
    import pandas as pd

    from silofl.server.trained_model import load_model

    model = load_model(args.run)
    frame = _read(args)
    with _warnings_as_lines():
        probabilities = model.predict_proba(frame, unseen=args.unseen)
    names = list(model.label_names)
    out = pd.DataFrame({"prediction": [names[i] for i in probabilities.argmax(axis=1)]})
    for index, name in enumerate(names):
        out[f"prob_{name}"] = probabilities[:, index].astype(float)
    if args.out is None:
        out.to_csv(sys.stdout, index=False)
        return 0
    if not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: the folder {args.out.parent} does not exist; create it first")
    out.to_csv(args.out, index=False)
    print(f"{len(out)} predictions -> {args.out}", file=sys.stderr)
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def evaluate_command(args: argparse.Namespace) -> int:
    """`silofl evaluate`: tables (or JSON with --json) of the overall and per-group metrics."""
    from silofl.protocols.fairness_metrics import MIN_SUPPORT
    from silofl.server.trained_model import load_model

    model = load_model(args.run)
    frame = _read(args)
    min_support = MIN_SUPPORT if args.min_support is None else args.min_support
    if min_support < 0:
        raise ValueError(f"--min-support must be >= 0, got {min_support}")
    with _warnings_as_lines():
        evaluation = model.evaluate(frame, sensitive=args.sensitive, min_support=min_support, unseen=args.unseen)
    report = evaluation.to_json()
    if args.json:
        print(json.dumps({"run": str(args.run), "data": str(args.data), **report}, indent=2))
        return 0
    _print_evaluation(args, model, report)
    return 0


def _print_evaluation(args: argparse.Namespace, model: Any, report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    labels = report["label_names"]
    binary = len(labels) == 2
    title = (
        f"{model.manifest['run']['algorithm']} {model.kind} of {args.run} on {args.data}: {report['n']} rows, "
        f"groups by {'|'.join(report['sensitive_columns'])}"
    )
    kept = report["groups_kept"]
    overall = Table(title=title)
    overall.add_column("metric")
    overall.add_column("all groups", justify="right")
    overall.add_column(f"groups of >= {report['min_support']} rows ({len(kept)})", justify="right")
    overall.add_row("accuracy", _fmt(report["accuracy"]), "")
    for key in ("demographic_parity_difference", "equalized_odds_difference", "equal_opportunity_difference"):
        # over fewer than two groups there is no gap to measure
        overall.add_row(key, _fmt(report[key]), _fmt(report[f"{key}_min_support"]) if len(kept) >= 2 else "-")
    console.print(overall)
    positive = 1 if binary else None
    per_group = Table(
        title=f"per group (positive label: {labels[1]!r})" if binary else "per group (rates per label)",
    )
    for column in ("group", "rows", "selection_rate", "true_positive_rate", "false_positive_rate"):
        per_group.add_column(column, justify="left" if column == "group" else "right")
    for group in report["groups"]:
        rates = [group["selection_rate"], group["true_positive_rate"], group["false_positive_rate"]]
        if positive is not None:
            cells = [_fmt(r[positive]) for r in rates]
        else:
            cells = [" ".join(f"{lab}:{_fmt(v)}" for lab, v in zip(labels, r, strict=True)) for r in rates]
        per_group.add_row(str(group["name"]), str(group["support"]), *cells)
    console.print(per_group)
    if not binary:
        console.print(
            f"{len(labels)} labels: each difference is the largest gap over every label taken as the positive one "
            "(fairlearn's metrics are for two labels)"
        )


def export_command(args: argparse.Namespace) -> int:
    """`silofl export`: the ONNX file, then one line per fact a user needs to feed it."""
    from silofl.server.model_export import export_onnx

    report = export_onnx(args.run, args.out)
    print(f"onnx: {report.path} ({report.what})")
    print(f"input: {report.input_name!r}, float32 [batch, {report.input_width}]; outputs: {list(report.output_names)}")
    if report.input_name == "features":
        print(
            f"the input is the ENCODED row: encode raw rows with the 'preprocessing' of {args.run}/model.json "
            "(docs/MODEL.md)"
        )
    print(f"checked with onnxruntime against torch: largest difference {report.max_abs_diff:.1e}")
    return 0


def pack_command(args: argparse.Namespace) -> int:
    """`silofl model pack`: write the artifact and say where."""
    from silofl.server.model_artifact import pack

    path = pack(args.run, args.preprocessing)
    print(f"model artifact: {path} (silofl predict | evaluate | export {args.run})")
    return 0
