"""docs/architecture.md's module map is checked against the tree: every Python module of
the three packages is listed (a folder entry covers the modules directly in it), and every
listed path exists. A module added, moved or removed without the map fails here."""

import re
from pathlib import Path

from tests.conftest import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGES = ("exporter", "dashboard", "alerts")


def _map_entries() -> set[str]:
    text = DOC.read_text()
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    entries: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            entries.update(re.findall(r"`([^`]+)`", first_cell))
    return entries


def _modules() -> set[Path]:
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "__pycache__" not in path.parts and path.name != "__init__.py":
                found.add(path.relative_to(REPO))
    return found


def test_every_listed_path_exists() -> None:
    missing = sorted(e for e in _map_entries() if not (REPO / e.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md lists paths that do not exist: {missing}"


def test_every_module_is_listed() -> None:
    entries = _map_entries()
    files = {Path(e) for e in entries if not e.endswith("/")}
    folders = {Path(e.rstrip("/")) for e in entries if e.endswith("/")}
    unlisted = sorted(str(m) for m in _modules() if m not in files and m.parent not in folders)
    assert not unlisted, f"modules missing from docs/architecture.md's module map: {unlisted}"
