"""Generate docs/RESULTS.md and its figures from the run files: SteFFLe's sweeps, the DP-mu2-FL tables, FedSC.

    SILOFL_DATA_DIR=../shared/data silofl sweep benchmarks/sweeps/steffle_adult_dp.toml   # ... each sweep file
    python benchmarks/results.py [--sweeps runs/sweeps] [--sweep-files benchmarks/sweeps] [--out docs/RESULTS.md]
        [--figures docs/figures] [--mu2-cells runs/mu2_tables] [--fedsc-runs runs/fedsc_fmnist]

Every number of the document is read by this script from a run file: a run folder's `result.json` (and the sweep's
`run.json` for the method name), or a cell cached by benchmarks/mu2_tables.py (`runs/mu2_tables/*.json`). The only
constants are the papers' own numbers, quoted as such. A section whose runs are missing says "not generated yet" and
names the command that makes them. The figures are drawn by `server/plots/` (the functions behind `silofl plot`)
and written as PNG next to the document (`--figures`), linked relatively.

SteFFLe's figures and tables come from the four sweeps `steffle_{adult,credit}_{dp,eo}` (run folders under
`--sweeps/<name>/`, the sweep files under `--sweep-files/<name>.toml`): for each (dataset, fairness notion) the
fairness-violation-vs-test-error figure (panels by heterogeneity h and epsilon) and the reduction in fairness
violation at matched test error against each baseline (:func:`server.analysis.matched_error_reduction`), next to the
paper's claims.

This script is the command line; the document is made by `benchmarks/results_document.py` from one module per study
(`results_steffle`, `results_headline`, `results_tran_gap`, `results_topologies`, `results_silos`,
`results_heterogeneity`, `results_record`, `results_dp_fermi`, `results_race`, `results_mu2`, `results_fedsc`,
`results_fedsc_privacy`), on the statistics of `server/analysis.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# after the path insert: the script runs from anywhere
from benchmarks import (  # noqa: E402
    results_dp_fermi,
    results_fedsc_privacy,
    results_heterogeneity,
    results_race,
    results_record,
    results_tran_gap,
)
from benchmarks.results_document import build_document, steffle_part  # noqa: E402
from benchmarks.results_fedsc import FEDSC_HEADING  # noqa: E402
from benchmarks.results_mu2 import MU2_HEADING  # noqa: E402
from benchmarks.results_not_reproduced import NOT_REPRODUCED_HEADING  # noqa: E402
from benchmarks.results_runs import RunFiles, rel  # noqa: E402
from benchmarks.results_silos import SILOS_HEADING, SILOS_SWEEP, silos_section  # noqa: E402
from benchmarks.results_steffle import (  # noqa: E402
    PARKINSONS_SWEEPS,
    STEFFLE_HEADING,
    STEFFLE_SWEEPS,
    SUMMARY_HEADING,
    load_steffle_sweep,
    load_steffle_sweeps,
    steffle_section,
)
from benchmarks.results_text import replace_section  # noqa: E402
from benchmarks.results_topologies import SEALED_HEADING, SEALED_SWEEP, TOPOLOGY_HEADING, sealed_section  # noqa: E402
from silofl.server import plots  # noqa: E402

#: The headings of the sections after the topology history, in build_document's order: `--only` inserts a section
#: the document does not have yet before the first of those that follow it.
SECTION_ORDER = (
    SEALED_HEADING,
    SILOS_HEADING,
    results_heterogeneity.HETEROGENEITY_HEADING,
    results_record.RECORD_HEADING,
    results_dp_fermi.DP_FERMI_HEADING,
    results_race.RACE_HEADING,
    MU2_HEADING,
    FEDSC_HEADING,
    results_fedsc_privacy.FEDSC_PRIVACY_HEADING,
    NOT_REPRODUCED_HEADING,
)


#: The sections `--only` regenerates alone.
ONLY_CHOICES = (
    "steffle",
    "tran-gap",
    "sealed",
    "silos",
    "race",
    "heterogeneity",
    "record",
    "dp-fermi",
    "fedsc-privacy",
    "parkinsons",
)


def sweeps_read(only: str | None) -> list[str]:
    """The sweep folders (names under --sweeps) whose runs the sections of `--only only` read (None: every one)."""
    steffle = [name for name, _, _ in STEFFLE_SWEEPS]
    gap = results_tran_gap
    race = [sweep.name for sweep in results_race.MANY_VALUED]
    by_mode = {
        "parkinsons": [name for name, _, _ in PARKINSONS_SWEEPS],
        "tran-gap": [gap.MAIN_SWEEP, gap.GAP_SWEEP],
        "steffle": [*steffle, gap.GAP_SWEEP],
        "sealed": [SEALED_SWEEP[0]],
        "silos": [SILOS_SWEEP[0]],
        "race": race,
        "heterogeneity": [name for name, _, _ in results_heterogeneity.HETEROGENEITY_SWEEPS],
        "record": [name for name, _, _ in results_record.RECORD_SWEEPS],
        "dp-fermi": [results_dp_fermi.DP_FERMI_SWEEP],
        "fedsc-privacy": [results_fedsc_privacy.FEDSC_PRIVACY_SWEEP],
    }
    if only is not None:
        return by_mode[only]
    return list(dict.fromkeys(name for names in by_mode.values() for name in names))


def sweeps_without_runs(sweeps: Path, names: Iterable[str]) -> list[str]:
    """The sweeps among `names` without a single result.json under `sweeps`/<name>: a fresh checkout has none (run
    folders are not in git), and writing their sections then would replace documented results with "not run yet"."""
    return [n for n in names if not (sweeps / n).is_dir() or next((sweeps / n).rglob("result.json"), None) is None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", default="runs/sweeps", help="folder of the sweeps' run folders (<name>/)")
    parser.add_argument("--sweep-files", default=str(ROOT / "benchmarks" / "sweeps"), help="folder of <name>.toml")
    parser.add_argument("--out", default="docs/RESULTS.md", help="the markdown document to write")
    parser.add_argument("--figures", default="", help="folder of the PNG figures (default: <out's folder>/figures)")
    parser.add_argument("--mu2-cells", default="runs/mu2_tables", help="benchmarks/mu2_tables.py's cell cache")
    parser.add_argument("--fedsc-runs", default="runs/fedsc_fmnist", help="benchmarks/fedsc_fmnist.py's run folders")
    parser.add_argument(
        "--only",
        choices=ONLY_CHOICES,
        help="regenerate only this section of the existing document from its runs (the others stay as they are)",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="write the sections even where a sweep they read has no run folder (they then say 'not run yet' in "
        "place of the documented results)",
    )
    args = parser.parse_args(argv)
    missing = sweeps_without_runs(Path(args.sweeps), sweeps_read(args.only))
    if missing and not args.allow_missing:
        commands = "; ".join(f"silofl sweep {rel(Path(args.sweep_files) / f'{name}.toml', ROOT)}" for name in missing)
        print(
            f"results.py: no runs of {', '.join(missing)} under {args.sweeps}/ (run folders are not in git): writing "
            f"{args.out} now would replace their documented results with 'not run yet'. Nothing was written. Run "
            f"the sweeps first ({commands}), point --sweeps at their folder, or pass --allow-missing.",
            file=sys.stderr,
        )
        return 2
    import matplotlib

    matplotlib.use("Agg")
    out = Path(args.out)
    figures = Path(args.figures) if args.figures else out.parent / "figures"
    if args.only == "parkinsons":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        document = out.read_text()
        now = dt.datetime.now().astimezone()
        for name, dataset, fairness in PARKINSONS_SWEEPS:
            result = load_steffle_sweep(name, dataset, fairness, Path(args.sweeps), Path(args.sweep_files), figures)
            section = steffle_section(result, out.parent)
            section[1:1] = [
                "",
                f"This section was regenerated alone (`python benchmarks/results.py --only parkinsons`) on "
                f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {len(result.records)} runs; the summary "
                "table below does not include it yet (it needs every sweep's runs: a full regeneration).",
            ]
            document = replace_section(document, section[0], section, SUMMARY_HEADING)
            print(f"wrote the section '{section[0][4:]}' of {out} ({len(result.records)} runs)")
        out.write_text(document)
        return 0
    if args.only == "tran-gap":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        gap = results_tran_gap
        main_runs = Path(args.sweeps) / gap.MAIN_SWEEP
        adult = plots.load_runs([main_runs])[0] if main_runs.is_dir() else []  # no figure: the sweep may be partial
        section = gap.factor_section(adult, Path(args.sweeps), Path(args.sweep_files))
        now = dt.datetime.now().astimezone()
        section[1:1] = [
            "",
            f"This section was regenerated alone (`python benchmarks/results.py --only tran-gap`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}).",
        ]
        out.write_text(replace_section(out.read_text(), gap.FACTORS_HEADING, section, TOPOLOGY_HEADING))
        print(f"wrote the section '{gap.FACTORS_HEADING[4:]}' of {out}")
        return 0
    if args.only == "steffle":
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        results = load_steffle_sweeps(Path(args.sweeps), Path(args.sweep_files), figures)
        section = steffle_part(results, Path(args.sweeps), Path(args.sweep_files), out.parent)
        now = dt.datetime.now().astimezone()
        runs = sum(len(r.records) for r in results)
        section[1:1] = [
            "",
            f"This part was regenerated alone (`python benchmarks/results.py --only steffle`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {runs} runs of the six SteFFLe sweeps, plus "
            "the runs of `steffle_adult_tran_gap` for the Tran-gap section; the header's counts are those of the last "
            "full regeneration.",
        ]
        out.write_text(replace_section(out.read_text(), STEFFLE_HEADING, section, TOPOLOGY_HEADING))
        print(f"wrote the part '{STEFFLE_HEADING[3:]}' of {out} ({runs} runs)")
        for r in results:
            print(f"  {r.name}: {len(r.records)} runs")
        return 0
    if args.only:
        if not out.is_file():
            parser.error(f"--only updates an existing document: {out} does not exist (run without --only)")
        race, het = results_race, results_heterogeneity
        make, heading = {
            "sealed": (sealed_section, SEALED_HEADING),
            "silos": (silos_section, SILOS_HEADING),
            "race": (race.race_section, race.RACE_HEADING),
            "heterogeneity": (het.heterogeneity_section, het.HETEROGENEITY_HEADING),
            "record": (results_record.record_section, results_record.RECORD_HEADING),
            "dp-fermi": (results_dp_fermi.dp_fermi_section, results_dp_fermi.DP_FERMI_HEADING),
            "fedsc-privacy": (
                results_fedsc_privacy.fedsc_privacy_section,
                results_fedsc_privacy.FEDSC_PRIVACY_HEADING,
            ),
        }[args.only]
        section, files = make(Path(args.sweeps), Path(args.sweep_files), figures, out.parent)
        if isinstance(files, dict):  # a section of several sweeps (race, heterogeneity, record)
            total = RunFiles()
            for part in files.values():
                total.merge(part)
            files = total
        now = dt.datetime.now().astimezone()
        section[1:1] = [
            "",
            f"This section was regenerated alone (`python benchmarks/results.py --only {args.only}`) on "
            f"{now:%Y-%m-%d %H:%M} ({now.tzname() or 'local time'}) from {files.runs} runs; the header's counts "
            "are those of the last full regeneration.",
        ]
        before = SECTION_ORDER[SECTION_ORDER.index(heading) + 1 :]  # a new section goes before those that follow
        out.write_text(replace_section(out.read_text(), heading, section, before))
        print(f"wrote the section '{heading[3:]}' of {out} ({files.runs} runs)")
        return 0
    text, results = build_document(
        sweeps=Path(args.sweeps),
        sweep_files=Path(args.sweep_files),
        out=out,
        figures=figures,
        mu2_cache=Path(args.mu2_cells),
        fedsc_runs=Path(args.fedsc_runs),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    for r in results:
        print(
            f"  {r.name}: {len(r.records)} runs" + (f", figure {', '.join(map(str, r.figures))}" if r.figures else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
