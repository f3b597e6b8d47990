"""The result of a run (`result.json`): config, federation, per-round metrics, final metrics, privacy report, timing.

Built from what the server learned (the strategy's history and the silos' public reports) as a typed `RunResult`
(`server.run_result`: what readers load back); the privacy block reports the epsilon the silos' own ledgers computed,
and what the algorithm's registry entry adds (its mechanism, what it does not cover, and its own report: for SteFFLe
the papers' closed-form noise next to the noise used). `write_result` validates what it writes as a `RunResult`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from silofl.protocols.algorithms.base import EXACT_EVALUATION, resolve
from silofl.protocols.config import RunConfig
from silofl.server.run_result import (
    RESULT_FILE,
    FairnessGroups,
    FederationInfo,
    FinalMetrics,
    PrivacyReport,
    RoundEntry,
    RunResult,
    SiloEntry,
    Timing,
)
from silofl.strategies.federation import Federation, RunHistory


def build_run_result(
    config: RunConfig,
    federation: Federation,
    history: RunHistory,
    *,
    rounds: int,
    delta: float,
    engine: str,
    total_seconds: float,
    round_seconds: float,
) -> RunResult:
    """The run's result, typed (the caller adds its `status`: how the run ended)."""
    final = history.last_evaluation or {}
    per_silo: dict[str, dict[str, Any]] = {}
    for silo_id, report in sorted(history.silo_reports.items()):
        per_silo[str(silo_id)] = {
            "epsilon_spent": _num(report.epsilon_spent),
            "noise_multiplier": report.noise_multiplier,
            "sampling_rate": report.sampling_rate,
            "n_train": report.num_examples,
            "rounds_answered": report.server_round,
        }
    spent = max((r.epsilon_spent for r in history.silo_reports.values()), default=math.inf)
    spec = config.spec
    privacy_extra: dict[str, Any] = {}
    if spec.privacy_report:
        privacy_extra = resolve(spec.privacy_report)(config, history, rounds, delta)
        spent = privacy_extra.pop("epsilon_spent", spent)
        for silo_id, entries in privacy_extra.pop("per_silo", {}).items():  # e.g. each silo's shuffled epochs
            per_silo.setdefault(silo_id, {}).update(entries)
    return RunResult(
        config=config.to_json(),
        engine=engine,
        federation=_federation(config, federation, rounds),
        rounds=[RoundEntry.model_validate(r.to_json()) for r in history.rounds],
        final=FinalMetrics(
            accuracy=final.get("accuracy"),
            error=final.get("error"),
            loss=final.get("loss"),
            dp_violation=final.get("dp_violation"),
            eo_violation=final.get("eo_violation"),
            eopp_violation=final.get("eopp_violation"),
            **{k: final[k] for k in ("knn_accuracy", "probe_train_accuracy") if k in final},
        ),
        privacy=PrivacyReport.model_validate(
            {
                "epsilon_target": _num(config.target_epsilon),
                "epsilon_spent": _num(spent),
                "delta": delta,
                "per_silo": per_silo,
                "accountant": config.target_accountant if config.private else "none (no noise: epsilon = inf)",
                "mechanism": spec.describe_mechanism(config),
                "not_covered": _not_covered(spec.not_covered, history),
                **_evaluation_privacy(history),
                **privacy_extra,
            }
        ),
        timing=Timing(total_seconds=total_seconds, seconds_per_round=round_seconds / max(rounds, 1)),
        model=(
            "in model.npz next to this file (too large for JSON)"
            if spec.model_output == "npz"
            else {name: arr.numpy().tolist() for name, arr in history.arrays.items()}
        ),
        server_state=history.server_state,
        **_fairness_groups(history, federation, getattr(config, "min_support", None)),
    )


