"""SteFFLe on many-valued sensitive attributes (issue 20): the docs/RESULTS.md section of the many-valued sweeps.

`race_section(sweeps, sweep_files, figures, doc_dir)` reads the runs of each sweep of :data:`MANY_VALUED` (Adult read
as a CSV with `--sensitive race`: five groups, two of them near 1% of the records; the Credit Card CSV with its raw
EDUCATION code: seven groups, four of them under 1%) and returns the section's markdown lines and, per sweep, the runs
it read (a :class:`RunFiles`, `benchmarks.results_runs.RunFiles`). Everything the section says is computed
from the run folders: per sweep and epsilon, lambda against the test error, the demographic-parity violation over all
groups and over the groups with at least `min_support` test records (each run's `fairness_groups`, from the summed
test counts), for every method of the sweep file (the papers' ERMI with isotropic or per-group W noise, the
group-balanced ERMI, W steps); each group's test support; and a conclusion from those tables.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.results_runs import DATA_ENV, ROOT, RunFiles, read_json, rel, sweep_state_text
from benchmarks.results_text import fmt, mean_sd_value_text
from silofl.server import plots
from silofl.server.analysis import lowest_within_budget
from silofl.server.run_result import RESULT_FILE, SUMMARY_SKIP, RunResult, RunResultError, Timing

RACE_HEADING = "## SteFFLe on a many-valued attribute"


@dataclass(frozen=True)
class ManyValuedSweep:
    """One sweep of the section: its file stem (= its run folder under runs/sweeps/), the subsection's title, what
    the attribute is, and the figure's file name."""

    name: str
    title: str
    what: str
    figure: str


#: The sweeps of the section, in its order. A sweep's methods come in the order of its file's [[methods]]; their
#: labels from the runs' configurations (:func:`method_label`).
MANY_VALUED = (
    ManyValuedSweep(
        "steffle_adult_race",
        "Adult, race (five groups)",
        "Adult read as a CSV with `--sensitive race`: White 85%, Black 10%, Asian-Pac-Islander 3%, Amer-Indian-Eskimo "
        "1%, Other 0.8% of the records",
        "steffle-adult-race.png",
    ),
    ManyValuedSweep(
        "steffle_credit_education",
        "Credit Card, raw EDUCATION (seven groups)",
        "the Credit Card CSV read as a user's own file with `--sensitive EDUCATION --missing drop`: codes 2 (47%), 1 "
        "(35%), 3 (16%), and 5, 4, 6, 0 with 0.9%, 0.4%, 0.2% and 0.05% of the records (the built-in `credit` merges "
        "those four)",
        "steffle-credit-education.png",
    ),
)
#: The first sweep's stem (the Adult race sweep).
RACE_SWEEP = MANY_VALUED[0].name
#: The configuration keys that tell the methods apart, with the defaults of runs that predate them.
METHOD_KEYS = {"group-weight": "prior", "w-noise": "isotropic", "w-lr": 0.1}
#: The lambda the conclusion and the group table compare with lambda 0 (the issue's probe), if the sweep has it.
REFERENCE_LAMBDA = 2.0
#: Error budget over lambda 0's error for the "lowest violation at about the same error" comparison.
ERROR_BUDGET = 0.01


@dataclass
class RaceRun:
    """One completed run of the sweep: what the section needs of its result.json."""

    folder: Path
    method: str
    epsilon: float
    lam: float
    seed: int
    error: float
    dp_all: float
    dp_min: float
    min_support: int
    groups: list[dict[str, Any]] = field(default_factory=list)  # fairness_groups["groups"]
    label: str = ""  # method_label of its configuration
    rho: float | None = None  # the smallest probability of the run's (noised) group prior
    wall: float | None = None
    cpu: float | None = None


Order = Callable[[str], tuple[int, str]]


def method_order(methods: Sequence[str]) -> Order:
    """A sort key putting methods in `methods`' order (a sweep file's), unknown ones after, by name."""

    def order(method: str) -> tuple[int, str]:
        return (methods.index(method) if method in methods else len(methods), method)

    return order


