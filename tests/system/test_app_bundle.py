"""What `flwr run .` packs into the app bundle (FAB), built with Flower's own builder from the project's files: the
four packages' sources and nothing else, even with a deployment folder, runs and data written inside the project
(before, `silofl deploy up --dir fed/` put the SuperNodes' installed app copies under fed/, every bundle carried them,
and the third `flwr run .` failed on Flower's directory depth limit)."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "client", "strategies", "protocols")


def test_the_bundle_holds_the_packages_sources_only(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", ".gitignore", "README.md"):
        shutil.copy(ROOT / name, project / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    # what a user's project folder holds after a deployment and a few runs
    nested = project / "fed" / "silo_0" / "apps" / "silofl.silofl.1.0.0.abc" / "server"
    nested.mkdir(parents=True)
    (nested / "app.py").write_text("print('an installed copy')\n")
    (project / "fed" / "superlink.toml").write_text("[x]\n")
    (project / "runs" / "r1").mkdir(parents=True)
    (project / "runs" / "r1" / "result.json").write_text("{}")
    (project / "notes.md").write_text("# mine\n")

    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(project))).namelist()
    files = [n for n in names if n not in ("pyproject.toml", ".info/CONTENT") and not n.startswith(".info/")]
    sources = [p.relative_to(project).as_posix() for package in PACKAGES for p in (project / package).rglob("*.py")]
    assert sorted(files) == sorted(sources) and len(sources) > 100
    assert not any(n.startswith(("fed/", "runs/")) or n == "notes.md" for n in names)


def test_gitignore_covers_what_silofl_writes_in_a_project() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    for folder in ("runs/", "fed/", "silos/", "parties/"):
        assert folder in ignored
