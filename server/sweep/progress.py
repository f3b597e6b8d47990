"""The live display of a running sweep: one line per finished run (its metrics or error) under a rich progress bar."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from silofl.server.sweep.grid import SweepRun


class SweepProgress:
    """Overall progress of a sweep (rich): runs done of runs to do, failures, elapsed time and ETA."""

    def __init__(self, total: int, *, enabled: bool, console: Any) -> None:
        self.total, self.enabled, self.console = total, enabled, console
        self.done = self.failed = 0
        self._progress = None
        self._task = None

    def __enter__(self) -> SweepProgress:
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
