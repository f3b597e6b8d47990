"""The import rules, checked by ruff's banned-api rule (TID251): every module imports silofl's own code by its installed
name (`silofl.server`, ...; pyproject.toml bans the bare folder names), and from each layer's own `ruff.toml`:
strategies (the server side) never import the silo side (`silofl.client`) nor the ServerApp's `silofl.server`, the silo
never imports the server or its strategies, and protocols/ (what both use) imports neither side.

Only TID251 is run here: the rest of `ruff check` is a habit of the project, not a CI gate (a new ruff release may
add a rule to a selected family)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def test_no_module_imports_across_a_ban() -> None:
    done = _ruff(".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("path", "source", "banned"),
    [
        ("strategies/example.py", "def f():\n    from silofl.client.app import app\n    return app\n", "silofl.client"),
        ("client/data/example.py", "import silofl.server.cli\n\nprint(silofl.server.cli)\n", "silofl.server"),
        ("client/example.py", "from silofl.strategies import base\n\nprint(base)\n", "silofl.strategies"),
        ("strategies/example.py", "def f():\n    from silofl.server import cli\n    return cli\n", "silofl.server"),
        ("protocols/privacy/example.py", "from silofl.client import app\n\nprint(app)\n", "silofl.client"),
        ("protocols/example.py", "from silofl.strategies import base\n\nprint(base)\n", "silofl.strategies"),
        ("protocols/example.py", "from silofl.server import cli\n\nprint(cli)\n", "silofl.server"),
        # the bare folder names, everywhere (they import in a checkout only, and load a second copy of a module)
        ("server/example.py", "from protocols import messages\n\nprint(messages)\n", "protocols"),
        ("tests/client/test_example.py", "def f():\n    import client.app\n    return client\n", "client"),
        ("benchmarks/example.py", "from server.cli import main\n\nprint(main)\n", "server"),
        ("client/rounds/example.py", "from client.app import app\n\nprint(app)\n", "client"),
    ],
)
def test_a_banned_import_is_refused_even_inside_a_function(path: str, source: str, banned: str) -> None:
    """Each ban is live (a lazy import included): the check above could not pass by checking nothing."""
    done = _ruff("--stdin-filename", path, "-", stdin=source)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"`{banned}` is banned" in done.stdout, done.stdout


def test_the_server_may_host_silos_in_simulation() -> None:
    """server/ may import the silo side: it runs the silos in-process and in Ray simulation (server/engines.py,
    server/inprocess_grid.py) and the `silofl data` and `silofl silo` commands."""
    source = "from silofl.client.app import app\n\nprint(app)\n"
    done = _ruff("--stdin-filename", "server/example.py", "-", stdin=source)
    assert done.returncode == 0, done.stdout + done.stderr
