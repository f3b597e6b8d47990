"""The algorithm registry: every algorithm silofl runs, one :class:`~protocols.algorithms.base.Algorithm` entry each.

The built-in entries are the modules of this package, one per algorithm (`protocols/algorithms/steffle.py`, ...);
each says where the algorithm's server and silo code are. Another package adds an algorithm by calling
:func:`register` when it is imported, and makes silofl import it by either

* naming the module in the environment variable ``SILOFL_ALGORITHMS`` (comma-separated; read by every process that
  looks an algorithm up, so Ray workers and deployed ClientApps started with that environment find it too), or
* a ``silofl.algorithms`` entry point of an installed package (the entry point's module is imported).

Nothing else in silofl has to change (tests/protocols/test_plugin_algorithm.py registers a toy algorithm that way).
"""

from __future__ import annotations

import difflib
import importlib
import os
from importlib.metadata import entry_points

from silofl.protocols.algorithms.base import Algorithm

__all__ = ["Algorithm", "get", "names", "register", "specs"]

PLUGINS_ENV = "SILOFL_ALGORITHMS"
ENTRY_POINT_GROUP = "silofl.algorithms"
_BUILTIN = ("fedavg", "dp_fedsgd", "steffle", "tran", "mu2fl", "noisy_sgd", "fedsc", "fedavg_sc", "fedfdp")

_registry: dict[str, Algorithm] = {}
_aliases: dict[str, str] = {}
_loaded_plugins: set[str] = set()
_builtins_loaded = False
_entry_points_loaded = False


def register(spec: Algorithm, *, replace: bool = False) -> Algorithm:
    """Add `spec` to the registry (under its name and aliases) and return it."""
    taken = [n for n in (spec.name, *spec.aliases) if n in _aliases and _aliases[n] != spec.name]
    if taken:
        raise ValueError(f"algorithm {spec.name!r}: the name(s) {taken} belong to {_aliases[taken[0]]!r}")
    if spec.name in _registry and not replace:
        raise ValueError(f"algorithm {spec.name!r} is registered already (register(..., replace=True) to redefine)")
    _registry[spec.name] = spec
    for name in (spec.name, *spec.aliases):
        _aliases[name] = spec.name
    return spec


def unregister(name: str) -> None:
    """Remove an algorithm (tests)."""
    spec = _registry.pop(name)
    for alias in (spec.name, *spec.aliases):
        _aliases.pop(alias, None)


def get(name: str) -> Algorithm:
    """The entry of algorithm `name` (or one of its aliases); KeyError naming the known ones otherwise."""
    _load()
    key = str(name).strip().lower()
    if key not in _aliases:
        _load_plugins()
    if key not in _aliases:
        close = difflib.get_close_matches(key, list(_aliases), n=1)
        hint = f" (did you mean '{_aliases[close[0]]}'?)" if close else ""
        raise KeyError(f"unknown algorithm {name!r}{hint}")
    return _registry[_aliases[key]]


def names() -> list[str]:
    """The registered algorithms' names: the built-ins in their fixed order (whichever entry module a process happened
    to import first), then plug-ins in the order they registered."""
    _load()
    _load_plugins()
    return _ordered(_registry)


def specs() -> list[Algorithm]:
    _load()
    _load_plugins()
    return [_registry[name] for name in _ordered(_registry)]


def _ordered(registered: dict[str, Algorithm]) -> list[str]:
    builtin = [module.replace("_", "-") for module in _BUILTIN]
    return sorted(registered, key=lambda name: builtin.index(name) if name in builtin else len(builtin))


def _load() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN:
            importlib.import_module(f"silofl.protocols.algorithms.{module}")


def _load_plugins() -> None:
    modules = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    for module in modules:
        if module not in _loaded_plugins:
            _loaded_plugins.add(module)
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"{PLUGINS_ENV} names {module!r}, which cannot be imported: {exc}") from exc
    global _entry_points_loaded
    if not _entry_points_loaded:  # installed packages do not change while a process runs: scan them once
        _entry_points_loaded = True
        for point in entry_points(group=ENTRY_POINT_GROUP):
            point.load()
