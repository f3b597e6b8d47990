"""The run records that figures and the benchmarks' tables are made of: `load_runs` reads every `result.json` under
run folders (as `RunResult`s, `server.run_result`) into `RunRecord`s (config as this version writes it, the sweep's
method name, the whole result), `filter_runs` slices them as `silofl sweep --where` does, `varied_keys` says what each
method varies, and `mean_sd` averages over seeds."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from silofl.server.run_result import RESULT_FILE, SUMMARY_SKIP, RunResult, RunResultError, as_float

#: Config keys that never distinguish runs (where they ran, how long the server waits).
_IGNORED_KEYS = frozenset({"out-dir", "data-dir", "round-timeout"})


class PlotError(ValueError):
    """Nothing to plot, or a bad option; the message says what was found and what is needed."""


@dataclass(frozen=True)
class RunRecord:
    """One completed run, as read from its folder."""

    folder: Path
    method: str
    config: dict[str, Any]
    final: dict[str, Any]
    #: result.json's per-round entries (read with `load_runs(..., with_rounds=True)`, for `silofl plot run`).
    rounds: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)
    #: False for a run that stopped before its last round (kept by `load_runs(..., keep_incomplete=True)`).
    completed: bool = True
    #: The run's result.json, typed, without the model arrays and (unless read `with_rounds`) the per-round entries:
    #: the bulk of a long run's file (None for a record not read from a run folder, e.g. a cached table cell).
    result: RunResult | None = field(default=None, repr=False, compare=False)

    def get(self, key: str) -> Any:
        return self.config.get(key)

    @property
    def epsilon(self) -> float:
        return as_float(self.config.get("epsilon", math.inf))

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon) or as_float(self.config.get("rho", 0.0)) > 0


def _spec(config: Mapping[str, Any]):
    """The registry entry of a run's algorithm, or None (an algorithm this process does not know)."""
    from silofl.protocols import algorithms

    try:
        return algorithms.get(str(config.get("algorithm", "")))
    except KeyError:
        return None


def default_method(config: Mapping[str, Any]) -> str:
    """A plot label for a run without a sweep's method name: its algorithm entry's label (the papers' names for
    SteFFLe: DP-FERMI / FERMI with one silo), else the algorithm's name."""
    spec = _spec(config)
    return spec.display_label(config) if spec is not None else str(config.get("algorithm", "?"))


def in_plot(run: RunRecord, kind: str) -> bool:
    """Whether `run`'s algorithm appears in figures of `kind` (its registry entry's `plots`)."""
    spec = _spec(run.config)
    return spec is not None and kind in spec.plots


def config_defaults(algorithm: str) -> dict[str, Any]:
    """Every run-config key of `algorithm` (kebab-case, as in result.json) with its default, in result.json's form.

    A run folder written before a key existed ran with that key's default (new keys are added with the old behaviour
    as default), so filling it in keeps old and new run folders of the same configuration on one curve."""
    from pydantic_core import PydanticUndefined

    spec = _spec({"algorithm": algorithm})
    if spec is None:
        return {}
    out: dict[str, Any] = {"algorithm": spec.name}  # (required, so without a default)
    for name, info in spec.config_model.model_fields.items():
        if info.default is PydanticUndefined:
            continue
        value = info.default
        out[info.alias or name] = "inf" if isinstance(value, float) and math.isinf(value) else value
    return out


#: Keys added after runs were recorded whose default is not what those earlier runs did: for a stored config without
#: the key, the value that describes them. `stale-shares` (2026-11-27): FedSC before the option kept the stale cache.
EARLIER_BEHAVIOUR: dict[str, Any] = {"stale-shares": "keep"}


