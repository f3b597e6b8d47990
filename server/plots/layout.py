"""The layout every figure shares: a constrained grid of panels, one colour and marker per curve label, and one
legend below the panels, sized to fit the figure."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when the CLI starts
    from matplotlib.figure import Figure


class _Colors:
    """One colour (and marker) per curve label, the same in every panel of a figure."""

    MARKERS = "osD^vP*Xh<>p"

    def __init__(self, labels: Iterable[str], *, ordered: bool = False) -> None:
        from matplotlib import colormaps

        unique = list(dict.fromkeys(labels)) if ordered else sorted(set(labels))
        cmap = colormaps["tab10"] if len(unique) <= 10 else colormaps["tab20"]
        self.style = {label: (cmap(i % cmap.N), self.MARKERS[i % len(self.MARKERS)]) for i, label in enumerate(unique)}


def _new_figure(rows: int, cols: int, *, width: float = 4.2, height: float = 3.4) -> tuple[Figure, list[list[Any]]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols + 0.6, height * rows + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [list(row) for row in axes]


#: Legend labels are wrapped at this many characters.
LEGEND_WRAP = 40


def _legend(fig: Figure, axes: Sequence[Sequence[Any]], *, fontsize: float = 9) -> Any:
    """One legend for the figure (each label once, in the order drawn), below the panels, fitted to the figure:
    labels wrapped at `LEGEND_WRAP` characters, as many columns as the figure's width holds (measured, not guessed),
    and the figure made wider (a single column wider than it) or taller (a tall legend) when needed, so no label is
    clipped. Returns the legend (None without labels)."""
    handles, labels = {}, []
    for row in axes:
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                if label not in handles and not label.startswith("_"):
                    handles[label] = handle
                    labels.append(label)
    if not labels:
        return None
    wrapped = [textwrap.fill(label, LEGEND_WRAP, break_on_hyphens=False) for label in labels]
    renderer = fig.canvas.get_renderer()
    room = 0.96 * fig.bbox.width
    ncols = len(wrapped)
    while True:
        legend = fig.legend(
            [handles[label] for label in labels], wrapped, loc="outside lower center", ncols=ncols, fontsize=fontsize
        )
        box = legend.get_window_extent(renderer)
        if box.width <= room or ncols == 1:
            break
        legend.remove()
        ncols = max(1, min(ncols - 1, int(ncols * room / box.width)))
    if box.width > room:
        fig.set_figwidth(box.width / fig.dpi / 0.96 + 0.2)
    extra = box.height / fig.dpi - 0.5  # _new_figure leaves room for a legend of about two rows
    if extra > 0:
        fig.set_figheight(fig.get_figheight() + extra)
    return legend
