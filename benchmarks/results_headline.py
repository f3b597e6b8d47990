"""The SteFFLe paper's headline comparison, and the factors behind the gap to Tran et al. (issue 20).

Used by `benchmarks/results.py` (sections "Headline: every method at the best error all of them reach" and "The gap
to Tran et al.: the matching rule") and by `benchmarks/results_tran_gap.py` (the factors: the rule on two methods, the
noise tables); pure functions over run records and mean points, no run is started here.

The headline rule. The paper reports "reductions in demographic parity violations of around 75.47% and 52.93%
compared with Tran et al. [2021] and Ling et al. [2024]" and "an average reduction in equalized odds violation of
95.42% compared to Ling et al. [2024]" "for fixed accuracy level", without saying which level. Here, per panel
(dataset, fairness notion, h, epsilon):

1. each method's points are the means over seeds of its configurations (SteFFLe: one per lambda; Tran et al.: one
   per dual step; FedFDP: one per lambda);
2. the matched test error e* is the best error that every compared method reaches: the largest of the methods'
   smallest errors (:func:`best_common_error`);
3. a method's violation at e* is the lowest it reaches at an error <= e*: its Pareto front, linearly interpolated
   between front points, flat after the last one (:func:`violation_at`);
4. SteFFLe against a baseline: 1 - v_SteFFLe(e*) / v_baseline(e*) (positive: SteFFLe lower; the paper's "-75.47%"
   is a reduction of 0.7547).

Unlike the reduction tables of the sweep sections (baseline points matched inside SteFFLe's error range), every panel
gets a number: each method is read at an error it reaches. The same rule on each seed's runs alone gives one value
per seed; the spread of those values is the confidence interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.results_runs import STEFFLE, result_of
from benchmarks.results_steffle import SweepResult
from benchmarks.results_text import fmt, pct
from silofl.server import plots
from silofl.server.analysis import Point, mean_points, pareto_front
from silofl.server.run_result import RunResult

#: The methods of the headline: SteFFLe and the two baselines of the paper's headline numbers.
HEADLINE_METHODS = (STEFFLE, "tran", "fedfdp")
HEADLINE_HEADING = "### Headline: every method at the best error all of them reach"
GAP_HEADING = "### The gap to Tran et al.: the matching rule"
#: Student's t quantile t_{0.975, k} for k = 1..9 degrees of freedom (a 95% interval over k + 1 seeds).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)
#: The paper's headline numbers (Section 5, "Average results"), as reductions; None: no number given.
PAPER_HEADLINE = {("dp", "tran"): 0.7547, ("dp", "fedfdp"): 0.5293, ("eo", "fedfdp"): 0.9542, ("eo", "tran"): None}


# -- the rule (pure) --------------------------------------------------------------------------------------------------


def violation_at(points: Sequence[Point], error: float) -> float | None:
    """The lowest violation `points` reach at a test error <= `error`: their Pareto front, linearly interpolated
    between front points and flat after the last one; None when every point's error is above `error`."""
    front = pareto_front(points)
    if not front or error < front[0][0]:
        return None
    for (e0, v0), (e1, v1) in itertools.pairwise(front):
        if e0 <= error <= e1:
            return v0 if e1 == e0 else v0 + (v1 - v0) * (error - e0) / (e1 - e0)
    return front[-1][1]


def best_common_error(points: Mapping[str, Sequence[Point]]) -> float | None:
    """The best test error every method reaches: the largest of the methods' smallest errors (None if a method has
    no point)."""
    if not points or any(not p for p in points.values()):
        return None
    return max(min(e for e, _ in p) for p in points.values())


@dataclass(frozen=True)
class Headline:
    """One panel under the headline rule: the matched error, the method that sets it, and each method's violation."""

    error: float
    set_by: str
    violations: dict[str, float]

    def reduction(self, baseline: str, reference: str = STEFFLE) -> float | None:
        """1 - v_reference / v_baseline at the matched error (None when the baseline's violation is 0)."""
        base = self.violations[baseline]
        return None if base <= 0 else 1.0 - self.violations[reference] / base

    def difference(self, baseline: str, scale: float, reference: str = STEFFLE) -> float | None:
        """(v_baseline - v_reference) / `scale`: one seed's reduction on the scale of the mean points' baseline
        violation `scale` (a ratio of one seed's violations explodes when the baseline's is near 0)."""
        if scale <= 0:
            return None
        return (self.violations[baseline] - self.violations[reference]) / scale


