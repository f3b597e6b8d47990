"""DP-mu2-FL in docs/RESULTS.md: the paper's Tables 1 and 2 (MNIST) next to silofl's cells, from the `mu2_mnist`
sweep's run folders or benchmarks/mu2_tables.py's cell cache, and the figure."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_runs import DATA_ENV, ROOT, RunFiles, read_json, records_files, rel, result_of
from benchmarks.results_text import fmt
from silofl.server import plots

MU2_HEADING = "## DP-mu2-FL: the paper's Tables 1 and 2 (MNIST)"

_CELL_NAME = re.compile(
    r"^(?P<algorithm>mu2fl|noisy-sgd)-(?P<trust>untrusted|trusted)-rho(?P<rho>[^-]+)-M(?P<silos>\d+)"
    r"-b(?P<batch>\d+)-s(?P<seed>\d+)(?:-(?P<partition>.+))?\.json$"
)


def mu2_cells_from_cache(folder: Path) -> list[dict[str, Any]]:
    """The IID, batch-1 cells benchmarks/mu2_tables.py cached in `folder` (one JSON per cell and seed)."""
    cells = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        match = _CELL_NAME.match(path.name)
        if not match or match["partition"] or int(match["batch"]) != 1:
            continue
        cell = read_json(path)
        if not {"loss", "accuracy", "rho", "silos", "trust", "algorithm"} <= cell.keys():
            continue
        cells.append(dict(cell, seed=int(match["seed"]), partition="iid", source=path))
    return cells


def mu2_cells_from_runs(records: Sequence[plots.RunRecord]) -> list[dict[str, Any]]:
    """Cells (as benchmarks/mu2_tables.py's) from the result.json files of the mu2_mnist sweep."""
    cells = []
    for r in records:
        if not plots.in_plot(r, "mu2") or not plots.has(r, "accuracy"):
            continue
        if r.get("partition") not in (None, "iid") or int(r.get("batch-size") or 1) != 1:
            continue
        rho = plots.as_float(r.get("rho") or 0.0)
        privacy = result_of(r).privacy
        cells.append(
            {
                "algorithm": r.get("algorithm"),
                "trust": r.get("trust"),
                "rho": rho if rho > 0 else math.inf,
                "silos": int(r.get("num-silos")),
                "loss": r.final.get("loss"),
                "accuracy": r.final["accuracy"],
                "epsilon": "inf" if privacy is None or privacy.epsilon_spent is None else privacy.epsilon_spent,
                "seed": int(r.get("seed") or 0),
                "partition": "iid",
                "source": r.folder,
            }
        )
    return cells


def mu2_records(cells: Sequence[dict[str, Any]]) -> list[plots.RunRecord]:
    """The cells as RunRecords for `plots.mu2_figures` (a cached cell has no run folder: its file stands in)."""
    return [
        plots.RunRecord(
            Path(c["source"]),
            c["algorithm"],
            {
                "algorithm": c["algorithm"],
                "dataset": "mnist",
                "partition": "iid",
                "trust": c["trust"],
                "rho": c["rho"] if math.isfinite(c["rho"]) else 0.0,
                "num-silos": c["silos"],
                "epsilon": "inf",
                "seed": c["seed"],
            },
            {"accuracy": c["accuracy"], "loss": c["loss"]},
        )
        for c in cells
    ]


def mu2_section(
    sweeps: Path, cache: Path, figures: Path, doc_dir: Path, sweep_files: Path
) -> tuple[list[str], RunFiles]:
    """The DP-mu2-FL tables (Tables 1 and 2 of the paper next to silofl's cells) and the figure.

    Source: the mu2_mnist sweep's run folders when all its runs are finished, else benchmarks/mu2_tables.py's cell
    cache (the source of docs/results/mu2_tables.md and docs/results/mu2_seeds.md), else whatever the sweep has
    finished."""
    from benchmarks import mu2_tables as tables  # here: only this section needs it

    folder = sweeps / "mu2_mnist"
    records, _ = plots.load_runs([folder]) if folder.is_dir() else ([], 0)
    expected = None
    if (sweep_files / "mu2_mnist.toml").is_file():
        from silofl.server.sweep import load_sweep

        expected = len(load_sweep(sweep_files / "mu2_mnist.toml", out=folder).runs)
    sweep_cells = mu2_cells_from_runs(records)
    cache_cells = mu2_cells_from_cache(cache)
    files = RunFiles()
    lines = [MU2_HEADING, ""]
    sweep_command = f"{DATA_ENV} silofl sweep {rel(sweep_files / 'mu2_mnist.toml', ROOT)}"
    if sweep_cells and (expected is None or len(records) >= expected or not cache_cells):
        cells, source = sweep_cells, f"the run folders of `{rel(folder)}` ({len(records)} completed runs"
        source += f" of the sweep file's {expected})" if expected is not None else ")"
        commands = [sweep_command]
        files = records_files(records)
    elif cache_cells:
        cells = cache_cells
        source = (
            f"the cells benchmarks/mu2_tables.py cached in `{rel(cache)}` ({len(cells)} cells: every IID, batch-1 "
            "cell and seed found; the same computations as docs/results/mu2_tables.md and docs/results/mu2_seeds.md)"
        )
        commands = [
            f"{DATA_ENV} python benchmarks/mu2_tables.py --out docs/results/mu2_tables.md",
            f"{DATA_ENV} python benchmarks/mu2_tables.py --silos 100 --rhos 4,8 --trusts untrusted --seeds 0,1,2,3 "
            "--skip-non-private --algorithms mu2fl --out docs/results/mu2_seeds.md",
        ]
        for c in cells:
            files.add(c.get("seconds"), None)
        if folder.is_dir():
            source += f"; the mu2_mnist sweep has {len(records)} of {expected} runs finished, not used yet"
    else:
        return [
            *lines,
            f"Not generated yet: run `{sweep_command}` (or `{DATA_ENV} python benchmarks/mu2_tables.py`), then "
            "`python benchmarks/results.py`.",
            "",
        ], files
    lines += ["Commands:", "", "```bash", *commands, "python benchmarks/results.py", "```", ""]
    lines += [
        f"Source: {source}.",
        "",
        "Each cell: test loss / accuracy of the last averaged iterate x_T (mean over the seeds found, with the "
        "accuracy's sd and range when there are several), the paper's cell and the gap (loss, accuracy points; "
        "MISS when outside the target of 0.01 loss and 1.5 points); `eps`: the largest epsilon the silos' ledgers "
        "report (untrusted server). The noisy-SGD rows are the baseline at the same rho (not in the paper). "
        "MNIST, IID silos, one pass (T = 60,000 / M rounds of b = 1 record per silo), delta = 1e-5.",
        "",
    ]
    silos = sorted({c["silos"] for c in cells})
    rhos = sorted({c["rho"] for c in cells if math.isfinite(c["rho"])})
    within = compared = 0
    for trust in ("untrusted", "trusted"):
        title = "Table 1: untrusted server" if trust == "untrusted" else "Table 2: trusted server"
        lines += [f"### {title}", "", "| rho | " + " | ".join(f"M = {m}" for m in silos) + " |"]
        lines.append("|---|" + "---|" * len(silos))
        rows = [("mu2fl", rho) for rho in [*rhos, math.inf]] + [("noisy-sgd", rho) for rho in rhos]
        for algorithm, rho in rows:
            label = fmt(rho) if math.isfinite(rho) else "non-private"
            row = [label if algorithm == "mu2fl" else f"noisy SGD, {label}"]
            for m in silos:
                found = [
                    c
                    for c in cells
                    if c["algorithm"] == algorithm
                    and c["rho"] == rho
                    and c["silos"] == m
                    and (c["trust"] == trust or not math.isfinite(rho))
                ]
                if not found:
                    row.append("-")
                    continue
                paper = tables.PAPER[trust].get((rho, m)) if algorithm == "mu2fl" and math.isfinite(rho) else None
                text, good = tables._cell_text(found, paper, trust == "untrusted" and math.isfinite(rho))
                if paper is not None:
                    compared += 1
                    within += good
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += [f"DP-mu2-FL cells within the target of the paper's: {within} of {compared}.", ""]
    drawn = plots.mu2_figures(mu2_records(cells))
    for path in plots.save_figures(drawn, figures, ("png",)):
        lines += [f"![DP-mu2-FL accuracy]({rel(path, doc_dir)})", ""]
    for _, fig in drawn:
        fig.clear()
    return lines, files
