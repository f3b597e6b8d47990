"""benchmarks/algorithm_map.py: where each algorithm's code is. Every algorithm's registry references reach only its
own modules and the shared core (no module named after another algorithm), and no backward import; the map's
naming rule and import reading are checked on known cases so that the first check cannot pass by reading nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import algorithm_map
from silofl.protocols import algorithms


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return algorithm_map.import_graph()


@pytest.mark.parametrize("name", list(algorithms.names()))
def test_an_algorithm_reaches_its_own_modules_and_the_shared_core_only(name: str, graph) -> None:
    found = algorithm_map.algorithm_map(name, algorithms.get(name), graph, list(algorithms.names()))
    assert found.own, "the registry's references reach none of the algorithm's own modules"
    assert not found.others, f"{name} reaches other algorithms' modules: {found.others}"
    assert not found.backward, f"{name}: backward imports {found.backward}"
    assert any(m.startswith("silofl.strategies.") for m in found.own)
    assert any(m.startswith("silofl.client.rounds.") for m in found.own)


def test_a_module_belongs_to_the_algorithm_with_the_longest_matching_name() -> None:
    names = list(algorithms.names())
    assert algorithm_map.owner("silofl.protocols.algorithms.fedavg_sc", names) == "fedavg-sc"
    assert algorithm_map.owner("silofl.strategies.fedavg", names) == "fedavg"
    assert algorithm_map.owner("silofl.client.rounds.steffle_parties", names) == "steffle"
    assert algorithm_map.owner("silofl.protocols.steffle.theta", names) == "steffle"
    assert algorithm_map.owner("silofl.client.batches", names) is None
    assert algorithm_map.tokens("noisy-sgd") == ("noisy_sgd", "mu2fl")


def test_imports_inside_functions_and_relative_ones_are_read(tmp_path: Path) -> None:
    """A lazy import and a relative one count: a backward import hidden in a function would otherwise be missed."""
    source = "def f():\n    from silofl.client.data import loaders\n    return loaders\n\nfrom . import sibling\n"
    path = tmp_path / "example.py"
    path.write_text(source)
    known = {"silofl.client.data", "silofl.client.data.loaders", "silofl.strategies.sibling", "silofl.strategies"}
    found = algorithm_map.imports_of("silofl.strategies.example", path, known)
    assert found == {
        "silofl.client.data",
        "silofl.client.data.loaders",
        "silofl.strategies.sibling",
        "silofl.strategies",
    }
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert algorithm_map.reach(graph, ["a"]) == {"a", "b", "c"}
