"""`silofl sweep FILE.toml`: run a grid of jobs (methods x lambda x epsilon x seed x ...), resumably, on both cores.

A sweep file is TOML::

    description = "SteFFLe on Adult, demographic parity"   # optional
    out = "runs/sweeps/steffle_adult_dp"                   # optional; default runs/sweeps/<file stem>

    [base]                  # run-config values shared by every run (kebab-case keys, as in `flwr run --run-config`)
    dataset = "adult"
    epochs = 40

    [grid]                  # lists: every combination is a run (also `[[grid]]` blocks: the union of their grids)
    epsilon = [1, 3, 9]
    seed = [0, 1, 2]

    [[methods]]             # optional; a method is a name, fixed values and its own grid
    name = "steffle"
    algorithm = "steffle"
    [methods.grid]          # (or several `[[methods.grid]]` blocks: the union of their products)
    lambda = [0, 0.5, 1, 2]

    [[methods]]
    name = "fedavg"
    algorithm = "fedavg"
    epsilon = "inf"         # a key a method fixes is dropped from the shared grid for that method

Precedence, lowest first: `base`, the shared grid, the method's fixed values, the method's grid. A key of `base`, the
shared grid or a method's table that the method's algorithm does not have (`lambda` for FedAvg, `epsilon` for a
non-private algorithm) is not part of that method's runs; a key no algorithm has is an error. Without
`[[methods]]` the sweep is one method named after `base.algorithm`. Every run is validated by
:meth:`protocols.config.RunConfig.parse` before any run starts, so a typo fails the whole sweep up front with the
method and grid point named. Each run gets a deterministic folder under the sweep's out dir,
`<method>__<key>=<value>_...` over the keys its grid varies (the method's grid keys first, e.g.
`steffle__lambda=0.5_epsilon=1_seed=0`), holding `run.json` (method, varied values, config) and the run's
`result.json`. A run is finished iff its `result.json` says `status.completed` (for the same config): a rerun skips
it, so an interrupted sweep resumes where it stopped. Runs go to a pool of `--workers` processes (each with one torch
thread); a failing run leaves `error.txt` in its folder, the sweep goes on, and the exit code is non-zero at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import shutil
import signal
import sys
import threading
import time
import tomllib
import traceback
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocols.config import ConfigError, RunConfig, all_keys

Scalar = str | int | float | bool
#: Keys the sweep sets itself (each run's folder); a sweep file may not give them.
RESERVED_KEYS = frozenset({"out-dir"})
#: Files of a run folder.
RESULT_FILE, RUN_FILE, ERROR_FILE = "result.json", "run.json", "error.txt"
#: Config keys that do not change what a run computes: ignored when checking that a finished run is this run.
_LOCATION_KEYS = frozenset({"out-dir", "data-dir", "round-timeout"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]*$")


class SweepError(ValueError):
    """A sweep file that cannot be run; the message names the file, the entry and the fix."""


def canonical_key(key: str) -> str:
    """The kebab-case run-config key for `key` (`num_silos` and `num-silos` are the same key); unknown keys as is."""
    kebab = "lambda" if key in ("lam", "lambda") else key.replace("_", "-")
    return kebab if kebab in known_keys() else key


def known_keys() -> set[str]:
    """Every run-config key of every registered algorithm, kebab-case (`lambda`, `num-silos`, ...)."""
    return set(all_keys())


def _algorithm_keys(algorithm: Any) -> set[str] | None:
    """The run-config keys of `algorithm`, or None when it is not a registered algorithm (RunConfig.parse says so)."""
    from protocols import algorithms

    try:
        spec = algorithms.get(str(algorithm))
    except KeyError:
        return None
    return {info.alias or name for name, info in spec.config_model.model_fields.items()}


def _canonical(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        ckey = canonical_key(key)
        if ckey in RESERVED_KEYS:
            raise ValueError(f"{where}: key '{key}' is set by the sweep (one folder per run); use the sweep's 'out'")
        if ckey in out:
            raise ValueError(f"{where}: key '{key}' is given twice (as '{ckey}')")
        out[ckey] = value
    return out


class MethodSpec(BaseModel):
    """One `[[methods]]` entry: a name (folder prefix and plot label), fixed run-config values, its own grid."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(description="label of the method in folders and plots: letters, digits, '.', '+', '-'")
    grid: dict[str, list[Scalar]] | list[dict[str, list[Scalar]]] = Field(
        default_factory=dict, description="the method's own lists of values (`[[methods.grid]]`: several blocks)"
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"method name {value!r}: use letters, digits, '.', '+' and '-' only (it names folders)")
        return value

    @property
    def fixed(self) -> dict[str, Any]:
        """The method's fixed run-config values (every key of the entry but `name` and `grid`)."""
        return dict(self.model_extra or {})

    @property
    def grid_blocks(self) -> list[dict[str, list[Scalar]]]:
        return _blocks(self.grid)


