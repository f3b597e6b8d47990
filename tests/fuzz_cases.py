"""Case counting shared by the fuzz tests (`tests/protocols/test_fuzz_config.py`,
`tests/protocols/test_fuzz_messages.py`, `tests/system/test_fuzz_neighbours.py`, `tests/system/test_fuzz_replies.py`).

Each fuzz module counts the cases hypothesis generated in a `Counter` and prints one summary line at the end of the
session ("the test reports how many cases it ran"), whatever pytest's capture mode: a plugin object registered once
writes it in the terminal summary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings


def fuzz(max_examples: int) -> settings:
    """Hypothesis settings of one fuzz test: its number of cases, no deadline (timings vary on a shared machine), and
    none of the health checks that only say a generator is slow, large or filtered (or uses a module's fixture)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    )


def report(request: pytest.FixtureRequest, name: str, line: Callable[[], str]) -> None:
    """Register (once per session, under `name`) a plugin that prints `line()` in the terminal summary."""

    class _Summary:
        def pytest_terminal_summary(self, terminalreporter: Any) -> None:
            terminalreporter.write_line(line())

    if not request.config.pluginmanager.has_plugin(name):
        request.config.pluginmanager.register(_Summary(), name)


def summary_fixture(name: str, line: Callable[[], str]) -> Any:
    """A fuzz module's autouse, module-scoped fixture that prints `line()` at the end of the session (:func:`report`
    under `name`): assign it to a module-level name, e.g. ``_report_cases = summary_fixture(...)``."""

    @pytest.fixture(scope="module", autouse=True)
    def _report_cases(request: pytest.FixtureRequest) -> None:
        report(request, name, line)

    return _report_cases


def run_counted(cases: Counter[str], test: Callable[[], None], planned: int) -> None:
    """Run the hypothesis function `test` and check it generated at least half its planned cases."""
    before = cases.total()
    test()
    ran = cases.total() - before
    assert ran >= planned // 2, f"{test.__name__} ran {ran} cases, planned {planned}"
