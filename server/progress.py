"""A live progress bar for a run: round, loss, accuracy, epsilon spent, ETA (rich)."""

from __future__ import annotations

import math
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from protocols.config import RunConfig
from strategies.base import Federation, RoundRecord


class RunProgress:
    """Context manager; `start(rounds, federation)` then `update(record)` per round."""

    def __init__(self, config: RunConfig, *, enabled: bool = True, console: Console | None = None) -> None:
        self.config = config
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        self._last = {"loss": math.nan, "accuracy": math.nan}

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  acc {task.fields[acc]}  eps {task.fields[eps]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None):
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)

    def start(self, rounds: int, federation: Federation) -> None:
        if not self.enabled:
            return
        info = federation.info
        self.console.print(
            f"[bold]{self.config.algorithm}[/] on {info.dataset}: {len(federation.silos)} silos, "
            f"{federation.n_train} training records, {info.num_features} features, {info.num_labels} labels, "
            f"{info.num_groups} sensitive groups; {rounds} rounds"
        )
        if self._progress is not None:
            self._task = self._progress.add_task("round", total=rounds, loss="-", acc="-", eps="-")

    def update(self, record: RoundRecord) -> None:
        if self._progress is None or self._task is None:
            return
        fields = {}
        if record.evaluation is not None:
            fields["loss"] = f"{record.evaluation['loss']:.4f}"
            fields["acc"] = f"{record.evaluation['accuracy']:.4f}"
        if record.epsilon_spent is not None:
            fields["eps"] = "inf" if math.isinf(record.epsilon_spent) else f"{record.epsilon_spent:.3f}"
        self._progress.update(self._task, completed=record.server_round, **fields)