def _blocks(grid: dict[str, list[Scalar]] | list[dict[str, list[Scalar]]]) -> list[dict[str, list[Scalar]]]:
    """Grid blocks: one table, several tables (`[[grid]]`: the union of their products), or one empty block."""
    if isinstance(grid, dict):
        return [grid]
    return list(grid) or [{}]


class SweepSpec(BaseModel):
    """A sweep file. See the module docstring for the format and precedence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    out: str = Field(default="", description="folder of the run folders; default runs/sweeps/<file stem>")
    base: dict[str, Scalar] = Field(default_factory=dict)
    grid: dict[str, list[Scalar]] | list[dict[str, list[Scalar]]] = Field(default_factory=dict)
    methods: list[MethodSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        _canonical(self.base, "[base]")
        for i, block in enumerate(self.grid_blocks):
            where = "[grid]" if isinstance(self.grid, dict) else f"[[grid]] block {i + 1}"
            for key, values in _canonical(block, where).items():
                if not values:
                    raise ValueError(f"{where}: '{key}' is an empty list; give at least one value or drop the key")
        names = [m.name for m in self.methods]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"[[methods]]: names must be unique; repeated: {', '.join(dupes)}")
        for method in self.methods:
            where = f"method '{method.name}'"
            fixed = _canonical(method.fixed, where)
            for block in method.grid_blocks:
                for key, values in _canonical(block, f"{where} grid").items():
                    if not values:
                        raise ValueError(f"{where} grid: '{key}' is an empty list; give at least one value")
                    if key in fixed:
                        raise ValueError(f"{where}: '{key}' is both fixed and in the method's grid; keep one")
            for key, value in fixed.items():
                if isinstance(value, list | dict):
                    raise ValueError(f"{where}: '{key}' = {value!r} is not a single value; put lists in [methods.grid]")
        return self

    @property
    def grid_blocks(self) -> list[dict[str, list[Scalar]]]:
        return _blocks(self.grid)


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


def load_spec(path: Path) -> SweepSpec:
    """Read and validate a sweep file; a :class:`SweepError` names the file and the bad entry."""
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path}: not valid TOML: {exc}") from None
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{path}: invalid sweep file:"]
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = (
                    f"unknown entry '{loc}'; a sweep file has description, out, [base], [grid] or [[grid]], "
                    "and [[methods]]"
                )
                lines.append(f"  - {msg}")
            else:
                lines.append(f"  - {loc + ': ' if loc else ''}{msg}")
        raise SweepError("\n".join(lines)) from None


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
    base = _canonical(spec.base, "[base]")
    runs: dict[str, SweepRun] = {}
    for method in all_methods:
        fixed = _canonical(method.fixed, f"method '{method.name}'")
        # keys of the shared tables that the method's algorithm does not have (lambda for fedavg) are not its
        own_keys = _algorithm_keys({**base, **fixed}.get("algorithm"))
        blocks = itertools.product(method.grid_blocks, spec.grid_blocks)
        for own_block, block in blocks:
            own_grid = _canonical(own_block, f"method '{method.name}' grid")
            shared = {
                k: v
                for k, v in _canonical(block, "[grid]").items()
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
                    if _comparable(previous.config.to_json()) != _comparable(config.to_json()):
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


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _LOCATION_KEYS}


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


# -- state of a run folder --------------------------------------------------------------------------------------------


def run_state(run: SweepRun) -> str:
    """'finished' (result.json, completed, same config), 'stale' (a completed result of another config), 'todo'."""
    path = run.folder / RESULT_FILE
    if not path.is_file():
        return "todo"
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return "todo"
    if not (result.get("status") or {}).get("completed"):
        return "todo"
    stored, wanted = _comparable(result.get("config") or {}), _comparable(run.config.to_json())
    if any(stored[k] != wanted[k] for k in stored.keys() & wanted.keys()):
        return "stale"
    return "finished"


def _stale_message(runs: Sequence[SweepRun]) -> str:
    first = runs[0]
    stored = _comparable(json.loads((first.folder / RESULT_FILE).read_text())["config"])
    wanted = _comparable(first.config.to_json())
    diffs = ", ".join(
        f"{k}: {stored[k]!r} there, {wanted[k]!r} now" for k in stored.keys() & wanted.keys() if stored[k] != wanted[k]
    )
    return (
        f"{len(runs)} run folder(s) hold a completed result of a different configuration, e.g. {first.folder} "
        f"({diffs}). The sweep file changed since they ran: delete those folders to recompute them, or give the "
        "sweep another out dir (--out)"
    )


# -- running ----------------------------------------------------------------------------------------------------------


def _init_worker() -> None:
    """Each worker computes on one thread: the sweep's parallelism is across runs, not inside one."""
    import torch

    torch.set_num_threads(1)