def sweep_methods(sweep_file: Path) -> list[str]:
    """The method names of a sweep file, in its order (empty when the file does not load)."""
    try:
        table = tomllib.loads(sweep_file.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [str(m.get("name", "")) for m in table.get("methods", []) if m.get("name")]


def method_label(config: dict[str, Any]) -> str:
    """`group-weight prior, w-noise isotropic, w-lr 0.1` from a run's configuration (defaults for missing keys)."""
    return ", ".join(f"{key} {_fmt_any(config.get(key, default))}" for key, default in METHOD_KEYS.items())


def _fmt_any(value: Any) -> str:
    return fmt(float(value)) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def load_race_runs(folder: Path) -> tuple[list[RaceRun], int]:
    """The completed runs under `folder` that report `fairness_groups`, and the number of folders skipped (not
    completed, or written before result.json had `fairness_groups`)."""
    runs, skipped = [], 0
    for path in sorted(folder.glob(f"*/{RESULT_FILE}")):
        try:
            result = RunResult.load(path, skip=SUMMARY_SKIP)
        except RunResultError:  # not a run's result (a half-written file): skipped like an incomplete run
            skipped += 1
            continue
        groups = result.fairness_groups
        if result.status is None or not result.status.completed or groups is None or not groups.groups:
            skipped += 1
            continue
        config = result.config
        meta = read_json(path.parent / "run.json")
        weight = config.get("group-weight", "prior")
        method = meta.get("method") or ("steffle-balanced" if weight == "balanced" else "steffle")
        timing = result.timing or Timing()
        runs.append(
            RaceRun(
                folder=path.parent,
                method=str(method),
                epsilon=plots.as_float(config.get("epsilon", math.inf)),
                lam=plots.as_float(config.get("lambda", 0.0)),
                seed=int(config.get("seed", 0)),
                error=float(result.final.error),
                dp_all=float(groups.dp_violation),
                dp_min=float(groups.dp_violation_min_support),
                min_support=int(groups.min_support),
                groups=[g.to_json() for g in groups.groups],
                label=method_label(config),
                rho=min(prior) if (prior := (result.server_state or {}).get("prior")) else None,
                wall=timing.total_seconds,
                cpu=timing.extras.get("cpu_seconds", meta.get("cpu_seconds")),
            )
        )
    return runs, skipped


def _cells(runs: Sequence[RaceRun], order: Order) -> dict[tuple[float, str, float], list[RaceRun]]:
    """Runs by (epsilon, method, lambda). Lambda 0 has no fairness term, so its runs belong to every method."""
    cells: dict[tuple[float, str, float], list[RaceRun]] = defaultdict(list)
    methods = sorted({r.method for r in runs if r.lam != 0}, key=order) or sorted({r.method for r in runs}, key=order)
    for r in runs:
        targets = methods if r.lam == 0 else [r.method]
        for method in targets:
            cells[(r.epsilon, method, r.lam)].append(r)
    return cells


def _labels(runs: Sequence[RaceRun]) -> dict[str, str]:
    """Each method's label: its name and what sets it apart (from its runs with a fairness term)."""
    labels: dict[str, str] = {}
    for r in sorted(runs, key=lambda r: r.lam == 0):
        labels.setdefault(r.method, f"{r.method} ({r.label})")
    return labels


Summary = Mapping[tuple[float, str], Mapping[float, tuple[float, float, float]]]


def _support_table(runs: Sequence[RaceRun], order: Order) -> list[str]:
    """Each group's test support (the test split depends on the seed only) and predicted-positive rate at lambda 0
    and at REFERENCE_LAMBDA for every method, at the sweep's largest epsilon."""
    by_seed = {r.seed: r for r in sorted(runs, key=lambda r: (r.seed, r.lam))}
    first = next(iter(by_seed.values()))
    names = [g["name"] for g in first.groups]
    total = statistics.fmean(sum(g["support"] for g in r.groups) for r in by_seed.values())
    epsilon = max(r.epsilon for r in runs)
    cells = _cells(runs, order)
    columns = [("lambda 0", [r for r in runs if r.epsilon == epsilon and r.lam == 0])]
    for method in sorted({m for _, m, _ in cells}, key=order):
        chosen = cells.get((epsilon, method, REFERENCE_LAMBDA), [])
        if chosen:
            columns.append((f"{method}, lambda {fmt(REFERENCE_LAMBDA)}", chosen))
    lines = [
        f"Each group's test support (records of the pooled test splits; seeds {', '.join(map(str, sorted(by_seed)))}), "
        f"its share of the test records, and its rate of positive predictions P[yhat = 1 | group] at epsilon "
        f"{fmt(epsilon)} (mean ± sd over seeds; a rate estimated from n records has a sampling sd of "
        f"sqrt(p (1 - p) / n), about 0.035 for p = 0.1 and n = 70). Groups under {first.min_support} test records are "
        "left out of the min-support violation.",
        "",
        "| group | test support | share | " + " | ".join(f"P[yhat=1], {label}" for label, _ in columns) + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]
    for i, name in enumerate(names):
        supports = [r.groups[i]["support"] for r in by_seed.values()]
        low, high = min(supports), max(supports)
        texts = []
        for _, chosen in columns:
            rates = [r.groups[i]["prediction_rate"][-1] for r in chosen]
            rates = [p for p in rates if p is not None]
            texts.append(mean_sd_value_text(rates) if rates else "-")
        support = (f"{low}" if low == high else f"{low}-{high}") + (
            "" if low >= first.min_support else " (under min support)"
        )
        share = 100 * statistics.fmean(supports) / total
        lines.append(f"| {name} | {support} | {share:.1f}% | " + " | ".join(texts) + " |")
    return lines


def _conclusion(summary: Summary, decided_by_small: tuple[int, int], order: Order) -> list[str]:
    """Per epsilon and method: the violations at lambda 0 and at REFERENCE_LAMBDA, and the lowest min-support
    violation within ERROR_BUDGET of lambda 0's error; per epsilon, which method reaches the lowest; and how often a
    group under the min support decides the all-groups violation."""
    lines = []
    for epsilon in sorted({e for e, _ in summary}):
        best: dict[str, tuple[float, float, float, float]] = {}
        for method in sorted((m for e, m in summary if e == epsilon), key=order):
            by_lam = summary[(epsilon, method)]
            if 0.0 not in by_lam:
                continue
            base = by_lam[0.0]
            text = f"- epsilon {fmt(epsilon)}, {method}:"
            ref = by_lam.get(REFERENCE_LAMBDA)
            if ref is not None:
                text += (
                    f" lambda {fmt(REFERENCE_LAMBDA)} takes the violation over all groups from {base[1]:.4f} to "
                    f"{ref[1]:.4f} ({100 * (ref[1] / base[1] - 1):+.0f}%) and over the groups with min support from "
                    f"{base[2]:.4f} to {ref[2]:.4f} ({100 * (ref[2] / base[2] - 1):+.0f}%), error {base[0]:.4f} -> "
                    f"{ref[0]:.4f};"
                )
            lam, (err, vio_all, vio_min) = lowest_within_budget(by_lam, ERROR_BUDGET)
            best[method] = lam, err, vio_all, vio_min
            text += (
                f" within +{ERROR_BUDGET:g} error of lambda 0 its lowest min-support violation is {vio_min:.4f} "
                f"({100 * (vio_min / base[2] - 1):+.0f}%; lambda {fmt(lam)}, error {err:.4f})."
            )
            lines.append(text)
        if len(best) > 1:
            winner = min(best, key=lambda m: (best[m][3], order(m)))
            lines.append(
                f"- epsilon {fmt(epsilon)}: within that error budget the lowest min-support violation is "
                f"{winner}'s ({best[winner][3]:.4f}, lambda {fmt(best[winner][0])})"
                + "".join(
                    f"; {m}: {v[3]:.4f} (lambda {fmt(v[0])})"
                    for m, v in sorted(best.items(), key=lambda kv: order(kv[0]))
                    if m != winner
                )
                + "."
            )
    small, total = decided_by_small
    if total:
        lines.append(
            f"- In {small} of {total} runs the violation over all groups is larger than over the groups with min "
            "support: there a group under the min support decides the all-groups figure."
        )
    return ["Computed from the tables:", "", *lines] if lines else []


def race_figure(summary: Summary, labels: Mapping[str, str], order: Order, title: str) -> Any:
    """Min-support violation against test error (means over seeds), one panel per epsilon, one curve per method
    traced by lambda."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = sorted({e for e, _ in summary})
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.8 * len(epsilons), 5.2), layout="constrained", squeeze=False)
    for ax, epsilon in zip(axes[0], epsilons, strict=True):
        for method in sorted((m for e, m in summary if e == epsilon), key=order):
            points = sorted(summary[(epsilon, method)].items())
            ax.plot([v[0] for _, v in points], [v[2] for _, v in points], marker="o", label=labels.get(method, method))
            for lam, v in points:
                ax.annotate(fmt(lam), (v[0], v[2]), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_title(f"epsilon {fmt(epsilon)}", fontsize=9)
        ax.set_xlabel("test error")
        ax.set_ylabel("DP violation, groups with min support")
        ax.grid(alpha=0.3)
    handles, names = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=2, fontsize=7)  # below the panels, off the data
    fig.suptitle(f"SteFFLe on {title}: violation against error, traced by lambda", fontsize=10)
    return fig


def race_section(
    sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path
) -> tuple[list[str], dict[str, RunFiles]]:
    """Markdown of the many-valued-attribute section: why the papers' ERMI struggles there, then one subsection per
    sweep of :data:`MANY_VALUED` (:func:`sweep_subsection`); and, per sweep, the runs read."""
    lines = [
        RACE_HEADING,
        "",
        "Issue 20: on an attribute with many values and small groups, lambda moves the demographic-parity violation "
        "far less than on sex, and can raise it. Two causes in the algorithm: the papers' ERMI is a chi-square average "
        "over the groups, each weighted by its share p_S(r), so a gap between small groups hardly enters it "
        "(`--group-weight balanced`: the ERMI of the group-balanced distribution, every group weighing 1/k); and every "
        "entry of the W release is noised at the smallest group's radius 2/sqrt(rho) (`--w-noise per-group`: each "
        "group's row at its own radius 2/sqrt(p_S(r)), the same mechanism for the accountant). The violation is "
        "reported over all groups (`final.dp_violation`) and over the groups with enough test records "
        "(`fairness_groups` in result.json, `--min-support`): a group of 70 test records moves its rate by a few "
        "hundredths through sampling alone. The method `steffle-pg-w0.02` below (per-group W noise, W step 0.02) is "
        "SteFFLe's default since 2026-11-25 (`--w-noise auto`, per-group); `steffle` is the papers' (and "
        "the earlier default); every sweep pins its options, so the runs do not change with the defaults.",
        "",
    ]
    files: dict[str, RunFiles] = {}
    summaries: dict[str, Summary] = {}
    for sweep in MANY_VALUED:
        sub, files[sweep.name], summaries[sweep.title] = sweep_subsection(sweep, sweeps, sweep_files, figures, doc_dir)
        lines += sub
    return [*lines, *across_lines(summaries)], files


def across_lines(summaries: Mapping[str, Summary]) -> list[str]:
    """One table over the sweeps: for every method that two or more sweeps ran, per (sweep, epsilon) the lowest
    min-support violation within ERROR_BUDGET of lambda 0's error, relative to lambda 0 (and its lambda)."""
    columns = [(title, eps) for title, summary in summaries.items() for eps in sorted({e for e, _ in summary})]
    methods: dict[str, int] = defaultdict(int)
    for summary in summaries.values():
        for m in {m for _, m in summary}:
            methods[m] += 1
    common = [m for m in sorted(methods, key=lambda m: (m.count("-"), m)) if methods[m] > 1]
    if len(summaries) < 2 or not common:
        return []
    lines = [
        "### Across the attributes",
        "",
        f"Each method that two or more sweeps ran: the lowest violation over the groups with min support within "
        f"+{ERROR_BUDGET:g} test error of lambda 0, against lambda 0's (its lambda in brackets; +0% at lambda 0: no "
        "lambda of the method helps within that budget).",
        "",
        "| method | " + " | ".join(f"{title}, eps {fmt(eps)}" for title, eps in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for method in common:
        cells = []
        for title, eps in columns:
            by_lam = summaries[title].get((eps, method))
            if not by_lam or 0.0 not in by_lam:
                cells.append("-")
                continue
            lam, (_, _, vio_min) = lowest_within_budget(by_lam, ERROR_BUDGET)
            cells.append(f"{100 * (vio_min / by_lam[0.0][2] - 1):+.0f}% (lambda {fmt(lam)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def sweep_subsection(
    sweep: ManyValuedSweep, sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path
) -> tuple[list[str], RunFiles, Summary]:
    """One sweep's subsection: commands, run state, per epsilon a table of lambda against the error and the
    violations over all groups and over the groups with min support (mean ± sd over seeds) for every method, the
    groups' test supports and rates, a conclusion computed from the tables, and a figure in `figures`; and the
    summary behind them ((epsilon, method) -> lambda -> mean error, violation all groups, violation min support)."""
    folder, sweep_file = sweeps / sweep.name, sweep_files / f"{sweep.name}.toml"
    command = f"{DATA_ENV} silofl sweep {rel(sweep_file, ROOT)}"
    lines = [f"### {sweep.title}", "", f"The attribute: {sweep.what}.", ""]
    if not folder.is_dir():
        return (
            [*lines, f"Not generated yet: run `{command}`, then `python benchmarks/results.py --only race`.", ""],
            RunFiles(),
            {},
        )
    runs, skipped = load_race_runs(folder)
    files = RunFiles()
    for r in runs:
        files.add(r.wall, r.cpu)
    lines += ["Commands:", "", "```bash", command, "python benchmarks/results.py --only race", "```", ""]
    lines += [f"Runs: {sweep_state_text(folder, sweep_file, len(runs), skipped)}.", ""]
    if not runs:
        return lines, files, {}
    order = method_order(sweep_methods(sweep_file))
    labels = _labels(runs)
    private = sorted(2 / math.sqrt(r.rho) for r in runs if r.rho and math.isfinite(r.epsilon))
    if private:
        lines += [
            f"The W-noise radius 2/sqrt(rho) of the papers' release, from each private run's noised prior: "
            f"{private[0]:.1f} to {private[-1]:.1f} (a binary attribute with shares 1/3 and 2/3 has 3.5).",
            "",
        ]
    lines += ["Methods: " + "; ".join(labels[m] for m in sorted(labels, key=order)) + ".", ""]
    cells = _cells(runs, order)
    summary: dict[tuple[float, str], dict[float, tuple[float, float, float]]] = defaultdict(dict)
    for epsilon in sorted({r.epsilon for r in runs}):
        lines += [
            f"Epsilon {fmt(epsilon)}: test error and demographic-parity violation over all groups and over the groups "
            f"with at least {runs[0].min_support} test records (mean ± sd over seeds; lambda 0, without the fairness "
            "term, is one set of runs shared by every method):",
            "",
            "| method | lambda | seeds | test error | violation, all groups | violation, min support |",
            "|---|---|---|---|---|---|",
        ]
        for (eps, method, lam), chosen in sorted(cells.items(), key=lambda kv: (order(kv[0][1]), kv[0][2])):
            if eps != epsilon:
                continue
            errors, alls, mins = ([getattr(r, k) for r in chosen] for k in ("error", "dp_all", "dp_min"))
            texts = " | ".join(mean_sd_value_text(values) for values in (errors, alls, mins))
            lines.append(f"| {method} | {fmt(lam)} | {len(chosen)} | {texts} |")
            summary[(epsilon, method)][lam] = (plots.mean_sd(errors)[0], plots.mean_sd(alls)[0], plots.mean_sd(mins)[0])
        lines.append("")
    lines += [*_support_table(runs, order), ""]
    decided = (sum(r.dp_all > r.dp_min + 1e-12 for r in runs), len(runs))
    lines += [*_conclusion(summary, decided, order), ""]
    try:
        fig = race_figure(summary, labels, order, sweep.title)
    except ImportError:  # matplotlib is optional for the tables
        return lines, files, summary
    figures.mkdir(parents=True, exist_ok=True)
    path = figures / sweep.figure
    fig.savefig(path, dpi=150)
    fig.clear()
    lines += [f"![SteFFLe on {sweep.title}]({rel(path, doc_dir)})", ""]
    return lines, files, summary
