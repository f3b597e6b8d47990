"""Shared fixtures: the location of the real datasets (read-only), skipping tests when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """$SILOFL_DATA_DIR, else <project root>/../shared/data; skips the test if the directory does not exist."""
    path = Path(os.environ.get("SILOFL_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))
    if not path.is_dir():
        if os.environ.get("CI"):  # CI runs with ../shared beside the clone: a missing folder is a failure, not a skip
            pytest.fail(f"real datasets not found at {path} in CI; set SILOFL_DATA_DIR")
        pytest.skip(f"real datasets not found at {path}; set SILOFL_DATA_DIR")
    return path


@pytest.fixture
def task_identity() -> None:
    """Set the run identity that a ServerApp process has (set by every Flower engine) and that Messages read:
    task 1, run 1, node 1. Modules that build Messages outside an engine use it for every test with
    `pytestmark = pytest.mark.usefixtures("task_identity")`."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
