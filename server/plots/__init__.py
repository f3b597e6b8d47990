"""`silofl plot KIND RUN_DIR...`: the papers' figures from run folders (matplotlib, Agg; PNG and SVG).

Reads every `result.json` under the given folders (a sweep's out dir, or single run folders), keeps completed runs,
and draws one figure per dataset (and fairness notion, or partition), each a grid of panels:

- ``fairness`` (SteFFLe paper's figures): x = test error, y = the fairness violation of the runs' `fairness` notion
  (demographic parity, equalized odds, equal opportunity); one curve per method, its points traced by lambda (or the
  method's own trade-off key, e.g. Tran's `dual-lr`), each point the mean over seeds with error bars (standard
  deviation) in both axes. Panels: rows by heterogeneity h, columns by epsilon.
- ``privacy``: x = epsilon, y = test error (or `--metric`), one curve per method and trade-off value; non-private
  runs are horizontal dashed lines. Panels by heterogeneity.
- ``mu2`` (DP-mu2-FL's Tables 1 and 2): grouped bars of test accuracy by rho (groups) and number of silos M (bars),
  one panel per trust model, the value printed on each bar.
- ``fedsc`` (FedSC): bars of the linear-probe accuracy (`final.accuracy`), one bar per method and configuration
  (every config key but the seed: a non-private run is never averaged with a private one), error bars over seeds.
- ``run``: the per-round curves of single runs (`result.json`'s `rounds`: test accuracy, kNN accuracy, test loss,
  fairness violations, epsilon spent, whichever were recorded), one panel per metric, several runs overlaid.

A run's method is the name its sweep gave it (`run.json`), else a label from its config (`steffle` with one silo is
`dp-fermi`, or `fermi` without noise). Runs that do not depend on a panel's key appear in every panel of that key:
a non-private run (epsilon = inf) in every epsilon column, a one-silo run in every heterogeneity row. Labels name the
method and only what differs between the curves or bars (`distinguishing_labels`): "non-private" / "eps 6" when the
privacy levels differ, then the keys a method varies; a key a run does not have is left out, never shown as None.
Legends are placed below the panels and sized to fit the figure (labels wrapped, columns measured), and figures are
saved with ``bbox_inches="tight"``. `silofl plot` puts a `--where` slice in the file names (or writes the `--out`
file given), so a sliced figure never replaces the unsliced one, and says which files it replaced.

The modules, by job: `runs` (reading run folders, as `server.run_result.RunResult`s, into `RunRecord`s, slicing,
mean and sd: what the benchmarks' tables reuse), `grouping` (which runs go into which figure, panel and curve),
`labels` (names and the labels of curves and bars), `layout` (panels, colours, the legend), one module per figure
kind (`fairness`, `privacy`, `mu2`, `fedsc`, `rounds`), `figures` (the kinds and `build_figures`), `files` (writing
figures, their file names), and `cli` (`silofl plot`). This package re-exports what benchmarks/results*.py reach as
`plots.NAME`: public names only (`fmt`, `slug`, `has`, `in_panel`, `sort_key`, `PANEL_KEYS`; `as_float` and
`RunResult` from `server.run_result`).
"""

from silofl.server.plots.fairness import fairness_figures
from silofl.server.plots.fedsc import fedsc_figures
from silofl.server.plots.figures import FIGURE_KINDS, PLOT_KINDS, build_figures
from silofl.server.plots.files import save_figures, save_to
from silofl.server.plots.grouping import PANEL_KEYS, TRACE_KEYS, in_panel, sort_key
from silofl.server.plots.labels import (
    DATASET_NAMES,
    FAIRNESS_METRIC,
    FAIRNESS_NAMES,
    METRIC_LABELS,
    ROUND_METRICS,
    distinguishing_labels,
    fmt,
    privacy_text,
    run_labels,
    slug,
)
from silofl.server.plots.mu2 import mu2_figures
from silofl.server.plots.privacy import privacy_figures
from silofl.server.plots.rounds import run_figures
from silofl.server.plots.runs import (
    PlotError,
    RunRecord,
    config_defaults,
    default_method,
    filter_runs,
    has,
    in_plot,
    load_runs,
    mean_sd,
    normalized_config,
    run_record,
    varied_keys,
)
from silofl.server.run_result import RunResult, RunResultError, as_float

__all__ = [
    "DATASET_NAMES",
    "FAIRNESS_METRIC",
    "FAIRNESS_NAMES",
    "FIGURE_KINDS",
    "METRIC_LABELS",
    "PANEL_KEYS",
    "PLOT_KINDS",
    "ROUND_METRICS",
    "TRACE_KEYS",
    "PlotError",
    "RunRecord",
    "RunResult",
    "RunResultError",
    "as_float",
    "build_figures",
    "config_defaults",
    "default_method",
    "distinguishing_labels",
    "fairness_figures",
    "fedsc_figures",
    "filter_runs",
    "fmt",
    "has",
    "in_panel",
    "in_plot",
    "load_runs",
    "mean_sd",
    "mu2_figures",
    "normalized_config",
    "privacy_figures",
    "privacy_text",
    "run_figures",
    "run_labels",
    "run_record",
    "save_figures",
    "save_to",
    "slug",
    "sort_key",
    "varied_keys",
]
