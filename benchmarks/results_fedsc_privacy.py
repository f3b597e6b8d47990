"""FedSC across epsilon and participation in docs/RESULTS.md (the FedSC paper's Tables 3-5 and Figure 2, at CPU
scale on Fashion-MNIST): per (epsilon, participation) the final linear-probe and kNN accuracy, the epsilon the silos'
accountants spent and the rounds, the kNN accuracy over rounds, and what the runs say about epsilon and participation,
computed, beside the paper's, from the `fedsc_fmnist_privacy` sweep."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_heterogeneity import paired_change, trend_word
from benchmarks.results_runs import (
    RunFiles,
    figure_lines,
    result_of,
    runs_by,
    sweep_opening,
)
from benchmarks.results_text import fmt, mean_sd_text, mean_sd_value_text
from silofl.server import plots
from silofl.server.plots.rounds import round_values

#: The sweep (file stem = run folder under --sweeps).
FEDSC_PRIVACY_SWEEP = "fedsc_fmnist_privacy"

FEDSC_PRIVACY_HEADING = "## FedSC across epsilon and participation (Fashion-MNIST, CPU scale)"

#: The metrics the section reads from each run's final evaluation: (key in result.json's `final`, name).
METRICS = (("accuracy", "linear probe"), ("knn_accuracy", "kNN"))

#: The paper's Table 3 (delta 1e-2), CIFAR-10 column pair, linear-probe accuracy %: participation -> epsilon -> %.
PAPER_CIFAR10 = {1.0: {3.0: 79.21, 6.0: 79.42, math.inf: 80.06}, 0.2: {3.0: 76.97, 6.0: 77.08, math.inf: 77.12}}

#: What the paper says of its Tables 3-5, quoted (the three tables' common caption).
PAPER_CLAIM = (
    "The FedSC paper's Tables 3-5 (SVHN, CIFAR-10, CIFAR-100; their caption): \"deploying DP leads to negligible "
    'performance degradation".'
)

Cells = Mapping[tuple[float, ...], Mapping[int, plots.RunRecord]]  # (epsilon, participation) -> seed -> run

#: The sweep's methods and what a participant's Rbar_{-j} is made of below participation 1 (`--stale-shares`): the
#: paper's Algorithm 1 keeps the stale matrices of the silos not sampled, silofl's default uses the latest shares.
STALE_SHARES = {"fedsc-fresh": "the latest shares (silofl's default)", "fedsc": "the stale cache (the paper's)"}
PAPER_METHOD, DEFAULT_METHOD = "fedsc", "fedsc-fresh"


def _rounds_text(runs: Sequence[plots.RunRecord]) -> str:
    """The rounds the runs completed (`status.rounds_completed`, else the rounds planned), `800` or `790/800`."""
    counts = set()
    for r in runs:
        result = result_of(r)
        done = result.status.rounds_completed if result.status is not None else None
        planned = result.federation.rounds if result.federation is not None else None
        counts.add(done if done is not None else planned if planned is not None else r.get("rounds"))
    return "/".join(str(c) for c in sorted(counts, key=plots.sort_key))


def _spent_text(runs: Sequence[plots.RunRecord]) -> str:
    """The epsilon the runs' accountants spent (the privacy block's: the largest silo ledger's), mean ± sd over the
    seeds; `inf (no noise)` for non-private runs."""
    spent = [p.spent for r in runs if (p := result_of(r).privacy) is not None]
    if not spent or not all(math.isfinite(s) for s in spent):
        return "inf (no noise)"
    return mean_sd_value_text(spent, digits=2)


def cells_by_method(records: Sequence[plots.RunRecord]) -> dict[str, Cells]:
    """The runs per sweep method, per (epsilon, participation), by seed."""
    by_method: dict[str, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        by_method[r.method].append(r)
    return {method: runs_by(runs, ("epsilon", "participation")) for method, runs in by_method.items()}


def _shares_label(method: str, part: float) -> str:
    """What a row's Rbar_{-j} is made of: at participation 1 every matrix is fresh whatever the method."""
    if part >= 1.0:
        return "all fresh (participation 1)"
    return STALE_SHARES.get(method, method)


def _row_order(method: str) -> int:
    return list(STALE_SHARES).index(method) if method in STALE_SHARES else len(STALE_SHARES)


