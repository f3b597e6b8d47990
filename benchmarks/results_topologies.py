"""SteFFLe with the sensitive attributes held apart (issues 18 and 31; docs/algorithms/steffle.md, separate parties) in
docs/RESULTS.md: the first version's section kept as history, and the sealed-records sweep against silos (the noise
each topology puts on the fairness gradient, and the silos' violation at the same test error)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.results_runs import (
    RunFiles,
    figure_lines,
    result_of,
    seconds_per_round,
    sigma_text,
    sweep_opening,
)
from benchmarks.results_text import fmt, section_lines
from silofl.server import plots
from silofl.server.analysis import Point, matched_error_reduction
from silofl.server.run_result import RunResult, as_float

#: The first version's topology comparison (issue 18): frozen history, never regenerated (:func:`topology_history`).
#: Its runs sent rows (id, y, F(x_i), J_F(x_i)) through the server (options `share-rows` and `keep-rate`, removed in
#: issue 31), so neither its sweep file (benchmarks/sweeps/history/steffle_adult_topologies.toml) nor its result.json
#: files validate against this version; they rerun at silofl commit :data:`HISTORY_COMMIT`.
TOPOLOGY_HEADING = "## SteFFLe with separate sensitive parties: silos, divided, central-sensitive"


#: The last silofl commit with the first version's options (the one before their removal).
HISTORY_COMMIT = "cc0e2f6"


#: The sealed-records sweep (issue 31, the spec's "Revision"): the parties' protocol against silos.
SEALED_SWEEP = ("steffle_adult_sealed", "adult", "dp")


SEALED_HEADING = "## SteFFLe with separate sensitive parties, sealed records (the default)"


SEALED_INTRO = (
    "The parties' protocol since issue 31 (the second version of the parties' design, docs/algorithms/steffle.md; the "
    "first version's row modes, the previous section, are removed): at setup each feature party sends each sensitive "
    "party the (pseudonym, features, label) of the records whose sensitive attribute it holds, encrypted end to end "
    "(the server relays bytes it cannot read); each round a sensitive party computes F and J_F from the broadcast model"
    " on its own secret Poisson sample at the silos' rate q = m / (n / N), and sends noised means: the silos' amplified"
    " mechanism. The server sees the model, W, means, counts and sealed bytes, no record id, feature, label, output or "
    "Jacobian (SECURITY.md: what each party learns over a run). Same base as the previous section (3 parties, 40 "
    "epochs, batch 256); bytes and time per round against silos: `benchmarks/steffle_parties.py` "
    "(benchmarks/README.md)."
)


def noise_on_h(result: RunResult) -> float | None:
    """The std per coordinate of the noise on the server's h_theta in one round (the fairness gradient that enters
    theta's step as lambda h), from a run's result.json: silos: sqrt(sum_j (w_j sigma_j C / (q_j n_j))^2), w_j = n_j/n
    (each silo's noised sum over its own sample divided by q_j n_j, averaged with weights w_j); separate parties:
    sqrt(sum_c sigma_c^2) C / (q n), each sensitive party's noised sum over its own sample at the silos' rate q
    divided by q n (its mean weighted n_c / n), n the feature parties' records. None for a non-private run or one
    without the fairness term."""
    config, privacy = result.config, result.privacy
    per = list((privacy.per_silo or {}).values()) if privacy is not None else []
    target = privacy.epsilon_target if privacy is not None and privacy.epsilon_target is not None else 0
    if not per or float(config.get("lambda", 0)) == 0 or not math.isfinite(as_float(target)):
        return None
    clip = float(config.get("clip", 1.0))
    if str(config.get("topology", "silos")) == "silos":
        n = sum(p.n_train for p in per)
        return clip * math.sqrt(
            sum((p.n_train / n * p.noise_multiplier / (p.sampling_rate * p.n_train)) ** 2 for p in per)
        )
    feature_parties = result.federation.silos if result.federation is not None else None
    n = sum(f.n_train for f in feature_parties or [])
    return clip * math.sqrt(sum(p.noise_multiplier**2 for p in per)) / (per[0].sampling_rate * n)


def topology_history(document: str) -> list[str]:
    """The first version's topology section as `document` (the existing docs/RESULTS.md, "" if none) has it,
    verbatim: its runs used options removed since (:data:`TOPOLOGY_HEADING`), so it is history, never regenerated.
    Without it, a line saying where it is."""
    section = section_lines(document, TOPOLOGY_HEADING)
    if section:
        return section
    return [
        TOPOLOGY_HEADING,
        "",
        "The first version's measurements (rows through the server, removed in issue 31) are history: see "
        f"docs/RESULTS.md at silofl commit `{HISTORY_COMMIT}`, where its sweep file reruns.",
        "",
    ]


def sealed_section(sweeps: Path, sweep_files: Path, figures: Path, doc_dir: Path) -> tuple[list[str], RunFiles]:
    """Markdown of the sealed-records comparison (silos, divided, central-sensitive): its figure, and per (epsilon,
    method, batch, lambda) the error, violation, the noise each topology puts on h and the seconds per round (each
    mean ± sd over seeds)."""
    name, dataset, fairness = SEALED_SWEEP
    folder, sweep_file = sweeps / name, sweep_files / f"{name}.toml"
    lines = [SEALED_HEADING, "", SEALED_INTRO, ""]
    metric = plots.FAIRNESS_METRIC[fairness]
    opening, records, files = sweep_opening(folder, sweep_file, "sealed", metric)
    lines += opening
    if not records:
        return lines, files
    drawn = [(f"sealed-{plots.slug(dataset, fairness)}", fig) for _, fig in plots.fairness_figures(records)]
    lines += figure_lines(drawn, figures, "SteFFLe topologies: fairness violation vs test error", doc_dir)
    lines += [
        f"Test error and {plots.METRIC_LABELS[metric]} (mean ± sd over seeds); noise on h: the std per coordinate "
        "of the noise on the server's fairness gradient h_theta in one round (`noise_on_h`: the silos' or the "
        "sensitive parties' noise multipliers sigma, times C, over the records the sum is divided by), the cost "
        "each topology pays for its privacy; sensitive-side sigma and its sampling rate; seconds per round of the "
        "run on the in-process engine (`timing.seconds_per_round`, two runs at a time on 2 cores).",
        "",
        "| epsilon | method | batch | lambda | seeds | test error | violation | noise on h | sigma (rate) | s/round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[plots.RunRecord]] = defaultdict(list)
    for r in records:
        groups[(r.epsilon, r.method, plots.as_float(r.get("lambda")))].append(r)
    order = {m: i for i, m in enumerate(dict.fromkeys(r.method for r in records))}
    curves: dict[tuple, list[tuple[Point, float | None]]] = defaultdict(list)  # (eps, method, topology, batch)
    for (eps, method, lam), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])):
        error = plots.mean_sd([r.final["error"] for r in runs])
        violation = plots.mean_sd([r.final[metric] for r in runs])
        noise = [v for r in runs if (v := noise_on_h(result_of(r))) is not None]
        sigma = sigma_text(runs[0]) if lam > 0 else "-"
        seconds = plots.mean_sd(seconds_per_round(runs))
        batch = fmt(runs[0].get("batch-size"))
        noise_text = f"{statistics.mean(noise):.4f}" if noise else "-"
        lines.append(
            f"| {fmt(eps)} | {method} | {batch} | {fmt(lam)} | {len(runs)} | {error[0]:.4f} ± {error[1]:.4f} | "
            f"{violation[0]:.4f} ± {violation[1]:.4f} | {noise_text} | {sigma} | {seconds[0]:.3f} |"
        )
        curves[(eps, method, _topology(runs[0]), batch)].append(
            ((error[0], violation[0]), statistics.mean(noise) if noise else None)
        )
    lines += ["", *_topology_summary(curves), *_same_seed_text(records, metric)]
    return [*lines, ""], files


def _topology(record: plots.RunRecord) -> str:
    """A run's topology (runs on silos may not record one)."""
    return str(record.get("topology") or "silos")


def _topology_summary(curves: Mapping[tuple, list[tuple[Point, float | None]]]) -> list[str]:
    """Per epsilon and curve with separate parties: its noise on h against the silos' at the same batch size, and the
    silos' violation at the same test error (:func:`matched_error_reduction` with the silos as the reference curve:
    positive = the silos' violation is lower)."""
    lines = [
        "What each topology pays, per epsilon: the mean noise on h over the curve's points against the silos' at the "
        "same batch size, and the silos' violation at the curve's test errors (`matched_error_reduction` with the "
        "silos' curve as the reference: positive = the silos reach a lower violation at the same error; in brackets "
        "the curve's points matched inside the silos' error range).",
        "",
        "| epsilon | method | batch | noise on h | x silos | silos' violation at the same error |",
        "|---|---|---|---|---|---|",
    ]
    for (eps, method, topology, batch), points in curves.items():
        if topology == "silos":
            continue  # the reference
        silos = next((p for (e, _, t, b), p in curves.items() if (e, t, b) == (eps, "silos", batch)), [])
        base = [n for _, n in silos if n is not None]
        noise = [n for _, n in points if n is not None]
        mean = statistics.mean(noise) if noise else None
        ratio = f"{mean / statistics.mean(base):.1f}" if mean is not None and base else "-"
        reduction = matched_error_reduction([p for p, _ in silos], [p for p, _ in points])
        lines.append(
            f"| {fmt(eps)} | {method} | {batch} | {'-' if mean is None else f'{mean:.4f}'} | {ratio} | "
            f"{reduction.text('the silos') if silos else 'no silos runs'} |"
        )
    return [*lines, ""]


def _same_seed_text(records: Sequence[plots.RunRecord], metric: str) -> list[str]:
    """Per method with separate parties: how many of its runs give exactly the test error and violation of the silos'
    run with the same seed, epsilon, lambda and batch (the same mechanism and random streams give the same numbers)."""
    keys = ("seed", "epsilon", "lambda", "batch-size")
    silos = {tuple(fmt(r.get(k)) for k in keys): r for r in records if _topology(r) == "silos"}
    lines = []
    for method in dict.fromkeys(r.method for r in records if _topology(r) != "silos"):
        pairs = [
            (r, silos[key])
            for r in records
            if r.method == method and (key := tuple(fmt(r.get(k)) for k in keys)) in silos
        ]
        if not pairs:
            continue
        same = sum(r.final["error"] == s.final["error"] and r.final[metric] == s.final[metric] for r, s in pairs)
        gap = max(abs(r.final[metric] - s.final[metric]) for r, s in pairs)
        lines.append(
            f"- `{method}`: {same} of its {len(pairs)} runs give exactly the test error and violation of the silos' "
            f"run with the same seed, epsilon, lambda and batch (largest violation difference {gap:.4f})."
        )
    if lines:
        lines = ["Same seed, same numbers?", "", *lines, ""]
    return lines
