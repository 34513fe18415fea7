"""pyproject.toml lists every package folder of the repository, so a non-editable install (a
wheel) holds the same modules as the source tree the tests run from."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> tuple[set[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools["package-dir"]


def test_every_package_folder_is_listed() -> None:
    packages, folders = _listed()
    found = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    assert found - packages == set(), "add these to [tool.setuptools] packages"
    assert packages - found == set(), "these listed packages have no folder with __init__.py"