def fedsc_privacy_table(by_method: Mapping[str, Cells]) -> list[str]:
    """One row per (epsilon, participation, method): what Rbar_{-j} is made of, seeds, final linear-probe and kNN
    accuracy (mean ± sd over the seeds), epsilon spent, rounds."""
    lines = [
        "| epsilon | participation | Rbar_{-j} from | seeds | linear probe | kNN | epsilon spent | rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        (eps, part, method, by_seed) for method, cells in by_method.items() for (eps, part), by_seed in cells.items()
    ]
    for eps, part, method, by_seed in sorted(rows, key=lambda row: (row[0], -row[1], _row_order(row[2]))):
        runs = list(by_seed.values())
        accuracies = [
            mean_sd_text([100 * r.final[key] for r in runs]) if all(plots.has(r, key) for r in runs) else "-"
            for key, _ in METRICS
        ]
        lines.append(
            f"| {fmt(eps)} | {fmt(part)} | {_shares_label(method, part)} | {len(runs)} | {' | '.join(accuracies)} | "
            f"{_spent_text(runs)} | {_rounds_text(runs)} |"
        )
    return lines


def _change_text(first: Mapping[int, plots.RunRecord], last: Mapping[int, plots.RunRecord], key: str) -> str:
    """The change of `key` from one cell to another, paired by seed, in points: `+1.9 ± 0.3 points (rises)`."""
    change, se, seeds = paired_change(first, last, key)
    return f"{100 * change:+.1f} ± {100 * se:.1f} points ({trend_word(change, se, seeds)})"


def _mean(runs: Mapping[int, plots.RunRecord], key: str) -> float:
    return plots.mean_sd([100 * r.final[key] for r in runs.values()])[0]


def _epsilon_lines(cells: Cells, part: float, label: str) -> list[str]:
    """At one participation: the accuracies in order of epsilon, whether each step is a rise, and the change from
    the smallest epsilon to the largest paired by seed."""
    mine = sorted(eps for eps, p in cells if p == part)
    if len(mine) < 2:
        return []
    words = []
    for key, name in METRICS:
        means = [_mean(cells[(eps, part)], key) for eps in mine]
        pairs = itertools.pairwise(zip(mine, means, strict=True))
        falls = [f"{fmt(a)} to {fmt(b)}" for (a, x), (b, y) in pairs if y <= x]
        steps = "rises at every step" if not falls else f"does not rise from epsilon {', '.join(falls)}"
        change = _change_text(cells[(mine[0], part)], cells[(mine[-1], part)], key)
        words.append(
            f"{name} {', '.join(f'{m:.1f}%' for m in means)} ({steps}; epsilon {fmt(mine[0])} to "
            f"{fmt(mine[-1])} paired by seed: {change})"
        )
    return [f"- Participation {fmt(part)}{label}, epsilon {', '.join(fmt(e) for e in mine)}: " + "; ".join(words) + "."]


