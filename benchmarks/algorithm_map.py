"""Where each algorithm's code is: from its registry entry to the server's and the silo's modules (issue 33).

    python benchmarks/algorithm_map.py [--verbose]

`silofl run ALG` reaches an algorithm's code in three hops whatever the algorithm: the CLI asks the registry
(`silofl.protocols.algorithms.get`), the entry names its server builder and its silo handlers as
``"module:function"`` references, and those modules are imported when first used. This script reads the entry's
references (every ``"silofl...:name"`` string field of the entry: strategy, silo handlers, initial model, privacy
report) and follows the static imports of those modules (module-level and inside functions, read with `ast`, no
import executed) through silofl's own packages. Per algorithm it prints:

* its entry points, and the modules they reach grouped as the algorithm's own (named after it), another
  algorithm's (named after that one: a dependency between algorithms, to be read as such) and the shared core;
* backward imports: a server module (`silofl.strategies`, `silofl.server`) reached from a silo handler, or a silo
  module (`silofl.client`) reached from the server's builder (ruff's TID251 bans them; this counts what the
  registry's references reach, so a ban a module escapes by a dynamic import shows here).

A module is "named after" an algorithm when a component of its dotted name is the algorithm's name with `-` as `_`
(``steffle``, ``dp_fedsgd``), or starts with it and an underscore (``steffle_parties``); the longest such name wins
(``fedavg_sc`` is fedavg-sc's). Baselines that share their paper's code (noisy-sgd in mu2fl's modules, fedavg-sc in
fedsc's) count that paper's modules as their own.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The installed package's sub-packages and the folders they come from (pyproject.toml's package-dir).
PACKAGES = {"silofl.server": "server", "silofl.client": "client", "silofl.strategies": "strategies"}
PACKAGES["silofl.protocols"] = "protocols"
#: Which side of the federation a top-level package is.
SERVER_SIDE = ("silofl.server", "silofl.strategies")
SILO_SIDE = ("silofl.client",)
#: Algorithms that live in another paper's modules: name -> the name their modules carry.
SHARES_MODULES_OF = {"noisy-sgd": "mu2fl", "fedavg-sc": "fedsc"}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every silofl module's dotted name -> its file."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package, *parts))] = path
    return out


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The silofl modules `name` imports anywhere in its file (a `from package import module` counts the module)."""
    known = set(known)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `silofl.protocols.steffle.GroupPrior` -> the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the silofl modules it imports."""
    files = module_files(root)
    return {name: imports_of(name, path, files) for name, path in files.items()}


def reach(graph: Mapping[str, set[str]], starts: Iterable[str]) -> set[str]:
    """The modules `starts` import, directly or not (themselves included)."""
    seen, todo = set(), deque(starts)
    while todo:
        module = todo.popleft()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        todo.extend(graph[module])
    return seen


def tokens(algorithm: str) -> tuple[str, ...]:
    """The module-name components an algorithm's code carries: its name with `-` as `_`, and the name of the paper
    whose modules it shares (SHARES_MODULES_OF)."""
    own = algorithm.replace("-", "_")
    shared = SHARES_MODULES_OF.get(algorithm)
    return (own, shared) if shared else (own,)


def owner(module: str, names: Sequence[str]) -> str | None:
    """The algorithm a module is named after: of the algorithms with a token equal to a component of the module's
    dotted name, or a component's prefix before an underscore (``steffle_parties``), the one with the longest token
    (``fedavg_sc`` is fedavg-sc's, not fedavg's); a module shared by a paper's algorithms (``mu2fl``) is the paper's
    own algorithm's. None: the shared core."""
    best: tuple[int, str] | None = None
    for name in names:
        token = name.replace("-", "_")
        for part in module.split(".")[1:]:
            if (part == token or part.startswith(token + "_")) and (best is None or len(token) > best[0]):
                best = (len(token), name)
    return best[1] if best else None


def references(entry: object) -> dict[str, list[str]]:
    """The entry's ``"silofl...:name"`` references: {"server": [...], "silo": [...], "other": [...]}."""
    out: dict[str, list[str]] = {"server": [], "silo": [], "other": []}
    for field in dataclasses.fields(entry):  # type: ignore[arg-type]
        value = getattr(entry, field.name)
        values = value.values() if isinstance(value, Mapping) else [value]
        for ref in values:
            if isinstance(ref, str) and ref.startswith("silofl.") and ":" in ref:
                side = {"strategy": "server", "silo": "silo"}.get(field.name, "other")
                out[side].append(ref.partition(":")[0])
    return out


@dataclasses.dataclass
class AlgorithmMap:
    """One algorithm's modules as the registry's references reach them."""

    name: str
    entry_points: dict[str, list[str]]
    own: list[str]
    others: dict[str, list[str]]
    core: list[str]
    backward: list[tuple[str, str]]


def algorithm_map(name: str, entry: object, graph: Mapping[str, set[str]], names: Sequence[str]) -> AlgorithmMap:
    """The modules `name`'s references reach, grouped, and its backward imports."""
    refs = references(entry)
    server, silo = reach(graph, refs["server"]), reach(graph, refs["silo"])
    reached = server | silo | reach(graph, refs["other"]) | {f"silofl.protocols.algorithms.{name.replace('-', '_')}"}
    reached &= set(graph)
    mine = {name, *(n for n in names if n.replace("-", "_") in tokens(name))}
    own = sorted(m for m in reached if owner(m, names) in mine)
    others: dict[str, list[str]] = {}
    for m in sorted(reached):
        if (who := owner(m, names)) is not None and who not in mine:
            others.setdefault(who, []).append(m)
    taken = set(own) | {m for ms in others.values() for m in ms}
    backward = [("silo handler", m) for m in sorted(silo) if m.startswith(SERVER_SIDE)]
    backward += [("server builder", m) for m in sorted(server) if m.startswith(SILO_SIDE)]
    return AlgorithmMap(name, refs, own, others, sorted(reached - taken), backward)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="list the shared core's modules too")
    args = parser.parse_args(argv)
    from silofl.protocols import algorithms

    graph = import_graph()
    names = list(algorithms.names())
    print(f"{len(graph)} silofl modules; hops from `silofl run ALG`: CLI -> registry -> entry -> its modules (3)")
    print("| algorithm | own modules | other algorithms' modules | shared core | backward imports |")
    print("|---|---|---|---|---|")
    maps = [algorithm_map(name, algorithms.get(name), graph, names) for name in names]
    for m in maps:
        others = "; ".join(f"{k}: {', '.join(v)}" for k, v in m.others.items()) or "-"
        backward = ", ".join(f"{m2} (from the {side})" for side, m2 in m.backward) or "0"
        print(
            f"| {m.name} | {len(m.own)}: {', '.join(x.removeprefix('silofl.') for x in m.own)} | {others} | "
            f"{len(m.core)} | {backward} |"
        )
    if args.verbose:
        for m in maps:
            print(f"\n{m.name}: shared core ({len(m.core)}): {', '.join(x.removeprefix('silofl.') for x in m.core)}")
    return 1 if any(m.backward for m in maps) else 0


if __name__ == "__main__":
    sys.exit(main())
