"""docs/architecture.md's module map is checked against the tree: every Python module of
the three packages is listed (a folder entry covers the modules directly in it), and every
listed path exists. A module added, moved or removed without the map fails here.

The dashboard's layers import one way: the stores (``dashboard/data/``) import nothing of
the dashboard above them (verdicts, the plan, views, the page), read from the modules' own
import statements, at run time or for types."""

import ast
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


#: What the stores may import of the dashboard: themselves and the model they share with
#: everything above (series: the types a store answers with).
_STORE_MAY_IMPORT = ("gpuscope.dashboard.data", "gpuscope.dashboard.series")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_stores_import_nothing_above_them() -> None:
    """``dashboard/data/`` is the lowest layer: stores → verdicts → plan → views → page. A
    store that imports a verdict (or anything above) fails here, wherever the import is
    (module level, a function, ``if TYPE_CHECKING``)."""
    above = []
    for path in sorted((REPO / "dashboard" / "data").rglob("*.py")):
        for name in _imports(path):
            if (name.startswith("gpuscope.dashboard.")
                    and not name.startswith(_STORE_MAY_IMPORT)):
                above.append(f"{path.relative_to(REPO)}: {name}")
    assert not above, f"the stores import layers above them: {sorted(set(above))}"


def test_the_layering_check_sees_a_function_level_import(tmp_path: Path) -> None:
    """The check reads imports inside functions too (the way a cycle is usually dodged)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gpuscope.dashboard.verdicts.allocated import x\n")
    assert "gpuscope.dashboard.verdicts.allocated" in _imports(module)
