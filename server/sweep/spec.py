"""The sweep file: its TOML schema, validated up front, and the run-config key names it accepts.

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
`[[methods]]` the sweep is one method named after `base.algorithm`. This module checks the file's shape (unknown
entries, empty lists, repeated or reserved keys, duplicate method names); :mod:`server.sweep.grid` expands it into
runs and validates each one.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from silofl.protocols.config import all_keys

Scalar = str | int | float | bool
#: Keys the sweep sets itself (each run's folder); a sweep file may not give them.
RESERVED_KEYS = frozenset({"out-dir"})
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


def canonical_values(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`values` with canonical keys; a reserved key or one given twice (`seed` and `seed`, `lam` and `lambda`) is an
    error naming `where`."""
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
        canonical_values(self.base, "[base]")
        for i, block in enumerate(self.grid_blocks):
            where = "[grid]" if isinstance(self.grid, dict) else f"[[grid]] block {i + 1}"
            for key, values in canonical_values(block, where).items():
                if not values:
                    raise ValueError(f"{where}: '{key}' is an empty list; give at least one value or drop the key")
        names = [m.name for m in self.methods]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"[[methods]]: names must be unique; repeated: {', '.join(dupes)}")
        for method in self.methods:
            where = f"method '{method.name}'"
            fixed = canonical_values(method.fixed, where)
            for block in method.grid_blocks:
                for key, values in canonical_values(block, f"{where} grid").items():
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
