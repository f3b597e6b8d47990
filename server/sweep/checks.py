"""A sweep's data checked before any run starts: every run to do goes through `silofl run`'s checks.

`client.data.preflight.preflight` loads a run's data as its silos will and refuses what would fail (a missing file
or column, a split too small for the silos, one group for a fairness algorithm, ...) or warns about what is legal but
probably a mistake. `silofl sweep` runs it on every run it is about to start (and `--dry-run` on those it lists as to
do), so a bad run is refused before hours of others run: the error names the run by its method and grid values and
says the problem; a warning is printed once per distinct message, with how many runs it concerns.

Cost: the runs of one data spec (`protocols.messages.DataSpec`: dataset, seed, silos, partition, ...) share one load
(the silos' own cache, dropped after them): a sweep of 5 seeds on Adult loads it 5 times, whatever its other grids.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from silofl.server.sweep.grid import SweepRun
from silofl.server.sweep.spec import SweepError

#: Runs named in a warning's line before "and N more".
_NAMED = 2


def _by_data(runs: Sequence[SweepRun]) -> list[list[SweepRun]]:
    """The runs grouped by their data spec (first appearance order), so that each group loads its data once."""
    from silofl.protocols.messages import DataSpec

    groups: dict[DataSpec, list[SweepRun]] = {}
    for run in runs:
        groups.setdefault(DataSpec.from_run_config(run.config), []).append(run)
    return list(groups.values())


def check_runs(runs: Sequence[SweepRun], *, where: str, console: Any) -> dict[str, list[SweepRun]]:
    """Run each of `runs` through `silofl run`'s data checks; print each distinct warning once on `console`, naming
    how many runs (and which first) it concerns; return the warnings with their runs.

    Raises :class:`SweepError` for the first run the checks refuse, naming it (`where`: the sweep file) and the
    problem, before any run has started."""
    from silofl.client.data.preflight import forget_shared_data, preflight
    from silofl.protocols.config import ConfigError

    if not runs:
        return {}
    groups = _by_data(runs)
    _say(console, f"checking the data of {len(runs)} run(s) ({len(groups)} load(s))")
    t0 = time.perf_counter()
    warnings: dict[str, list[SweepRun]] = {}
    for group in groups:
        try:
            for run in group:
                try:
                    found = preflight(run.config, share_with_silos=True)  # the group's next runs reuse the load
                except ConfigError as exc:
                    raise SweepError(
                        f"{where}: run '{run.summary()}' (folder {run.folder.name}) fails the data checks, so no run "
                        f"was started: {exc}"
                    ) from None
                for message in found:
                    warnings.setdefault(message, []).append(run)
        finally:
            forget_shared_data()  # the runs load their own, in the workers
    for message, concerned in warnings.items():
        _say(console, f"silofl: warning: {message} ({_concerning(concerned, len(runs))})")
    _say(console, f"data checks passed in {time.perf_counter() - t0:.1f} s")
    return warnings


def _say(console: Any, text: str) -> None:
    """One line on the sweep's console, as written: a check's message may hold [brackets] that rich would read as
    markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _concerning(runs: Sequence[SweepRun], total: int) -> str:
    """'all 12 runs' or '3 of 12 runs: steffle lambda=0 seed=0, steffle lambda=2 seed=0 and 1 more'."""
    if len(runs) == total:
        return f"all {total} runs" if total > 1 else f"run {runs[0].summary()}"
    named = ", ".join(run.summary() for run in runs[:_NAMED])
    more = f" and {len(runs) - _NAMED} more" if len(runs) > _NAMED else ""
    return f"{len(runs)} of {total} runs: {named}{more}"
