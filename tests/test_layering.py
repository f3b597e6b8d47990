"""The layers' import rules, checked by ruff's banned-api rule (TID251) from each layer's own `ruff.toml`:
strategies (the server side) never import client (the silo side), the silo never imports the server or its
strategies, and protocols/ (what both use) imports neither side.

Only TID251 is run here: the rest of `ruff check` is a habit of the project, not a CI gate (a new ruff release may
add a rule to a selected family)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("client", "strategies", "protocols")


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "TID251", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_no_layer_imports_across_its_ban() -> None:
    done = _ruff(*LAYERS)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("path", "source", "banned"),
    [
        ("strategies/example.py", "def f():\n    from client.app import app\n    return app\n", "client"),
        ("client/data/example.py", "import server.cli\n\nprint(server.cli)\n", "server"),
        ("client/example.py", "from strategies.base import SiloflStrategy\n\nprint(SiloflStrategy)\n", "strategies"),
        ("protocols/privacy/example.py", "from client import app\n\nprint(app)\n", "client"),
        ("protocols/example.py", "from strategies import base\n\nprint(base)\n", "strategies"),
    ],
)
def test_a_backward_import_is_refused_even_inside_a_function(path: str, source: str, banned: str) -> None:
    """Each ban is live (a lazy import included): the check above could not pass by checking nothing."""
    done = _ruff("--stdin-filename", path, "-", stdin=source)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"`{banned}` is banned" in done.stdout, done.stdout


def test_the_server_may_host_silos_in_simulation() -> None:
    """server/ has no ban: it runs the silos in-process and in Ray simulation (server/engines.py, inprocess_grid.py)."""
    done = _ruff("--stdin-filename", "server/example.py", "-", stdin="from client.app import app\n\nprint(app)\n")
    assert done.returncode == 0, done.stdout + done.stderr