def normalized_config(stored: Mapping[str, Any], defaults: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A result.json `config` as this version writes it: the algorithm's keys only (older versions stored every key
    of every algorithm), with the defaults of keys added since, or, for a key in :data:`EARLIER_BEHAVIOUR`, what runs
    made before it existed did. `defaults` caches `config_defaults` per algorithm."""
    algorithm = str(stored.get("algorithm", ""))
    cache = defaults if defaults is not None else {}
    if algorithm not in cache:
        cache[algorithm] = config_defaults(algorithm)
    own = cache[algorithm]
    if not own:  # an algorithm this process does not know: as stored
        return dict(stored)
    earlier = {k: v for k, v in EARLIER_BEHAVIOUR.items() if k in own and k not in stored}
    return {**own, **earlier, **{k: v for k, v in stored.items() if k in own}}


def load_runs(
    paths: Iterable[str | Path], *, with_rounds: bool = False, keep_incomplete: bool = False
) -> tuple[list[RunRecord], int]:
    """The completed runs under `paths` (run folders or folders of run folders) and the number of incomplete ones;
    `with_rounds` also keeps each run's per-round entries in `rounds`, `keep_incomplete` keeps (and counts)
    incomplete runs. A file that is not a silofl result stops it with a PlotError naming the file and the field."""
    records, incomplete, seen = [], 0, set()
    defaults: dict[str, dict[str, Any]] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise PlotError(f"{root} does not exist")
        files = [root] if root.is_file() else ([root / RESULT_FILE] if (root / RESULT_FILE).is_file() else [])
        files = files or sorted(root.rglob(RESULT_FILE))
        for path in files:
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                result = RunResult.load(path, skip=("model",) if with_rounds else SUMMARY_SKIP)
            except RunResultError as exc:
                raise PlotError(str(exc)) from None
            if not result.completed:
                incomplete += 1
                if not keep_incomplete:
                    continue
            records.append(run_record(path.parent, result, defaults, with_rounds=with_rounds))
    return records, incomplete


def run_record(
    folder: Path, result: RunResult, defaults: dict[str, dict[str, Any]] | None = None, *, with_rounds: bool = False
) -> RunRecord:
    """The record of the run in `folder` whose result is `result`: its config normalized (`normalized_config`), its
    method the sweep's name for it (`run.json`) or else its algorithm's label (`default_method`)."""
    config = normalized_config(result.config, defaults)
    method = None
    meta_path = folder / "run.json"
    if meta_path.is_file():
        try:
            method = json.loads(meta_path.read_text()).get("method")
        except (OSError, json.JSONDecodeError, AttributeError):
            method = None
    rounds = tuple(r.to_json() for r in result.rounds or ()) if with_rounds else ()
    return RunRecord(
        folder, str(method or default_method(config)), config, result.final.to_json(), rounds, result.completed, result
    )


def varied_keys(runs: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Per method, the config keys whose value differs between its runs (in the config's key order)."""
    by_method: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_method[run.method].append(run)
    out = {}
    for method, group in by_method.items():
        keys = list(dict.fromkeys(k for run in group for k in run.config))
        out[method] = [
            k for k in keys if k not in _IGNORED_KEYS and len({json.dumps(r.config.get(k)) for r in group}) > 1
        ]
    return out


def filter_runs(runs: Sequence[RunRecord], where: Mapping[str, str]) -> list[RunRecord]:
    """The runs in the slice `where` (`key=value`), as `silofl sweep --where`: a condition on a key some method varies
    applies to those methods only (FedAvg, which has no lambda, stays with `lambda=1`); a key no method varies is
    compared with every run's config."""
    from silofl.server.sweep import matches

    varied = varied_keys(runs)
    varied_anywhere = {k for keys in varied.values() for k in keys}
    return [
        run
        for run in runs
        if all(
            matches(run.config.get(k), v)
            for k, v in where.items()
            if k in varied[run.method] or k not in varied_anywhere
        )
    ]


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def has(run: RunRecord, metric: str) -> bool:
    """Whether `run` recorded `metric` as a finite number in its final results."""
    value = run.final.get(metric)
    return isinstance(value, int | float) and math.isfinite(value)