def execute_run(config_json: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Run one job (in a worker): write run.json, run it, and on failure write error.txt. Never raises."""
    folder = Path(config_json["out-dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(json.dumps({**meta, "config": config_json}, indent=2))
    error_path = folder / ERROR_FILE
    error_path.unlink(missing_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        from server.engines import run_job

        result = run_job(RunConfig.parse(config_json), progress=False)
    except Exception as exc:  # a failing run is recorded and the sweep goes on
        text = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        error_path.write_text(text)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
    # CPU seconds next to wall seconds: on a shared machine the wall time says more about the neighbours
    cpu, seconds = time.process_time() - cpu0, time.perf_counter() - t0
    (folder / RUN_FILE).write_text(
        json.dumps({**meta, "config": config_json, "seconds": seconds, "cpu_seconds": cpu}, indent=2)
    )
    return {"ok": True, "final": result.get("final", {}), "seconds": seconds, "cpu_seconds": cpu}


@dataclass
class SweepReport:
    """What a sweep invocation did."""

    total: int
    skipped: int
    completed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


def run_sweep(
    sweep: Sweep,
    *,
    workers: int = 2,
    runs: Sequence[SweepRun] | None = None,
    progress: bool = True,
    console: Any = None,
) -> SweepReport:
    """Run the unfinished runs of `sweep` (or of `runs`, a subset) on `workers` processes; skip finished ones.

    `workers = 1` runs in this process (with one torch thread). Stale folders (a completed result of another config)
    stop the sweep before any run starts.
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    chosen = list(sweep.runs if runs is None else runs)
    states = {run.name: run_state(run) for run in chosen}
    stale = [run for run in chosen if states[run.name] == "stale"]
    if stale:
        raise SweepError(f"{sweep.path}: {_stale_message(stale)}")
    todo = [run for run in chosen if states[run.name] == "todo"]
    report = SweepReport(total=len(chosen), skipped=len(chosen) - len(todo))
    sweep.out.mkdir(parents=True, exist_ok=True)
    spec_copy = sweep.out / "sweep.toml"
    if sweep.path.resolve() != spec_copy.resolve():
        shutil.copyfile(sweep.path, spec_copy)
    console.print(
        f"sweep {sweep.path}: {len(chosen)} runs, {report.skipped} finished already, {len(todo)} to run on "
        f"{max(1, workers)} worker(s); run folders in {sweep.out}",
        soft_wrap=True,
    )
    t0 = time.perf_counter()
    with _SweepProgress(len(todo), enabled=progress and bool(todo), console=console) as bar:
        for run, outcome in _execute_all(todo, workers):
            if outcome["ok"]:
                report.completed.append(run.name)
            else:
                report.failed[run.name] = outcome["error"]
            bar.advance(run, outcome)
    report.seconds = time.perf_counter() - t0
    done = f"{len(report.completed)} completed, {report.skipped} skipped, {len(report.failed)} failed"
    console.print(f"sweep {sweep.path}: {done} in {report.seconds:.0f} s", soft_wrap=True)
    for name, error in report.failed.items():
        console.print(
            f"  [red]failed[/] {name}: {error.splitlines()[0]} (see {sweep.out / name / ERROR_FILE})", soft_wrap=True
        )
    return report


def _meta(run: SweepRun) -> dict[str, Any]:
    return {"method": run.method, "varied": run.varied}


def _execute_all(todo: Sequence[SweepRun], workers: int) -> Iterator[tuple[SweepRun, dict[str, Any]]]:
    """Yield (run, outcome) as runs finish: in this process for one worker, else on a spawn-started process pool."""
    if not todo:
        return
    if workers <= 1:
        _init_worker()
        for run in todo:
            yield run, execute_run(run.config.to_json(), _meta(run))
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, wait

    # spawn: the parent has a progress thread (and maybe torch) that a fork would copy mid-state
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker)
    try:
        pending: dict[Future, SweepRun] = {
            pool.submit(execute_run, run.config.to_json(), _meta(run)): run for run in todo
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                run = pending.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool as exc:  # a worker died (e.g. out of memory): record it, keep the folder
                    outcome = {"ok": False, "error": f"worker process died: {exc}", "seconds": 0.0}
                    run.folder.mkdir(parents=True, exist_ok=True)
                    (run.folder / ERROR_FILE).write_text(outcome["error"] + "\n")
                yield run, outcome
    except BaseException:  # Ctrl-C (or the caller stopped): stop the running runs too, not only the queued ones
        _terminate_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool's worker processes now. A worker that catches Ctrl-C reports it and takes the next queued run, and
    `shutdown(cancel_futures=True)` cannot cancel the runs already handed to the workers; so terminate them (an
    interrupted run leaves no completed result.json and runs again on the next sweep)."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


class _SweepProgress:
    """Overall progress of a sweep (rich): runs done of runs to do, failures, elapsed time and ETA."""

    def __init__(self, total: int, *, enabled: bool, console: Any) -> None:
        self.total, self.enabled, self.console = total, enabled, console
        self.done = self.failed = 0
        self._progress = None
        self._task = None

    def __enter__(self) -> _SweepProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("sweep", total=self.total, failed=0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def advance(self, run: SweepRun, outcome: Mapping[str, Any]) -> None:
        self.done += 1
        if outcome["ok"]:
            final = outcome.get("final") or {}
            metrics = ", ".join(
                f"{label} {final[key]:.4f}"
                for key, label in (("error", "error"), ("dp_violation", "dp"), ("eo_violation", "eo"))
                if isinstance(final.get(key), int | float)
            )
            cpu = f", {outcome['cpu_seconds']:.0f} s CPU" if "cpu_seconds" in outcome else ""
            line = f"[{self.done}/{self.total}] {run.name}: {metrics} ({outcome['seconds']:.0f} s{cpu})"
        else:
            self.failed += 1
            line = f"[{self.done}/{self.total}] [red]FAILED[/] {run.name}: {outcome['error'].splitlines()[0]}"
        self.console.print(line, highlight=False, soft_wrap=True)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, failed=self.failed)


# -- command line -----------------------------------------------------------------------------------------------------


def add_sweep_parser(subparsers: Any) -> None:
    """`silofl sweep FILE.toml [--workers N] [--out DIR] [--methods A,B] [--where KEY=VALUE] [--dry-run]`."""
    import argparse

    p = subparsers.add_parser(
        "sweep",
        help="run a grid of jobs from a TOML file (resumable, parallel)",
        description="Run every configuration of a sweep file, one folder per run; finished runs are skipped.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("file", help="sweep file (TOML: [base], [grid], [[methods]]; see benchmarks/sweeps/)")
    p.add_argument("--workers", type=int, default=2, help="runs in parallel (processes, one torch thread each)")
    p.add_argument(
        "--out", default="", help="folder of the run folders (default: the file's 'out', else runs/sweeps/<stem>)"
    )
    p.add_argument("--methods", default="", help="comma-separated method names: run only these")
    p.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE", help="run only runs with this config value"
    )
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs and their state; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (one line per run still)")
    p.set_defaults(func=sweep_command)


def parse_where(items: Sequence[str], flag: str = "--where") -> dict[str, str]:
    """`["lambda=1", "seed=0"]` -> {"lambda": "1", "seed": "0"}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} lambda=1")
        out[key.strip()] = value.strip()
    return out


@contextlib.contextmanager
def _termination_as_interrupt() -> Iterator[None]:
    """`kill PID` (SIGTERM) stops a sweep as Ctrl-C does: the interrupt path terminates the worker processes. With
    Python's default SIGTERM the parent dies at once and its pool's workers outlive it, finishing their runs into
    folders that the next sweep of the same file also writes."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sweep_command(args: Any) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    try:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] or None
        sweep = load_sweep(args.file, out=args.out or None, methods=methods)
        chosen = select(sweep.runs, parse_where(args.where)) if args.where else sweep.runs
        if not chosen:
            raise SweepError(f"{args.file}: no run matches --where {' '.join(args.where)}")
        if args.dry_run:
            for run in chosen:
                print(f"{run_state(run):8s} {run.folder}")
            print(f"{len(chosen)} runs, all valid; out dir {sweep.out}")
            return 0
        if args.workers < 1:
            raise SweepError(f"--workers {args.workers}: give at least 1")
        with _termination_as_interrupt():
            report = run_sweep(sweep, workers=args.workers, runs=chosen, progress=not args.no_progress, console=console)
    except SweepError as exc:
        print(f"silofl sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"silofl sweep: interrupted; finished runs are kept, run the same command again to resume ({args.file})",
            file=sys.stderr,
        )
        return 130
    return 0 if report.ok else 1