def fedsc_privacy_conclusion(by_method: Mapping[str, Cells]) -> list[str]:
    """Across epsilon at each participation (and, below 1, for each way of building Rbar_{-j}); what participation
    below 1 costs at each epsilon with each; the latest shares against the stale cache at each epsilon; all paired
    by seed; then the paper's Table 3 beside it."""
    paper_cells = by_method.get(PAPER_METHOD, {})
    full = paper_cells if any(p >= 1.0 for _, p in paper_cells) else by_method.get(DEFAULT_METHOD, {})
    epsilons = sorted({eps for cells in by_method.values() for eps, _ in cells})
    partial = sorted({p for cells in by_method.values() for _, p in cells if p < 1.0}, reverse=True)
    lines = _epsilon_lines(full, 1.0, "")
    for part in partial:
        for method in sorted(by_method, key=_row_order):
            lines += _epsilon_lines(by_method[method], part, f", Rbar_{{-j}} from {_shares_label(method, part)}")
    probe_costs: dict[str, list[float]] = defaultdict(list)  # method -> participation 1 to below, probe points
    for eps in epsilons:
        base = full.get((eps, 1.0))
        for part in partial:
            costs = []
            for method in sorted(by_method, key=_row_order):
                other = by_method[method].get((eps, part))
                if not (base and other):
                    continue
                probe_costs[method].append(-100 * paired_change(base, other, "accuracy")[0])
                text = "; ".join(f"{name} {_change_text(base, other, key)}" for key, name in METRICS)
                if math.isfinite(eps):
                    text += (
                        f"; epsilon spent {_spent_text(list(base.values()))} and {_spent_text(list(other.values()))}"
                    )
                costs.append(f"{_shares_label(method, part)}: {text}")
            if costs:
                lines.append(
                    f"- Epsilon {fmt(eps)}, participation 1 to {fmt(part)} (paired by seed), " + "; ".join(costs) + "."
                )
            kept, fresh = paper_cells.get((eps, part)), by_method.get(DEFAULT_METHOD, {}).get((eps, part))
            if kept and fresh:
                gains = "; ".join(f"{name} {_change_text(kept, fresh, key)}" for key, name in METRICS)
                lines.append(
                    f"- Epsilon {fmt(eps)}, participation {fmt(part)}, from the stale cache to the latest shares only "
                    f"(paired by seed): {gains}."
                )
    if not lines:
        return []
    paper = PAPER_CIFAR10
    full_cost = [paper[1.0][e] - paper[0.2][e] for e in paper[1.0]]
    beside = _beside_the_paper(full, probe_costs, min(full_cost), max(full_cost))
    return [
        "Computed from the runs (a change paired by seed: mean ± standard error over the seeds, a trend when its 95% "
        "Student-t interval over the seeds excludes 0, flat otherwise and with one seed; a seed fixes the silos' data "
        "and the initialisation):",
        "",
        *lines,
        "",
        f"{PAPER_CLAIM} Its Table 3 (delta 1e-2), CIFAR-10 with 10 clients of one class each: linear probe "
        f"{paper[1.0][3.0]}%, {paper[1.0][6.0]}%, {paper[1.0][math.inf]}% at epsilon 3, 6, inf with every client "
        f"each round ({paper[1.0][math.inf] - paper[1.0][3.0]:+.2f} points from epsilon 3 to inf), and "
        f"{paper[0.2][3.0]}%, {paper[0.2][6.0]}%, {paper[0.2][math.inf]}% with 2 of 10 "
        f"({paper[0.2][math.inf] - paper[0.2][3.0]:+.2f}): partial participation costs it "
        f"{min(full_cost):.2f}-{max(full_cost):.2f} points at each epsilon. Its participation is 2/10, this sweep's "
        "0.5; its scale (CIFAR-10, SVHN, CIFAR-100 with a ResNet on a GPU, 200 rounds of 5 local epochs) is not run "
        "here (see Not reproduced).",
        "",
        *beside,
    ]


def _beside_the_paper(full: Cells, probe_costs: Mapping[str, Sequence[float]], low: float, high: float) -> list[str]:
    """One sentence setting this sweep's two trends beside the paper's: what epsilon moves with every silo each
    round (smallest to largest epsilon, paired by seed), and what participation below 1 costs the probe with each
    way of building Rbar_{-j} (the range over the epsilons of the paired means)."""
    mine = sorted(eps for eps, p in full if p >= 1.0)
    parts = []
    if len(mine) >= 2:
        change = _change_text(full[(mine[0], 1.0)], full[(mine[-1], 1.0)], "accuracy")
        parts.append(
            f"with every silo each round, epsilon {fmt(mine[0])} to {fmt(mine[-1])} moves the probe by {change} here "
            "(the paper: +0.85 from epsilon 3 to inf)"
        )
    for method in sorted(probe_costs, key=_row_order):
        costs, label = probe_costs[method], STALE_SHARES.get(method, method)
        parts.append(
            f"partial participation costs {min(costs):.1f} to {max(costs):.1f} probe points with {label} (over "
            f"{len(costs)} epsilons)"
        )
    if not parts:
        return []
    return [
        "Beside the paper's trends: " + "; ".join(parts) + f", against the paper's {low:.2f}-{high:.2f} at 2 of 10 "
        "clients.",
        "",
    ]


