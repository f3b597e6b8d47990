"""Running a sweep: skip the finished runs, run the others on a pool of processes, record failures, report.

A run is finished iff its folder's `result.json` says `status.completed` (for the same config): a rerun skips it, so
an interrupted sweep resumes where it stopped. Each run's folder holds `run.json` (method, varied values, config) and
the run's `result.json`. Runs go to a pool of `workers` processes (each with one torch thread); a failing run leaves
`error.txt` in its folder, the sweep goes on, and the report says which failed.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from silofl.protocols.config import RunConfig
from silofl.server.run_result import RESULT_FILE, SUMMARY_SKIP, RunResult, RunResultError
from silofl.server.sweep.checks import check_runs
from silofl.server.sweep.grid import Sweep, SweepRun, comparable_config
from silofl.server.sweep.progress import SweepProgress
from silofl.server.sweep.spec import SweepError

#: Files of a run folder, besides RESULT_FILE (the run's result.json, `server.run_result`).
RUN_FILE, ERROR_FILE = "run.json", "error.txt"


# -- state of a run folder --------------------------------------------------------------------------------------------


def run_state(run: SweepRun) -> str:
    """'finished' (result.json, completed, same config), 'stale' (a completed result of another config), 'todo'."""
    path = run.folder / RESULT_FILE
    if not path.is_file():
        return "todo"
    try:
        result = RunResult.load(path, skip=SUMMARY_SKIP)
    except RunResultError:  # a half-written or foreign file: the run is redone
        return "todo"
    if result.status is None or not result.status.completed:
        return "todo"
    stored, wanted = comparable_config(result.config), comparable_config(run.config.to_json())
    if any(stored[k] != wanted[k] for k in stored.keys() & wanted.keys()):
        return "stale"
    return "finished"


def _stale_message(runs: Sequence[SweepRun]) -> str:
    first = runs[0]
    stored = comparable_config(RunResult.load(first.folder, skip=SUMMARY_SKIP).config)
    wanted = comparable_config(first.config.to_json())
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
    """Run one job (in a worker) as `silofl run` runs it, its data checked and loaded once for its silos and its
    model artifact: write run.json, run it, and on failure write error.txt. Never raises."""
    folder = Path(config_json["out-dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(json.dumps({**meta, "config": config_json}, indent=2))
    error_path = folder / ERROR_FILE
    error_path.unlink(missing_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        from silofl.client.data.preflight import preflight
        from silofl.server.engines import run_job

        config = RunConfig.parse(config_json)
        # as `silofl run` does (the sweep printed the warnings): the silos and the model artifact take this load
        preflight(config, share_with_silos=True)
        result = run_job(config, progress=False)
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
    and a run that fails `silofl run`'s data checks (`server.sweep.checks`) stop the sweep before any run starts.
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    chosen = list(sweep.runs if runs is None else runs)
    states = {run.name: run_state(run) for run in chosen}
    stale = [run for run in chosen if states[run.name] == "stale"]
    if stale:
        raise SweepError(f"{sweep.path}: {_stale_message(stale)}")
    todo = [run for run in chosen if states[run.name] == "todo"]
    check_runs(todo, where=str(sweep.path), console=console)  # refuses a bad run before any starts
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
    with SweepProgress(len(todo), enabled=progress and bool(todo), console=console) as bar:
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