def headline(points: Mapping[str, Sequence[Point]]) -> Headline | None:
    """The headline rule on one panel's points (method -> (error, violation) means); None if a method is missing."""
    error = best_common_error(points)
    if error is None:
        return None
    set_by = max(points, key=lambda m: min(e for e, _ in points[m]))
    values = {m: violation_at(p, error) for m, p in points.items()}
    assert all(v is not None for v in values.values())  # every method reaches e* by construction
    return Headline(error, set_by, {m: float(v) for m, v in values.items() if v is not None})


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of `values` (None for fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = plots.mean_sd(list(values))
    half = T_975[min(n - 2, len(T_975) - 1)] * sd / math.sqrt(n)
    return mean - half, mean + half


# -- panels of a sweep ------------------------------------------------------------------------------------------------


def panel_points(
    records: Sequence[plots.RunRecord], h: float, epsilon: float, metric: str, methods: Iterable[str]
) -> dict[str, list[Point]]:
    """Per method in `methods`, the mean points of the multi-silo runs of panel (h, epsilon)."""
    members = [
        r
        for r in records
        if r.method in set(methods) and plots.has(r, "error") and plots.has(r, metric) and plots.in_panel(r, h, epsilon)
    ]
    return {m: [p.xy for p in pts] for m, pts in mean_points(members, metric).items()}


@dataclass
class HeadlinePanel:
    dataset: str
    fairness: str
    h: float
    epsilon: float
    value: Headline | None
    per_seed: dict[int, Headline] = field(default_factory=dict)

    def seed_values(self, baseline: str) -> list[float]:
        """Each seed's reduction against `baseline`: that seed's (v_baseline - v_SteFFLe) at its own e*, over the
        baseline's violation at e* of the mean points. Each seed is a replicate of the rule with its own e*, so the
        seeds' values need not average to the panel's value on the means."""
        if self.value is None:
            return []
        scale = self.value.violations[baseline]
        return [v for h in self.per_seed.values() if (v := h.difference(baseline, scale)) is not None]


def headline_panels(result: SweepResult, methods: Sequence[str] = HEADLINE_METHODS) -> list[HeadlinePanel]:
    """The headline rule on every panel of one sweep: on the means over seeds, and on each seed's runs alone."""
    metric = plots.FAIRNESS_METRIC[result.fairness]
    seeds = sorted({int(r.get("seed") or 0) for r in result.records})
    out = []
    for panel in result.panels:
        if not math.isfinite(panel.epsilon):
            continue
        hp = HeadlinePanel(result.dataset, result.fairness, panel.h, panel.epsilon, None)
        points = panel_points(result.records, panel.h, panel.epsilon, metric, methods)
        if set(points) == set(methods):
            hp.value = headline(points)
            for seed in seeds:
                mine = [r for r in result.records if int(r.get("seed") or 0) == seed]
                got = panel_points(mine, panel.h, panel.epsilon, metric, methods)
                if set(got) == set(methods) and (value := headline(got)) is not None:
                    hp.per_seed[seed] = value
        out.append(hp)
    return out


# -- the section ------------------------------------------------------------------------------------------------------


def _name(method: str) -> str:
    return {STEFFLE: "SteFFLe", "tran": "Tran et al.", "fedfdp": "FedFDP"}.get(method, method)


def _interval_text(values: Sequence[float]) -> str:
    ci = t_interval(values)
    return "-" if ci is None else f"[{pct(ci[0])}, {pct(ci[1])}]"


def headline_section(results: Sequence[SweepResult]) -> list[str]:
    """The headline table per panel and its summary next to the paper's numbers."""
    baselines = [m for m in HEADLINE_METHODS if m != STEFFLE]
    panels = [p for r in results if r.panels for p in headline_panels(r)]
    lines = [
        HEADLINE_HEADING,
        "",
        "The paper's headline (\"-75.47% demographic-parity violation versus Tran et al. and -52.93% versus FedFDP at "
        'equal accuracy, and -95.42% equalized-odds violation versus FedFDP") does not say at which accuracy. The rule '
        "here (`benchmarks/results_headline.py`), per panel (dataset, fairness notion, h, epsilon): each method's "
        "points are its configurations' means over seeds; the matched test error e* is the best error that SteFFLe, "
        "Tran et al. and FedFDP all reach (the largest of their smallest errors); each method's violation at e* is "
        "the lowest it reaches at an error <= e* (its Pareto front, interpolated); SteFFLe against a baseline is "
        "1 - v_SteFFLe(e*) / v_baseline(e*) (positive: SteFFLe lower). Every panel gets a number. Seeds: the same "
        "rule on each seed's runs alone (each seed its own e*) gives per seed (v_baseline - v_SteFFLe) / "
        "v_baseline(e*) of the mean points, shown in brackets (a ratio of one seed's violations would explode when "
        "the baseline's is near 0); each seed is a replicate of the rule with its own e*, so the seeds need not "
        "average to the value on the means; the 95% interval is Student's t over the seeds.",
        "",
        "Tuning budget, the same for every panel: SteFFLe 6 lambdas {0, 0.25, 0.5, 1, 2, 4}; Tran et al. 3 dual steps "
        "{0.002, 0.01, 0.05} (multipliers from 0); FedFDP its lambda {0.1, 0.5, 2} on Adult and Credit Card, {0, "
        "0.01, 0.1, 0.5, 1, 2} on Parkinsons (its lambda 0 is DP-FedSGD); each configuration with seeds {0, 1, 2}; "
        "the rest of the configuration shared (the sweep files). What the epsilons cover differs: SteFFLe's here "
        "covers the sensitive attribute, FedFDP's the whole record; the comparison at the same guarantee, SteFFLe "
        'with `--protect record` against FedFDP, is its own section ("SteFFLe protecting the whole record against '
        'FedFDP", below).',
        "",
    ]
    if not panels:
        return [*lines, "No sweep with SteFFLe, Tran et al. and FedFDP runs found: run the sweeps above.", ""]
    head = " | ".join(f"v {_name(m)}" for m in HEADLINE_METHODS)
    red = " | ".join(f"vs {_name(b)} (seeds)" for b in baselines)
    lines += [
        f"| dataset | fairness | h | epsilon | e* (set by) | {head} | {red} |",
        "|---" * (6 + 2 * len(baselines)) + "|",
    ]
    for p in panels:
        if p.value is None:
            missing = ", ".join(_name(m) for m in HEADLINE_METHODS)
            lines.append(
                f"| {plots.DATASET_NAMES.get(p.dataset, p.dataset)} | {p.fairness} | {fmt(p.h)} | {fmt(p.epsilon)} | "
                f"no runs of all of {missing} |" + " |" * (len(HEADLINE_METHODS) + len(baselines))
            )
            continue
        vals = " | ".join(f"{p.value.violations[m]:.4f}" for m in HEADLINE_METHODS)
        reds = []
        for b in baselines:
            seed_text = ", ".join(pct(s) for s in p.seed_values(b))
            reds.append(f"{pct(p.value.reduction(b))} ({seed_text})")
        lines.append(
            f"| {plots.DATASET_NAMES.get(p.dataset, p.dataset)} | {p.fairness} | {fmt(p.h)} | {fmt(p.epsilon)} | "
            f"{p.value.error:.4f} ({_name(p.value.set_by)}) | {vals} | {' | '.join(reds)} |"
        )
    lines += [
        "",
        "Summary: the mean over panels of SteFFLe's reduction, its 95% interval over seeds (the mean over panels of "
        "each seed's bracketed values, then Student's t over the seeds), and the number of panels where SteFFLe's "
        "violation is lower, next to the paper's numbers.",
        "",
        "| fairness | SteFFLe vs | silofl: mean reduction at e* | 95% interval (seeds) | SteFFLe lower in | "
        "datasets | paper | the paper's number inside silofl's interval? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts: list[str] = []
    for fairness in ("dp", "eo"):
        mine = [p for p in panels if p.fairness == fairness and p.value is not None]
        for b in baselines:
            values = [v for p in mine if (v := p.value.reduction(b)) is not None]  # type: ignore[union-attr]
            seeds = sorted({s for p in mine for s in p.per_seed})
            per_seed = []
            for s in seeds:
                vals = [
                    v
                    for p in mine
                    if s in p.per_seed
                    and p.value is not None
                    and (v := p.per_seed[s].difference(b, p.value.violations[b])) is not None
                ]
                if vals:
                    per_seed.append(sum(vals) / len(vals))
            paper = PAPER_HEADLINE.get((fairness, b))
            ci = t_interval(per_seed)
            inside = "-" if paper is None or ci is None else ("yes" if ci[0] <= paper <= ci[1] else "no")
            datasets = sorted({plots.DATASET_NAMES.get(p.dataset, p.dataset) for p in mine})
            lower = sum(v > 0 for v in values)
            mean = sum(values) / len(values) if values else None
            lines.append(
                f"| {plots.FAIRNESS_NAMES[fairness]} | {_name(b)} | {pct(mean)} | {_interval_text(per_seed)} | "
                f"{lower} of {len(values)} panels | {', '.join(datasets) or '-'} | "
                f"{'-' if paper is None else f'{100 * paper:.2f}%'} | {inside} |"
            )
            if paper is not None:
                verdicts.append(_verdict(fairness, b, paper, mean, ci, lower, len(values)))
    return [*lines, "", "Against the paper (computed from the table above):", "", *verdicts, ""]


def _verdict(
    fairness: str, baseline: str, paper: float, mean: float | None, ci: tuple[float, float] | None, lower: int, n: int
) -> str:
    """One sentence per paper claim: silofl's mean and interval against the paper's number."""
    claim = f"- {plots.FAIRNESS_NAMES[fairness]} vs {_name(baseline)} (paper: {100 * paper:.2f}% lower)"
    if mean is None:
        return f"{claim}: no panel with runs of all three methods yet."
    where = f"SteFFLe's violation is lower in {lower} of {n} panels"
    if ci is None:
        return f"{claim}: silofl {pct(mean)}; {where}; one seed only, no interval."
    if ci[0] <= paper <= ci[1]:
        return (
            f"{claim}: silofl {pct(mean)}, 95% interval [{pct(ci[0])}, {pct(ci[1])}], which contains the paper's "
            f"number; {where}."
        )
    side = "above" if paper > ci[1] else "below"
    return (
        f"{claim}: silofl {pct(mean)}, 95% interval [{pct(ci[0])}, {pct(ci[1])}]: the paper's number lies {side} "
        f"it, so silofl disagrees; {where}."
    )


# -- the gap to Tran et al. -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GapRow:
    """One factor of the Tran-gap tables: SteFFLe and Tran et al. under the headline rule, on the means over seeds
    and on each seed's runs alone."""

    label: str
    value: Headline | None
    seeds: tuple[float, ...]  # each seed's (v_Tran - v_SteFFLe) / v_Tran(e*) of the means

    @property
    def reduction(self) -> float | None:
        return None if self.value is None else self.value.reduction("tran")

    def line(self) -> str:
        if self.value is None:
            return f"| {self.label} | no runs | | | | |"
        v = self.value.violations
        seeds = ", ".join(pct(x) for x in self.seeds) or "-"
        return (
            f"| {self.label} | {self.value.error:.4f} | {v[STEFFLE]:.4f} | {v['tran']:.4f} | {pct(self.reduction)} | "
            f"{seeds} |"
        )


def gap_row(
    label: str, points: Mapping[str, Sequence[Point]], per_seed: Sequence[Mapping[str, Sequence[Point]]]
) -> GapRow:
    """The headline rule for SteFFLe against Tran et al. on `points` (means) and on each seed's points."""
    value = headline(points) if len(points) == 2 and all(points.values()) else None
    seeds: list[float] = []
    if value is not None:
        for mine in per_seed:
            got = headline(mine) if len(mine) == 2 and all(mine.values()) else None
            if got is not None and (d := got.difference("tran", value.violations["tran"])) is not None:
                seeds.append(d)
    return GapRow(label, value, tuple(seeds))


def gap_conclusion(rows: Sequence[GapRow]) -> str:
    """Which factor moves SteFFLe's reduction against Tran et al. most from the first row (the main sweeps), against
    the seed spread of that first row (computed, not written by hand)."""
    base = rows[0] if rows else None
    if base is None or base.reduction is None:
        return "No reference point (the main sweeps' runs are missing)."
    moves = [(abs(r.reduction - base.reduction), r) for r in rows[1:] if r.reduction is not None]
    if not moves:
        return "No factor's runs found yet."
    size, top = max(moves, key=lambda m: m[0])
    spread = plots.mean_sd(list(base.seeds))[1] if len(base.seeds) > 1 else float("nan")
    verdict = (
        "beyond the seed spread"
        if math.isfinite(spread) and size > 2 * spread
        else "within twice the seed sd of the reference, so no factor moves it clearly"
    )
    direction = "in SteFFLe's favour" if top.reduction > base.reduction else "against SteFFLe"
    best = max((r for r in rows if r.reduction is not None), key=lambda r: r.reduction)  # type: ignore[arg-type,return-value]
    return (
        f"Reference (main sweeps): {pct(base.reduction)} (seed sd {pct(spread)}). The largest move is "
        f"'{top.label}': {pct(top.reduction)}, {100 * size:.1f} points {direction}, {verdict}. The best SteFFLe "
        f"gets over these rows: {pct(best.reduction)} ('{best.label}')."
    )


def gap_section(results: Sequence[SweepResult]) -> list[str]:
    """The Tran et al. gap under two matching rules, over every panel of the sweeps (the factors: the next section,
    `benchmarks/results_tran_gap.py`)."""
    lines = [
        GAP_HEADING,
        "",
        "SteFFLe against Tran et al. under the two matching rules of this document, over every panel of the sweeps "
        "(mean over the panels with a number). Reduction: 1 - v_SteFFLe / v_Tran, positive when SteFFLe is lower.",
        "",
        "| fairness | rule | SteFFLe vs Tran et al. | panels with a number |",
        "|---|---|---|---|",
    ]
    for fairness in ("dp", "eo"):
        mine = [r for r in results if r.fairness == fairness and r.panels]
        inside = [p.reductions["tran"].mean for r in mine for p in r.panels if "tran" in p.reductions]
        found = [v for v in inside if v is not None]
        star = [
            v
            for r in mine
            for hp in headline_panels(r, (STEFFLE, "tran"))
            if hp.value is not None and (v := hp.value.reduction("tran")) is not None
        ]
        for rule, values, total in (
            (
                "Tran's points inside SteFFLe's error range, SteFFLe's front interpolated (the sweep sections)",
                found,
                len(inside),
            ),
            ("e*: the best error both reach (the headline)", star, len(star)),
        ):
            mean = sum(values) / len(values) if values else None
            lines.append(f"| {plots.FAIRNESS_NAMES[fairness]} | {rule} | {pct(mean)} | {len(values)} / {total} |")
    lines.append("")
    lines += [
        "The other factors (the tuning budget, SteFFLe's W radius and clip, the noise, the sampling, the authors' "
        "code) are tested one at a time on Adult, demographic parity, h 0: the next section.",
        "",
    ]
    return lines


def cross_noise_table(records: Sequence[plots.RunRecord], h: float = 0.0) -> dict[tuple[float, float], float | None]:
    """(SteFFLe's epsilon, Tran et al.'s epsilon) -> SteFFLe's reduction against Tran et al. under the headline rule,
    each method read from its own epsilon's runs: what the comparison becomes when one method gets less noise."""
    metric = "dp_violation"
    eps = sorted({r.epsilon for r in records if r.method in (STEFFLE, "tran") and math.isfinite(r.epsilon)})
    out: dict[tuple[float, float], float | None] = {}
    for mine in eps:
        steffle = panel_points([r for r in records if r.method == STEFFLE], h, mine, metric, [STEFFLE])
        for theirs in eps:
            tran = panel_points([r for r in records if r.method == "tran"], h, theirs, metric, ["tran"])
            points = {STEFFLE: steffle.get(STEFFLE, []), "tran": tran.get("tran", [])}
            value = headline(points) if all(points.values()) else None
            out[(mine, theirs)] = None if value is None else value.reduction("tran")
    return out


def cross_noise_lines(records: Sequence[plots.RunRecord]) -> list[str]:
    table = cross_noise_table(records)
    if not table:
        return []
    eps = sorted({e for e, _ in table})
    lines = [
        "What a difference in calibration between the two methods would do (Adult, demographic parity, h 0, the main "
        "sweep's runs): SteFFLe read at one epsilon, Tran et al. at another, under the headline rule. The diagonal is "
        "the fair comparison; below it (SteFFLe's epsilon larger) SteFFLe has less noise than Tran et al.",
        "",
        "| SteFFLe's epsilon | " + " | ".join(f"vs Tran et al. at epsilon {fmt(e)}" for e in eps) + " |",
        "|---" * (len(eps) + 1) + "|",
    ]
    for mine in eps:
        lines.append(f"| {fmt(mine)} | " + " | ".join(pct(table[(mine, theirs)]) for theirs in eps) + " |")
    same = [v for (a, b), v in table.items() if a == b and v is not None]
    less = [v for (a, b), v in table.items() if a > b and v is not None]
    if same and less:
        lines += [
            "",
            f"At the same epsilon the reduction is {pct(min(same))} to {pct(max(same))}; with less noise than Tran "
            f"et al. SteFFLe reaches {pct(max(less))} at best (computed from the table).",
        ]
    return [*lines, ""]


def noise_lines(records: Sequence[plots.RunRecord]) -> list[str]:
    """The paper's closed-form noise (Theorem 3.3, as result.json's privacy.closed_form reports it) against the
    noise the runs used (silofl's accountant), SteFFLe on Adult, per epsilon."""
    rows: dict[float, list[tuple[float, float, float, float]]] = {}
    for r in records:
        if r.method != STEFFLE or not math.isfinite(r.epsilon):
            continue
        closed = _closed_form(result_of(r))
        if closed:
            rows.setdefault(r.epsilon, []).extend(closed)
    if not rows:
        return []
    lines = [
        "**The noise.** Every run here uses silofl's accountant for both methods. The paper calibrates SteFFLe's noise "
        "by its Theorem 3.3 closed form; result.json reports that closed form next to the noise the run used "
        "(noise std per coordinate on the batch mean, Adult, SteFFLe, mean over its runs and silos):",
        "",
        "| epsilon | theta: silofl | theta: closed form | W: silofl | W: closed form |",
        "|---|---|---|---|---|",
    ]
    for eps, vals in sorted(rows.items()):
        mean = [sum(v[i] for v in vals) / len(vals) for i in range(4)]
        lines.append(f"| {fmt(eps)} | {mean[0]:.4f} | {mean[1]:.4f} | {mean[2]:.4f} | {mean[3]:.4f} |")
    return [
        *lines,
        "",
        "Tran et al.'s runs use the same accountant, so the noise is not a difference between the two methods here. "
        "The row 'noise, bounded' of the tables above gives SteFFLe no noise at all against Tran et al. at each "
        "epsilon: the most any calibration of SteFFLe's noise could change.",
        "",
    ]


def _closed_form(result: RunResult) -> list[tuple[float, float, float, float]]:
    """Per silo (silofl's sigma_theta, the paper's, silofl's sigma_w, the paper's) from the result's
    `privacy.closed_form` (SteFFLe's privacy report); [] for a run without it."""
    closed = result.privacy.get("closed_form") if result.privacy is not None else None
    per = (closed or {}).get("per_silo", {})
    return [
        (v["silofl_sigma_theta"], v["papers_sigma_theta"], v["silofl_sigma_w"], v["papers_sigma_w"])
        for v in per.values()
        if all(k in v for k in ("silofl_sigma_theta", "papers_sigma_theta", "silofl_sigma_w", "papers_sigma_w"))
    ]