def knn_figure(by_method: Mapping[str, Cells]) -> Any:
    """The FedSC paper's Figure 2 at this scale: kNN accuracy over rounds, one panel per participation, one line per
    (epsilon, Rbar_{-j} source; solid: the latest shares or participation 1, dashed: the stale cache), the mean over
    the seeds at the rounds every seed evaluated (result.json's `rounds`: the kNN monitor every eval-every rounds on
    subsets, the last round the final evaluation on the whole split)."""
    import matplotlib.pyplot as plt

    participations = sorted({p for cells in by_method.values() for _, p in cells}, reverse=True)
    fig, axes = plt.subplots(
        1, len(participations), figsize=(5.2 * len(participations), 4.0), constrained_layout=True, squeeze=False
    )
    epsilons = sorted({eps for cells in by_method.values() for eps, _ in cells})
    colors = dict(zip(epsilons, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"), strict=False))
    for ax, part in zip(axes[0], participations, strict=True):
        for method in sorted(by_method, key=_row_order):
            for (eps, p), by_seed in sorted(by_method[method].items()):
                if p != part:
                    continue
                curves = [dict(zip(*round_values(r.rounds, "knn_accuracy"), strict=True)) for r in by_seed.values()]
                rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
                if not rounds:
                    continue
                means = [100 * sum(c[t] for c in curves) / len(curves) for t in rounds]
                stale = part < 1.0 and method == PAPER_METHOD
                ax.plot(
                    rounds,
                    means,
                    color=colors.get(eps, "black"),
                    linestyle="--" if stale else "-",
                    marker="o",
                    markersize=3,
                    label=f"ε {fmt(eps)}{' (non-private)' if math.isinf(eps) else ''}"
                    + (f", {_shares_label(method, part)}" if part < 1.0 else ""),
                )
        ax.set_title(f"participation {fmt(part)}", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("kNN accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    seeds = sorted({len(s) for cells in by_method.values() for s in cells.values()})
    fig.suptitle(
        f"FedSC on Fashion-MNIST, 10 silos x 1 class: kNN accuracy over rounds (mean over {'/'.join(map(str, seeds))} "
        "seeds)",
        fontsize=10,
    )
    return fig


def fedsc_privacy_section(sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path) -> tuple[list[str], RunFiles]:
    """Markdown of the section: the settings, the commands, the runs' state, the kNN-over-rounds figure, the table
    per (epsilon, participation, Rbar_{-j} source) and the computed conclusion beside the paper's."""
    folder, sweep_file = sweeps / FEDSC_PRIVACY_SWEEP, sweep_files / f"{FEDSC_PRIVACY_SWEEP}.toml"
    lines = [
        FEDSC_PRIVACY_HEADING,
        "",
        "The FedSC paper's privacy and participation study (Tables 3-5: FedSC at several epsilon levels, delta 1e-2 "
        "or 1e-4, with every client or a fraction of them each round) and its Figure 2 (kNN accuracy over rounds), "
        "at the CPU configuration of the FedSC section above: Fashion-MNIST, 10 silos of one class each (6,000 "
        "images), 800 one-step rounds, a correlation share every round from a 1% Poisson sample, FedAdam 2e-3, alpha "
        "0.1; epsilon in {1, 3, 6, inf} at delta 1e-2 (the paper's) x participation in {1, 0.5} x 3 seeds, the kNN "
        "monitor every 50 rounds. Under partial participation each silo calibrates its noise for every announced "
        "share, so at participation 0.5 the same epsilon buys the same noise per share and the silos, sharing about "
        "half as often, spend less of it (the table's epsilon spent; docs/FEDSC.md, \"Noise under partial "
        'participation"; the paper instead changes sigma with the ratio of participation, its Appendix C).',
        "",
        "Below participation 1 the rows differ in what a participant contrasts against, Rbar_{-j}: the stale cache "
        "(`fedsc`, `--stale-shares keep`: every silo's latest matrix, including those of silos not sampled for "
        "rounds, the paper's Algorithm 1, line 17) or the latest shares (`fedsc-fresh`, `--stale-shares drop`, "
        "silofl's default: the other participants' matrices of this round; docs/FEDSC.md, \"Stale shares under "
        'partial participation"). At participation 1 every silo shares every round and the two are the same runs.',
        "",
    ]
    opening, records, files = sweep_opening(folder, sweep_file, "fedsc-privacy", "accuracy", with_rounds=True)
    lines += opening
    if not records:
        return lines, files
    by_method = cells_by_method(records)
    lines += [
        "Final linear-probe accuracy (`final.accuracy`: logistic regression on the frozen backbone's features of the "
        "60,000 training images, tested on the 10,000 test images) and kNN accuracy (`final.knn_accuracy`), mean ± "
        "sd over the seeds; epsilon spent: the privacy block's `epsilon_spent` (the largest silo ledger's, from the "
        "accountant), mean ± sd; rounds completed:",
        "",
        *fedsc_privacy_table(by_method),
        "",
    ]
    lines += [
        "kNN accuracy over rounds, the mean over the seeds (the FedSC paper's Figure 2 at this scale): the monitor "
        "every 50 rounds scores a subset of the images, the last point is the final evaluation on the whole split, "
        "hence the step at the end; dashed: the stale cache.",
        "",
    ]
    drawn = [("fedsc-privacy-knn-fashion-mnist", knn_figure(by_method))]
    lines += figure_lines(drawn, figures, "FedSC kNN accuracy over rounds per epsilon and participation", doc_dir)
    lines += fedsc_privacy_conclusion(by_method)
    return lines, files
