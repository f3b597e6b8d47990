"""The figure kinds of `silofl plot` and `build_figures`, which draws the figures of one kind (one module each:
fairness, privacy, mu2, fedsc, rounds) and adds a note (the `--where` slice) to their titles."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from silofl.server.plots.fairness import fairness_figures
from silofl.server.plots.fedsc import fedsc_figures
from silofl.server.plots.grouping import TRACE_KEYS
from silofl.server.plots.mu2 import mu2_figures
from silofl.server.plots.privacy import privacy_figures
from silofl.server.plots.rounds import run_figures
from silofl.server.plots.runs import PlotError, RunRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure


FIGURE_KINDS = ("fairness", "privacy", "mu2", "fedsc")
#: What `silofl plot` draws: the figures of `FIGURE_KINDS` (over many runs) and `run` (per-round curves).
PLOT_KINDS = (*FIGURE_KINDS, "run")


def build_figures(
    kind: str,
    runs: Sequence[RunRecord],
    *,
    metric: str | None = None,
    trace: Sequence[str] = TRACE_KEYS,
    note: str = "",
) -> list[tuple[str, Figure]]:
    """The figures of `kind` for `runs`: (file stem, Figure) pairs; `note` (e.g. the `--where` slice) is added to
    each title. For `run`, `metric` is a comma-separated list of `ROUND_METRICS` (default: all recorded)."""
    if kind == "fairness":
        figures = fairness_figures(runs, trace=trace)
    elif kind == "privacy":
        figures = privacy_figures(runs, metric=metric or "error")
    elif kind == "mu2":
        figures = mu2_figures(runs, metric=metric or "accuracy")
    elif kind == "fedsc":
        figures = fedsc_figures(runs, metric=metric or "accuracy")
    elif kind == "run":
        figures = run_figures(runs, metrics=[m.strip() for m in (metric or "").split(",") if m.strip()] or None)
    else:
        raise PlotError(f"unknown figure kind {kind!r}; choose one of {', '.join(PLOT_KINDS)}")
    if note:
        for _, fig in figures:
            title = f"{fig.get_suptitle()}; {note}"
            wrap = max(40, int(fig.get_figwidth() * 12))  # about 12 characters per inch at 11 points
            fig.suptitle("\n".join(textwrap.fill(line, wrap) for line in title.split("\n")), fontsize=11)
    return figures
