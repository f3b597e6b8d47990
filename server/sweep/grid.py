"""A sweep file's runs: the grid expanded per method, every run validated, each given its folder; slices of the grid.

Every run is validated by :meth:`protocols.config.RunConfig.parse` before any run starts, so a typo fails the whole
sweep up front with the method and grid point named. Each run gets a deterministic folder under the sweep's out dir,
`<method>__<key>=<value>_...` over the keys its grid varies (the method's grid keys first, e.g.
`steffle__lambda=0.5_epsilon=1_seed=0`).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from silofl.protocols.config import ConfigError, RunConfig
from silofl.server.sweep.spec import (
    MethodSpec,
    SweepError,
    SweepSpec,
    canonical_key,
    canonical_values,
    known_keys,
    load_spec,
)

#: Config keys that do not change what a run computes: ignored when checking that a finished run is this run.
_LOCATION_KEYS = frozenset({"out-dir", "data-dir", "round-timeout"})


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its method, the values its grid chose, the validated config and its folder."""

    method: str
    varied: dict[str, Any]
    config: RunConfig
    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    def summary(self) -> str:
        """`method key=value ...` for progress lines and errors."""
        return " ".join([self.method, *(f"{k}={format_value(v)}" for k, v in self.varied.items())])


@dataclass
class Sweep:
    """A parsed and expanded sweep file: every run validated, folders assigned."""

    path: Path
    spec: SweepSpec
    out: Path
    runs: list[SweepRun] = field(default_factory=list)


def format_value(value: Any) -> str:
    """A value as it appears in folder names: 0.5, 1, inf, true, adult (characters outside [A-Za-z0-9.+-] -> '-')."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:g}"
    text = str(value).strip()
    if text.lower() in {"inf", "infinity"}:
        return "inf"
    return re.sub(r"[^A-Za-z0-9.+-]", "-", text) or "-"


def comparable_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` without the keys that say where a run reads and writes, not what it computes (out-dir, ...)."""
    return {k: v for k, v in config.items() if k not in _LOCATION_KEYS}


def _algorithm_keys(algorithm: Any) -> set[str] | None:
    """The run-config keys of `algorithm`, or None when it is not a registered algorithm (RunConfig.parse says so)."""
    from silofl.protocols import algorithms

    try:
        spec = algorithms.get(str(algorithm))
    except KeyError:
        return None
    return {info.alias or name for name, info in spec.config_model.model_fields.items()}


def expand(spec: SweepSpec, out: Path, *, where: str = "sweep", methods: Sequence[str] | None = None) -> list[SweepRun]:
    """Every run of `spec` (or of the named `methods` only), validated by RunConfig.parse, with its folder.

    Raises :class:`SweepError` naming the method and grid point of the first run that does not validate, or two
    different runs that would share a folder.
    """
    all_methods = spec.methods or [MethodSpec(name=_default_method_name(spec))]
    if methods:
        unknown = sorted(set(methods) - {m.name for m in all_methods})
        if unknown:
            known = ", ".join(m.name for m in all_methods)
            raise SweepError(f"{where}: no method named {', '.join(unknown)}; the sweep's methods: {known}")
        all_methods = [m for m in all_methods if m.name in methods]
    base = canonical_values(spec.base, "[base]")
    runs: dict[str, SweepRun] = {}
    for method in all_methods:
        fixed = canonical_values(method.fixed, f"method '{method.name}'")
        # keys of the shared tables that the method's algorithm does not have (lambda for fedavg) are not its
        own_keys = _algorithm_keys({**base, **fixed}.get("algorithm"))
        blocks = itertools.product(method.grid_blocks, spec.grid_blocks)
        for own_block, block in blocks:
            own_grid = canonical_values(own_block, f"method '{method.name}' grid")
            shared = {
                k: v
                for k, v in canonical_values(block, "[grid]").items()
                if k not in fixed and (own_keys is None or k in own_keys or k not in known_keys())
            }
            grid = {**own_grid, **{k: v for k, v in shared.items() if k not in own_grid}}  # own keys first
            keys = list(grid)
            for combo in itertools.product(*(grid[k] for k in keys)):
                varied = dict(zip(keys, combo, strict=True))
                values = {**base, **fixed, **varied}
                label = " ".join([f"method '{method.name}'", *(f"{k}={format_value(v)}" for k, v in varied.items())])
                folder = out / _folder_name(method.name, varied)
                try:
                    config = RunConfig.parse({**values, "out-dir": str(folder)}, other_algorithms="ignore")
                except ConfigError as exc:
                    raise SweepError(f"{where}: run {label}: {exc}") from None
                previous = runs.get(folder.name)
                if previous is not None:
                    if comparable_config(previous.config.to_json()) != comparable_config(config.to_json()):
                        raise SweepError(
                            f"{where}: runs '{previous.summary()}' and '{label}' would share the folder "
                            f"{folder.name} but differ; give the methods different names or grids"
                        )
                    continue  # the same run from two grid blocks: run it once
                runs[folder.name] = SweepRun(method.name, varied, config, folder)
    if not runs:
        raise SweepError(f"{where}: the sweep has no runs")
    return list(runs.values())


def _default_method_name(spec: SweepSpec) -> str:
    algorithm = spec.base.get("algorithm")
    return format_value(algorithm) if isinstance(algorithm, str) else "run"


def _folder_name(method: str, varied: Mapping[str, Any]) -> str:
    parts = [f"{k}={format_value(v)}" for k, v in varied.items()]
    return method + ("__" + "_".join(parts) if parts else "")


def load_sweep(path: str | Path, *, out: str | Path | None = None, methods: Sequence[str] | None = None) -> Sweep:
    """Parse `path`, choose the out dir (`out`, else the file's `out`, else runs/sweeps/<stem>), expand the runs."""
    path = Path(path)
    spec = load_spec(path)
    out_dir = Path(out) if out else Path(spec.out) if spec.out else Path("runs") / "sweeps" / path.stem
    return Sweep(path=path, spec=spec, out=out_dir, runs=expand(spec, out_dir, where=str(path), methods=methods))


def select(runs: Sequence[SweepRun], where: Mapping[str, str]) -> list[SweepRun]:
    """The runs in the slice `where` (`key=value` conditions) of the grid.

    A condition on a key that some method varies applies to those methods only: `--where lambda=1` keeps FedAvg
    (which has no lambda) and `--where epsilon=1` keeps the non-private runs. A key no method varies is compared with
    every run's config.
    """
    conditions = {canonical_key(k): v for k, v in where.items()}
    for key in conditions:
        if key not in known_keys():
            raise SweepError(f"--where: unknown key '{key}'; known keys: {', '.join(sorted(known_keys()))}")
    varied_anywhere = {k for run in runs for k in run.varied}
    out = []
    for run in runs:
        config = run.config.to_json()
        if all(matches(config.get(k), v) for k, v in conditions.items() if k in run.varied or k not in varied_anywhere):
            out.append(run)
    return out


def matches(value: Any, text: str) -> bool:
    """Whether a config value equals a command-line value (numbers compared as numbers: 0.50 = 0.5, inf = inf)."""
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return format_value(value) == format_value(text)
