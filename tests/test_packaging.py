"""pyproject.toml ships everything: every Python package under the mapped folders is listed
(a wheel leaves out what is not), and the data folders are declared with their files."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """The folder that holds ``package``, by the longest package-dir mapping (pure)."""
    mapping = SETUPTOOLS["package-dir"]
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in mapping:
            return ROOT / mapping[head] / Path(*parts[cut:])
    raise AssertionError(f"{package} is under no package-dir mapping")


def test_every_package_folder_is_listed() -> None:
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for top, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([top, *rel.parts]))
    assert found <= listed, f"not in pyproject packages: {sorted(found - listed)}"


def test_data_folders_are_packages_with_their_files() -> None:
    """Each package-data entry names a listed package whose folder has matching files."""
    for package, patterns in SETUPTOOLS["package-data"].items():
        assert package in SETUPTOOLS["packages"], package
        for pattern in patterns:
            assert list(_folder(package).glob(pattern)), (package, pattern)
