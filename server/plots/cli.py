"""`silofl plot KIND RUN_DIR...`: the argument parser and the command, which loads the runs, slices them
(`--where`), draws the figures of KIND and writes them, saying which files it replaced."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from silofl.server.plots.figures import PLOT_KINDS, build_figures
from silofl.server.plots.files import _image_suffix, _runs_stem, _slice_suffix, save_to
from silofl.server.plots.grouping import TRACE_KEYS
from silofl.server.plots.labels import METRIC_LABELS, ROUND_METRICS
from silofl.server.plots.runs import PlotError, filter_runs, load_runs


def add_plot_parser(subparsers: Any) -> None:
    """`silofl plot KIND RUN_DIR... [--out DIR|FILE] [--where KEY=VALUE] [--metric M] [--trace KEYS] [--formats ...]`;
    KIND `run` draws the per-round curves of the given runs."""
    import argparse

    p = subparsers.add_parser(
        "plot",
        help="draw the papers' figures, or a run's per-round curves, from run folders (PNG and SVG)",
        description="Draw figures from the result.json files under RUN_DIR (a sweep's out dir or run folders); "
        "`silofl plot run RUN_DIR [RUN_DIR ...] [--out FILE]` draws their per-round curves (one panel per metric, "
        "the runs overlaid).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "kind",
        choices=PLOT_KINDS,
        help="fairness, privacy (utility vs epsilon), mu2 (tables), fedsc, run (per-round curves of runs)",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or folders holding run folders")
    p.add_argument(
        "--out",
        default="",
        help="output folder, or an image file (fig.png: that file only) (default: RUN_DIR/plots for the first "
        "RUN_DIR; a --where slice is added to the file names)",
    )
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep runs with this config value (methods that do not vary KEY are kept whole)",
    )
    p.add_argument(
        "--metric",
        default="",
        help="y metric: "
        + ", ".join(METRIC_LABELS)
        + " (default per kind); for `run`, a comma-separated list of "
        + ", ".join(ROUND_METRICS)
        + " (default: every one recorded)",
    )
    p.add_argument("--trace", default=",".join(TRACE_KEYS), help="keys that trace a curve (fairness figures)")
    p.add_argument("--formats", default="png,svg", help="comma-separated image formats (for an --out folder)")
    p.set_defaults(func=plot_command)


def plot_command(args: Any) -> int:
    from silofl.server.sweep import SweepError, canonical_key, parse_where

    per_run = args.kind == "run"
    try:
        where = {canonical_key(k): v for k, v in parse_where(args.where).items()}
        runs, incomplete = load_runs(args.runs, with_rounds=per_run, keep_incomplete=per_run)
        runs = filter_runs(runs, where) if where else runs
        if not runs:
            raise PlotError(
                f"no {'' if per_run else 'completed '}runs under {', '.join(args.runs)}"
                + (f" matching {' '.join(args.where)}" if where else "")
                + (f" ({incomplete} incomplete)" if incomplete and not per_run else "")
            )
        trace = tuple(canonical_key(k.strip()) for k in args.trace.split(",") if k.strip())
        note = ", ".join(f"{k} = {v}" for k, v in where.items())
        figures = build_figures(args.kind, runs, metric=args.metric or None, trace=trace, note=note)
        if not figures:
            what = "has per-round metrics" if per_run else f"fits a {args.kind} figure"
            raise PlotError(f"none of the {len(runs)} runs {what} (see `silofl plot --help`)")
        if per_run:
            figures = [(_runs_stem(runs), fig) for _, fig in figures]
        if where:  # a slice never replaces the unsliced figure
            figures = [(stem + _slice_suffix(where), fig) for stem, fig in figures]
        first = Path(args.runs[0])
        out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "plots"
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        folder = out if _image_suffix(out) is None else out.parent
        existing = set(folder.iterdir()) if folder.is_dir() else set()
        paths = save_to(figures, out, formats)
    except (PlotError, SweepError) as exc:
        print(f"silofl plot: {exc}", file=sys.stderr)
        return 2
    skipped = f"; {incomplete} incomplete run(s) skipped" if incomplete and not per_run else ""
    print(f"{len(runs)} runs{skipped}; wrote:")
    for path in paths:
        print(f"  {path}" + ("  (replaced the file there before)" if path in existing else ""))
    return 0
