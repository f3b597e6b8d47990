"""The README opens with exactly two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    head = text.split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", head, flags=re.S)


def test_readme_opens_with_two_one_line_commands() -> None:
    commands = _commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "silofl run" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in ci
