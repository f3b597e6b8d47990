"""`silofl sweep FILE.toml`: run a grid of jobs (methods x lambda x epsilon x seed x ...), resumably, on both cores.

One module per job:

- :mod:`server.sweep.spec`: the sweep file's TOML schema and its validation (the format is in its docstring);
- :mod:`server.sweep.grid`: the file's runs, each validated by `RunConfig.parse` and given its folder; slices;
- :mod:`server.sweep.checks`: every run to do through `silofl run`'s data checks before any starts;
- :mod:`server.sweep.runner`: which runs are finished, running the others on a process pool, recording failures;
- :mod:`server.sweep.progress`: the live display of a running sweep;
- :mod:`server.sweep.cli`: the `silofl sweep` command.

The names callers use are importable from `server.sweep` itself.
"""

from silofl.server.sweep.cli import add_sweep_parser, parse_where, sweep_command
from silofl.server.sweep.grid import Sweep, SweepRun, expand, format_value, load_sweep, matches, select
from silofl.server.sweep.runner import ERROR_FILE, RESULT_FILE, RUN_FILE, SweepReport, execute_run, run_state, run_sweep
from silofl.server.sweep.spec import (
    RESERVED_KEYS,
    MethodSpec,
    Scalar,
    SweepError,
    SweepSpec,
    canonical_key,
    known_keys,
    load_spec,
)

__all__ = [
    "ERROR_FILE",
    "RESERVED_KEYS",
    "RESULT_FILE",
    "RUN_FILE",
    "MethodSpec",
    "Scalar",
    "Sweep",
    "SweepError",
    "SweepReport",
    "SweepRun",
    "SweepSpec",
    "add_sweep_parser",
    "canonical_key",
    "execute_run",
    "expand",
    "format_value",
    "known_keys",
    "load_spec",
    "load_sweep",
    "matches",
    "parse_where",
    "run_state",
    "run_sweep",
    "select",
    "sweep_command",
]
