"""pyproject's explicit package list matches the folders: a removed folder left listed breaks every fresh
install ("package directory ... does not exist"); a new one left out is missing from the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _folders() -> set[str]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((package, *rel.parts)))
    return found


def test_every_listed_package_has_its_folder_and_every_folder_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = _folders()
    assert listed - found == set(), "listed in pyproject.toml but no folder with an __init__.py"
    assert found - listed == set(), "a package folder missing from pyproject.toml's packages"
