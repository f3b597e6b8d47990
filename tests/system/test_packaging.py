"""What `pip install` puts into site-packages: one import name, `silofl` (the four folders mapped by setuptools'
package-dir onto silofl.server, silofl.client, silofl.strategies and silofl.protocols), with every sub-package."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("server", "client", "strategies", "protocols")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_sub_package_is_installed_under_silofl() -> None:
    """A folder with an __init__.py that pyproject.toml does not list would be missing from a wheel (an editable
    install finds it anyway, so only a user of the wheel would see the ImportError)."""
    found = {
        "silofl." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    listed = set(_setuptools()["packages"])
    missing, gone = sorted(found - listed), sorted(listed - found)
    assert not missing and not gone, f"add to [tool.setuptools] packages: {missing}; remove: {gone}"


def test_the_four_folders_are_the_only_import_names() -> None:
    mapping = _setuptools()["package-dir"]
    assert mapping == {f"silofl.{folder}": folder for folder in FOLDERS}
    assert all(name.startswith("silofl.") for name in _setuptools()["packages"])


def test_the_installed_package_is_the_checkouts_code() -> None:
    """The running tests import silofl from this checkout (an editable install), not from another copy."""
    import silofl.server.cli

    assert Path(silofl.server.cli.__file__).resolve() == ROOT / "server" / "cli.py"