def build_result(config: RunConfig, federation: Federation, history: RunHistory, **run: Any) -> dict[str, Any]:
    """The `result.json` document as a dict: `build_run_result`'s JSON form, from the same arguments (`run`: its
    keyword-only ones). The orchestrator adds the run's `status` to it and returns it to its caller; `write_result`
    validates it again as a `RunResult`."""
    return build_run_result(config, federation, history, **run).to_json()


def _federation(config: RunConfig, federation: Federation, rounds: int) -> FederationInfo:
    """`federation`: the silos, the sensitive parties of a topology that has them, the data's shape, the rounds."""
    parties: dict[str, Any] = {}
    if federation.sensitive:
        parties = {
            "topology": config.topology_name,
            "sensitive_parties": [
                SiloEntry(party_id=e.info.silo_id, node_id=e.node_id, n_train=e.info.n_train, n_test=e.info.n_test)
                for e in federation.sensitive
            ],
        }
    return FederationInfo(
        silos=[
            SiloEntry(silo_id=e.info.silo_id, node_id=e.node_id, n_train=e.info.n_train, n_test=e.info.n_test)
            for e in federation.silos
        ],
        **parties,
        num_features=federation.info.num_features,
        num_labels=federation.info.num_labels,
        num_groups=federation.info.num_groups,
        label_names=list(federation.info.label_names),
        group_names=list(federation.info.group_names),
        rounds=rounds,
    )


def _fairness_groups(history: RunHistory, federation: Federation, min_support: int | None) -> dict[str, Any]:
    """`fairness_groups`: each sensitive group's test support and rates at the last evaluation, and the violations
    over all groups and over the groups with at least `min_support` test records (the run's `min-support`; default
    `MIN_SUPPORT`; `group_report`); absent when the last evaluation kept no counts (a central evaluation, or a run
    stopped before one)."""
    from silofl.protocols.fairness_metrics import MIN_SUPPORT, group_report

    counts = history.last_evaluation_counts
    if counts is None:
        return {}
    report = group_report(
        counts,
        min_support=MIN_SUPPORT if min_support is None else min_support,
        group_names=list(federation.info.group_names) or None,
    )
    return {"fairness_groups": FairnessGroups(label_names=list(federation.info.label_names), **report)}


def _num(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def write_result(result: RunResult | Mapping[str, Any], out_dir: Path) -> Path:
    """Write `out_dir`/result.json (atomically) from a `RunResult` or its JSON form, which is validated as one first:
    every result.json silofl writes is a `RunResult`. Returns its path."""
    return RunResult.from_json(result, out_dir / RESULT_FILE).write(out_dir)


def _evaluation_noise(history: RunHistory) -> list[dict[int, float] | None]:
    return [r.evaluation_noise for r in history.rounds if r.evaluation is not None]


def _all_noised(history: RunHistory) -> bool:
    """Whether every evaluation of the run was answered noised by every silo (unknown counts as exact)."""
    noise = _evaluation_noise(history)
    return bool(noise) and all(n is not None and all(v > 0 for v in n.values()) for n in noise)


def _not_covered(text: str, history: RunHistory) -> str:
    """The algorithm's `not_covered`, without the exact evaluation when every silo answered every evaluation noised
    (its policy's `evaluation = "noised"`: a Gaussian histogram charged to its lifetime ledger)."""
    if not _all_noised(history) or EXACT_EVALUATION not in text:
        return text
    rest = "; ".join(part for part in (p.strip() for p in text.replace(EXACT_EVALUATION, "").split(";")) if part)
    return rest or "nothing beyond the mechanism's own caveats"


def _evaluation_privacy(history: RunHistory) -> dict[str, Any]:
    """How each silo answered the last evaluation: the noise std on its counts, or "exact" (only in a run where some
    silo answered noised: a run without policies reports what it always did)."""
    noise = [n for n in _evaluation_noise(history) if n is not None]
    if not any(v > 0 for n in noise for v in n.values()):
        return {}
    return {"evaluation": {str(k): (v if v > 0 else "exact") for k, v in sorted(noise[-1].items())}}
