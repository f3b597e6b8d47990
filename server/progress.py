"""A live progress bar for a run: round, the algorithm's evaluation metrics, epsilon spent, ETA (rich).

Which metrics are shown is the algorithm's choice (`progress_metrics` of its registry entry: loss and accuracy for the
supervised algorithms, the kNN monitor and the linear probe for FedSC); a metric an evaluation does not hold shows
"-" (FedSC's probe runs only after the last round)."""

from __future__ import annotations

import math
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from silofl.protocols.config import RunConfig
from silofl.strategies.federation import Federation, RoundRecord


class RunProgress:
    """Context manager; `start(rounds, federation)` then `update(record)` per round."""

    def __init__(self, config: RunConfig, *, enabled: bool = True, console: Console | None = None) -> None:
        self.config = config
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        self._metrics = dict(config.spec.progress_metrics)  # label -> evaluation key
        self._fields = {f"m{i}": label for i, label in enumerate(self._metrics)}

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "  ".join(f"{label} {{task.fields[{field}]}}" for field, label in self._fields.items())
                    + "  eps {task.fields[eps]}"
                ),
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
        nodes = f"{len(federation.silos)} silos"
        if federation.sensitive:
            nodes = f"{len(federation.silos)} feature and {len(federation.sensitive)} sensitive parties"
        self.console.print(
            f"[bold]{self.config.algorithm}[/] on {info.dataset}: {nodes}, "
            f"{federation.n_train} training records, {info.num_features} features, {info.num_labels} labels, "
            f"{info.num_groups} sensitive groups; {rounds} rounds"
        )
        if self._progress is not None:
            blank = dict.fromkeys(self._fields, "-")
            self._task = self._progress.add_task("round", total=rounds, eps="-", **blank)

    def update(self, record: RoundRecord) -> None:
        if self._progress is None or self._task is None:
            return
        fields = {}
        if record.evaluation is not None:
            for field, label in self._fields.items():
                value = record.evaluation.get(self._metrics[label])
                if isinstance(value, int | float) and math.isfinite(value):
                    fields[field] = f"{value:.4f}"
        if record.epsilon_spent is not None:
            fields["eps"] = "inf" if math.isinf(record.epsilon_spent) else f"{record.epsilon_spent:.3f}"
        self._progress.update(self._task, completed=record.server_round, **fields)
