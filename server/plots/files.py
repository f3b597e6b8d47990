"""Writing figures to files: PNG and SVG into a folder, or the one image file `--out` names, with the bounding box
of everything drawn; and the file names `silofl plot` gives a `--where` slice and a set of runs, so that one figure
never replaces another."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from silofl.server.plots.runs import RunRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _unique_stems(figures: Sequence[tuple[str, Figure]]) -> list[tuple[str, Figure]]:
    """`figures` with a repeated stem numbered (-2, -3, ...), so one call never writes two figures to one file."""
    seen: dict[str, int] = {}
    out = []
    for stem, fig in figures:
        seen[stem] = seen.get(stem, 0) + 1
        out.append((stem if seen[stem] == 1 else f"{stem}-{seen[stem]}", fig))
    return out


def _write(fig: Figure, path: Path) -> None:
    """Save with the bounding box of everything drawn (legend, long tick labels, title): nothing clipped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight", pad_inches=0.1)


def save_figures(
    figures: Sequence[tuple[str, Figure]], out: Path, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Write each figure as out/<stem>.<format> (repeated stems numbered); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, fig in _unique_stems(figures):
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            _write(fig, path)
            paths.append(path)
    return paths


def _image_suffix(path: Path) -> str | None:
    """The image format `path` names by its suffix (`fig.png`), or None (a folder)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = path.suffix.lower().lstrip(".")
    return suffix if suffix in FigureCanvasBase.get_supported_filetypes() else None


def save_to(figures: Sequence[tuple[str, Figure]], out: Path, formats: Sequence[str]) -> list[Path]:
    """`silofl plot`'s output: `out` is a folder (each figure as <stem>.<format>, `save_figures`), or an image file
    (`fig.png`: the one figure there, in that format; several figures as fig-<stem>.png)."""
    fmt = _image_suffix(out)
    if fmt is None:
        return save_figures(figures, out, formats)
    figures = _unique_stems(figures)
    paths = []
    for stem, fig in figures:
        path = out if len(figures) == 1 else out.with_name(f"{out.stem}-{stem}{out.suffix}")
        _write(fig, path)
        paths.append(path)
    return paths


def _slice_suffix(where: Mapping[str, str]) -> str:
    """The file-name part of a `--where` slice: `__lambda=1_dual-lr=0.01`."""
    text = "_".join(f"{k}={v}" for k, v in where.items())
    return "__" + (re.sub(r"[^A-Za-z0-9.+=_-]+", "", text) or "slice")


def _runs_stem(runs: Sequence[RunRecord]) -> str:
    """`silofl plot run`'s default file stem: `rounds` for one run, else `rounds-<run folders>` (shortened with a
    hash when long), so plotting other runs into the same folder does not replace the figure."""
    if len(runs) == 1:
        return "rounds"
    names = "+".join(re.sub(r"[^A-Za-z0-9.+=_-]+", "", r.folder.name) or "run" for r in runs)
    if len(names) <= 80:
        return f"rounds-{names}"
    digest = hashlib.sha1(names.encode()).hexdigest()[:8]
    return f"rounds-{names[:40].rstrip('+')}-and-{len(runs) - 1}-more-{digest}"
